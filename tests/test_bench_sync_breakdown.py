"""bench_sync_breakdown's per-step figures and summary (quick: a synthetic record and
timeline, synthetic run rows; no training, no timing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_sync_breakdown as bsb  # noqa: E402


def _timeline(path: Path) -> None:
    """Two fused gradient tensors over two steps, and an epoch metric that is left out:
    per step, negotiation 100 us (union), allreduce 300 us with MPI 200 us inside and the
    fusion-buffer copies 20 + 30 us."""
    ev = [
        {"name": "process_name", "ph": "M", "pid": p, "args": {"name": n}}
        for p, n in ((1, "grads_0"), (2, "grads_1"), (3, "epoch_metrics"))
    ]
    for t0 in (0, 10_000):
        for pid in (1, 2):
            ev += [
                {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": t0, "pid": pid},
                {"ph": "E", "ts": t0 + 100, "pid": pid},
                {"ph": "B", "name": "ALLREDUCE", "ts": t0 + 100, "pid": pid},
                {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": t0 + 110, "pid": pid},
                {"ph": "E", "ts": t0 + 130, "pid": pid},
                {"ph": "B", "name": "MPI_ALLREDUCE", "ts": t0 + 140, "pid": pid},
                {"ph": "E", "ts": t0 + 340, "pid": pid},
                {"ph": "B", "name": "MEMCPY_OUT_FUSION_BUFFER", "ts": t0 + 350, "pid": pid},
                {"ph": "E", "ts": t0 + 380, "pid": pid},
                {"ph": "E", "ts": t0 + 400, "pid": pid},
            ]
        ev += [
            {"ph": "B", "name": "ALLREDUCE", "ts": t0 + 5000, "pid": 3},
            {"ph": "E", "ts": t0 + 9000, "pid": 3},
        ]
    path.write_text(json.dumps(ev))


def test_breakdown_per_step_from_the_record_and_the_timeline(tmp_path):
    tl = tmp_path / "timeline.json"
    _timeline(tl)
    record = {
        "epochs": [{"steps": 1}, {"steps": 1}],
        "timeline_check": {"measured_sync_s_rank0": 2 * 700e-6},
    }
    b = bsb.breakdown(record, tl)
    assert b["steps"] == 2 and b["sync_us"] == pytest.approx(700)
    assert b["timeline_span_us"] == pytest.approx(400) and b["negotiate_us"] == pytest.approx(100)
    assert b["allreduce_us"] == pytest.approx(300)
    assert b["mpi_allreduce_us"] == pytest.approx(200)
    assert b["memcpy_in_fusion_buffer_us"] == pytest.approx(20)
    assert b["memcpy_out_fusion_buffer_us"] == pytest.approx(30)
    assert b["allreduce_other_us"] == pytest.approx(50)
    assert b["outside_timeline_us"] == pytest.approx(300)
    with pytest.raises(ValueError, match="timeline_check"):
        bsb.breakdown({"epochs": [{"steps": 1}], "timeline_check": None}, tl)


def _run(cycle, rep, timeline, thr, valid="true", sync=None):
    row = {
        "row": "run",
        "cycle_ms": cycle,
        "timeline": timeline,
        "repeat": rep,
        "throughput": thr,
        "status": "ok",
        "valid": valid,
        "load_before": 0.3,
        "load_after": 0.9,
        "load": 0.5,
        "foreign_cpu": 0.5 if valid == "false" else 0.01,
        "irq_cpu": 0.0,
        "invalid_reason": "",
        "quiet_wait_s": 0.0,
    }
    if timeline:
        row.update({k: sync if k == "sync_us" else 10.0 for k in bsb.STEP_COLS})
    return row


def test_summary_medians_and_the_timelines_own_cost():
    runs = [_run(0.1, k, 0, 100.0) for k in range(3)]
    runs += [_run(0.1, k, 1, t, sync=700 + 10 * k) for k, t in enumerate([80, 90, 100])]
    runs += [_run(0.1, 3, 1, 1.0, valid="false", sync=9999)]  # left out
    runs += [_run(0.01, 0, 0, 50.0)]  # no timeline run: no row
    (row,) = bsb.summarise(runs)
    assert row["cycle_ms"] == 0.1 and row["repeats"] == 3 and row["runs_left_out"] == 1
    assert row["sync_us"] == 710 and row["throughput"] == 90
    assert row["control_throughput"] == 100
    assert row["control_vs_timeline"] == pytest.approx(100 / 90)  # median of 1.25, 1.11, 1.0
    assert row["valid"] == "true"
