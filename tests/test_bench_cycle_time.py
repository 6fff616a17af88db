"""bench_cycle_time's summary (quick: synthetic run rows, no training, no timing)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_cycle_time as bct  # noqa: E402


def run(workers, cycle, rep, thr, valid="true", status="ok", compute=None, sync=None):
    return {
        "compute_us_step": compute,
        "sync_us_step": sync,
        "row": "run",
        "batch": 75,
        "workers": workers,
        "cycle_ms": cycle,
        "repeat": rep,
        "throughput": thr,
        "status": status,
        "valid": valid,
        "load": 0.5,
        "load_before": 0.4,
        "load_after": 0.6,
        "foreign_cpu": 0.2 if valid == "false" else 0.01,
        "irq_cpu": 0.0,
        "invalid_reason": "foreign CPU" if valid == "false" else "",
        "quiet_wait_s": 1.0,
    }


def test_auto_values_are_the_launchers():
    assert bct.auto_value(1) == 1.0  # alone
    assert bct.auto_value(2) == 0.01  # two ranks, a core each


def test_summary_pairs_repeats_against_the_auto_value_and_drops_invalid_runs():
    runs = [run(2, 0.01, k, t) for k, t in enumerate([120.0, 100.0, 110.0])]
    runs += [run(2, 0.1, k, t) for k, t in enumerate([100.0, 100.0, 100.0])]
    runs += [run(2, 0.1, 3, 1.0, valid="false"), run(2, 1.0, 0, None, status="failed")]
    runs += [run(1, 1.0, k, 80.0) for k in range(3)] + [run(1, 0.1, k, 64.0) for k in range(3)]
    rows = {(r["workers"], r["cycle_ms"]): r for r in bct.summarise(runs)}
    assert set(rows) == {(2, 0.01), (2, 0.1), (1, 1.0), (1, 0.1)}  # the failed arm: no row
    slow = rows[(2, 0.1)]
    assert slow["repeats"] == 3 and slow["throughput"] == 100.0  # the invalid run left out
    assert slow["auto_vs_this"] == pytest.approx(1.1)  # median of 1.2, 1.0, 1.1
    assert rows[(2, 0.01)]["auto"] == "yes" and slow["auto"] == ""
    assert rows[(1, 0.1)]["auto_vs_this"] == pytest.approx(1.25)
    assert rows[(1, 1.0)]["auto"] == "yes" and rows[(1, 1.0)]["auto_vs_this"] == 1.0
    assert slow["ci_low"] is not None  # three repeats: an interval
    # the summary row carries the quality of the runs behind it (the invalid one left out)
    assert slow["valid"] == "true" and slow["foreign_cpu"] == 0.01 and slow["runs_left_out"] == 1


def test_summarise_again_from_the_csv(tmp_path):
    runs = [run(2, c, k, 100.0 + k) for c in (0.01, 0.1) for k in range(3)]
    path = tmp_path / "cycle.csv"
    bct.write_csv("bench_cycle_time", runs, path)
    assert bct.main(["--summarise", str(path)]) == 0
    rows = list(csv.DictReader(path.open()))
    assert [r["row"] for r in rows].count("summary") == 2
    again = bct.runs_from_csv(str(path))
    assert len(again) == 6 and again[0]["foreign_cpu"] == 0.01


def test_summary_carries_the_phase_split_per_step():
    """The compute and sync time per step of the runs' records: the median over the valid
    runs; none when no run had an instrumented step."""
    runs = [
        run(2, 0.01, k, 100.0, compute=c, sync=10.0 * k) for k, c in enumerate([900, 1000, 950])
    ]
    runs += [run(2, 0.01, 3, 1.0, valid="false", compute=5000, sync=5000)]
    runs += [run(1, 1.0, k, 80.0) for k in range(3)]
    rows = {(r["workers"], r["cycle_ms"]): r for r in bct.summarise(runs)}
    assert rows[(2, 0.01)]["compute_us_step"] == 950 and rows[(2, 0.01)]["sync_us_step"] == 10
    assert rows[(1, 1.0)]["compute_us_step"] is None


def test_paired_order_reverses_the_odd_repeats():
    from _results import paired_order

    orders = [paired_order([1, 2, 3], rep) for rep in range(3)]
    assert orders == [[1, 2, 3], [3, 2, 1], [1, 2, 3]]


def test_a_measured_run_that_fails_is_reported_not_fatal(monkeypatch):
    """measured_run: the arm's result and no error, or no result and the error's tail;
    the measurement's fields either way (the guard lets it run at once here)."""
    import _results
    from _results import measured_run

    monkeypatch.setattr(_results.GUARD, "max_load", 1e9)
    r, err, m, wall = measured_run("ok arm", lambda x: {"throughput": x}, 5.0)
    assert (r, err) == ({"throughput": 5.0}, "") and wall >= 0
    assert m.fields()["load_before"] is not None

    def boom():
        raise RuntimeError("x" * 400 + " launch failed")

    r, err, m, _ = measured_run("failing arm", boom)
    assert r == {} and err.endswith("launch failed") and len(err) == 300
    assert "valid" in m.fields()
