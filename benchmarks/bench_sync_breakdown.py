"""Where a 2-worker step's sync phase goes, from Horovod's own timeline (workflow env;
starts real ``hvdscale launch`` runs in the train env).

The sync phase of a run record is the time from the end of a rank's backward pass to
its reduced gradient (issue 17, item 3). Horovod's timeline (``training.timeline``:
HOROVOD_TIMELINE for the whole run) shows the part of it that Horovod's background
thread sees: the negotiation (from the rank's request until every rank has sent its
own: the wait for the slower rank) and the allreduce (the fusion-buffer copies and the
MPI collective). What the timeline does not see is the rest of the sync phase: the
hand-over of the gradients to the background thread, the completion callback back to
TensorFlow's executor.

Each arm is ``hvdscale launch`` of bench_scaling's run (benchmarks/_scaling_runner.py) at
2 workers bound one per core, batch 75, at each cycle time (``--cycles``, ms), with and
without the timeline: the run without it is the paired control, and the ratio of the two
throughputs says how much the timeline's own writing perturbs what it shows. Per run,
per step (over every epoch of the run, as the timeline covers them): rank 0's sync phase
(the record's ``timeline_check``), the timeline's span, negotiation, allreduce and its
nested activities (unions over the 8 fused gradient tensors), and the part of the sync
phase outside the timeline. The record's sync phase comes from its instrumented steps
(the noise-scale sums they also compute are in no phase: docs/timing.md). Paired
repeats (``--repeats``, odd repeats in reverse order), the quiet guard and
``foreign_cpu`` as in every benchmark (benchmarks/_quiet.py). Writes
benchmarks/results/bench_sync_breakdown.csv: ``run`` rows and one ``summary`` row per
cycle time (medians over the valid repeats).

  .venv/bin/python benchmarks/bench_sync_breakdown.py [--repeats 3] [--cycles 0.01,0.1]
      [--samples 60000] [--epochs 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import (  # noqa: E402
    ROOT,
    add_quiet_args,
    configure_quiet,
    measured_run,
    merge_fields,
    paired_order,
    quiet_main,
    write_csv,
)
from _scaling_runner import base_config, build_data  # noqa: E402
from bench_cycle_time import run_once as cycle_run  # noqa: E402

from hvdscale.record.timing import parse_timeline  # noqa: E402

BATCH = 75
WORKERS = 2
#: nested timeline activities reported per step (Horovod's MPI path)
NESTED = ("MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER")
#: per-step columns of a run row, in microseconds
STEP_COLS = (
    "sync_us",
    "timeline_span_us",
    "negotiate_us",
    "allreduce_us",
    *(f"{n.lower()}_us" for n in NESTED),
    "allreduce_other_us",
    "outside_timeline_us",
)


def breakdown(record: dict, timeline: Path) -> dict:
    """Per-step figures (us) of one run from its record and whole-run timeline: rank 0's
    sync phase over this attempt's epochs against the timeline's activities over the
    same steps. Raises ValueError when the record has no timeline check."""
    tc = record.get("timeline_check") or {}
    if "measured_sync_s_rank0" not in tc:
        raise ValueError(f"{timeline.parent}: the record has no timeline_check ({tc})")
    steps = sum(e["steps"] for e in record["epochs"])
    if steps <= 0:
        raise ValueError(f"{timeline.parent}: no steps in the record")
    tl = parse_timeline(timeline, tensor_filter="grads")

    def us(seconds: float) -> float:
        return 1e6 * seconds / steps

    row = {
        "steps": steps,
        "sync_us": us(tc["measured_sync_s_rank0"]),
        "timeline_span_us": us(tl["span_s"]),
        "negotiate_us": us(tl["negotiate_s"]),
        "allreduce_us": us(tl["allreduce_s"]),
    }
    for n in NESTED:
        row[f"{n.lower()}_us"] = us(tl["activities_s"].get(n, 0.0))
    # the allreduce's time outside its nested activities (Horovod's bookkeeping between
    # them; INIT_FUSION_BUFFER, once per run, is a nested activity not reported apart)
    row["allreduce_other_us"] = row["allreduce_us"] - us(sum(tl["activities_s"].values()))
    row["outside_timeline_us"] = row["sync_us"] - row["timeline_span_us"]
    return row


def run_once(cfg: dict, data: Path, work: Path, cycle: float, timeline: bool) -> dict:
    """One 2-worker run of bench_cycle_time (bench_scaling's hvdscale arm) with this cycle
    time, with or without the whole-run timeline."""
    r = cycle_run(cfg, data, work, WORKERS, BATCH, cycle, timeline=timeline)
    out = {"throughput": r["throughput"], "horovod_env": r.get("horovod_env", {})}
    if timeline:
        rec = json.loads((Path(r["record_dir"]) / "metrics.json").read_text())
        out.update(breakdown(rec, Path(r["record_dir"]) / "timeline.json"))
    return out


def summarise(runs: list[dict]) -> list[dict]:
    """Per cycle time: medians over the valid ok repeats of the timeline runs' per-step
    figures, and the paired ratio of the control's throughput to the timeline run's
    (how much slower the timeline makes the run it shows)."""
    ok = [r for r in runs if r["status"] == "ok" and r["valid"] == "true"]
    rows = []
    for cycle in sorted({float(r["cycle_ms"]) for r in ok}):
        mine = [r for r in ok if float(r["cycle_ms"]) == cycle]
        tl = {int(r["repeat"]): r for r in mine if str(r["timeline"]) == "1"}
        ctl = {int(r["repeat"]): r for r in mine if str(r["timeline"]) == "0"}
        if not tl:
            continue
        row = {"row": "summary", "batch": BATCH, "workers": WORKERS, "cycle_ms": cycle}
        for k in (*STEP_COLS, "throughput"):
            row[k] = statistics.median(float(r[k]) for r in tl.values())
        ratios = [float(ctl[k]["throughput"]) / float(tl[k]["throughput"]) for k in tl if k in ctl]
        row["control_throughput"] = (
            statistics.median(float(r["throughput"]) for r in ctl.values()) if ctl else None
        )
        row["control_vs_timeline"] = statistics.median(ratios) if ratios else None
        row["repeats"] = len(tl)
        row["runs_left_out"] = sum(1 for r in runs if float(r["cycle_ms"]) == cycle) - len(mine)
        rows.append({**row, **merge_fields(mine)})
    return rows


@quiet_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cycles", default="0.01,0.1", help="cycle times in ms")
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--csv", default=None, help="output CSV (default benchmarks/results/...)")
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / "out" / "sync"))
    add_quiet_args(ap)
    a = ap.parse_args(argv)
    configure_quiet(a)
    cycles = [float(c) for c in a.cycles.split(",")]
    work = Path(a.work)
    cfg = base_config(a.samples, a.epochs, [BATCH])
    # bench_scaling's and bench_cycle_time's dataset when it is there
    data = build_data(ROOT / "benchmarks" / "out" / "cycle" / f"data{a.samples}", cfg)
    plan = [(c, tl) for c in cycles for tl in (0, 1)]
    runs: list[dict] = []
    for rep in range(a.repeats):
        for cycle, tl in paired_order(plan, rep):
            label = f"cycle {cycle:g} ms, timeline {'on' if tl else 'off'}"
            r, err, m, wall = measured_run(label, run_once, cfg, data, work, cycle, bool(tl))
            runs.append(
                {
                    "row": "run",
                    "batch": BATCH,
                    "workers": WORKERS,
                    "cycle_ms": cycle,
                    "timeline": tl,
                    "repeat": rep,
                    "throughput": r.get("throughput"),
                    **{k: r.get(k) for k in ("steps", *STEP_COLS)},
                    "horovod_cycle_env": r.get("horovod_env", {}).get("HOROVOD_CYCLE_TIME"),
                    "status": "ok" if r else "failed",
                    "error": err.replace("\n", " "),
                    "wall_s": wall,
                    **m.fields(),
                }
            )
            thr = r.get("throughput")
            what = f"{thr:.0f} samples/s" if thr else f"failed {err[-200:]}"
            if r.get("sync_us") is not None:
                what += f", sync {r['sync_us']:.0f} us/step, timeline {r['timeline_span_us']:.0f}"
            print(f"r{rep} {label}: {what} (load {m.before:.2f}, foreign CPU {m.foreign})")
    summary = summarise(runs)
    path = write_csv("bench_sync_breakdown", runs + summary, a.csv)
    for s in summary:
        print(
            f"cycle {s['cycle_ms']:g} ms: sync {s['sync_us']:.0f} us/step = timeline "
            f"{s['timeline_span_us']:.0f} (negotiate {s['negotiate_us']:.0f}, allreduce "
            f"{s['allreduce_us']:.0f}) + outside {s['outside_timeline_us']:.0f}; "
            f"control/timeline {s['control_vs_timeline']}"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
