"""Horovod's cycle time against samples/s, 1 and 2 workers: the measurement behind
``training.horovod.cycle_time_ms: auto`` (workflow env; starts real ``hvdscale launch``
runs in the train env).

Horovod's background thread sleeps one cycle (HOROVOD_CYCLE_TIME) between coordination
rounds: a gradient waits up to a cycle before it is reduced, and every cycle wakes the
thread on the rank's cores. Each arm is ``hvdscale launch`` of the same run with
``training.horovod.cycle_time_ms`` set to one value (``--cycles``, ms), on the dataset and
config of bench_scaling (benchmarks/_scaling_runner.py: the thesis network, 1 thread per
worker, every epoch run, epoch 0 warm-up). 1-worker runs are pinned to core 0 (taskset),
as bench_scaling pins them and as a 1-core SLURM allocation would; 2-worker runs bind
rank r to core r (cpu_binding auto). A run's figure is the median samples/s over its
epochs after the warm-up (the record's uninstrumented epoch throughput); beside it the
compute and sync time per step of the record's phase split (its instrumented sample):
what the thread's wake-ups cost the compute on the rank's core, and how long the
gradient waits.

Paired repeats (``--repeats``, odd repeats in reverse order); before every run the quiet
guard waits for a quiet machine and every run records its load and ``foreign_cpu``
(benchmarks/_quiet.py); an invalid run is left out of the summary. Writes
benchmarks/results/bench_cycle_time.csv: one ``run`` row per run and one ``summary`` row
per (batch, workers, cycle time): median samples/s over the repeats with a bootstrap 95 %
interval, its ratio to the value ``auto`` picks for that run (paired by repeat), and
whether it is that value.

  .venv/bin/python benchmarks/bench_cycle_time.py [--repeats 3] [--cycles 0.01,0.1,1]
      [--batches 75] [--workers 1,2] [--samples 60000] [--epochs 6]
  .venv/bin/python benchmarks/bench_cycle_time.py --summarise CSV   # re-summarise only
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections import Counter
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
from _scaling_runner import Arm, Runner, base_config, build_data, hvd  # noqa: E402

from hvdscale.analysis.stats import median_interval  # noqa: E402
from hvdscale.launch.launchspec import cycle_time_ms  # noqa: E402


def auto_value(workers: int) -> float:
    """What ``auto`` gives this benchmark's runs: 2 ranks on 2 cores are bound (one core
    each); a 1-worker run has nothing to coordinate."""
    return cycle_time_ms("auto", workers, bound=workers > 1)


def run_once(cfg: dict, data: Path, work: Path, workers: int, batch: int, cycle: float) -> dict:
    """One ``hvdscale launch`` run with this cycle time, started and read back as
    bench_scaling's hvdscale arm (Runner.run_hvdscale: 1 worker pinned to core 0)."""
    c = copy.deepcopy(cfg)
    c["training"].setdefault("horovod", {})["cycle_time_ms"] = cycle
    path = work / f"config_cycle{cycle:g}.json"
    hvd("write-config", "--json", json.dumps(c), "--out", path)
    return Runner(None, path, data, work, "none").run(Arm("hvdscale", workers), batch)


def _key(r: dict) -> tuple[int, int, float]:
    return int(r["batch"]), int(r["workers"]), float(r["cycle_ms"])


def summarise(runs: list[dict]) -> list[dict]:
    """Summary rows from the valid ok runs: per (batch, workers, cycle) the median over the
    repeats, its interval, and the paired ratio to the value auto picks."""
    ok = [r for r in runs if r["status"] == "ok" and r["valid"] == "true"]
    per: dict = {}
    parts: dict = {}
    for r in ok:
        per.setdefault(_key(r), {})[int(r["repeat"])] = float(r["throughput"])
        parts.setdefault(_key(r), []).append(r)

    def phase(key, name):
        vals = [float(r[name]) for r in parts[key] if r.get(name) not in (None, "")]
        return statistics.median(vals) if vals else None

    tried = Counter(_key(r) for r in runs)
    rows = []
    for (batch, workers, cycle), vals in sorted(per.items()):
        m, lo, hi = median_interval(list(vals.values()), name="benchmark")
        ref = per.get((batch, workers, auto_value(workers)), {})
        ratios = [ref[k] / vals[k] for k in vals if k in ref]
        rows.append(
            {
                "row": "summary",
                "batch": batch,
                "workers": workers,
                "cycle_ms": cycle,
                "auto": "yes" if cycle == auto_value(workers) else "",
                "throughput": m,
                "ci_low": lo,
                "ci_high": hi,
                "auto_vs_this": statistics.median(ratios) if ratios else None,
                "compute_us_step": phase((batch, workers, cycle), "compute_us_step"),
                "sync_us_step": phase((batch, workers, cycle), "sync_us_step"),
                "repeats": len(vals),
                "runs_left_out": tried[(batch, workers, cycle)] - len(vals),
                **merge_fields(parts[(batch, workers, cycle)]),
            }
        )
    return rows


def runs_from_csv(path: str) -> list[dict]:
    """The run rows of an earlier bench_cycle_time.csv, numbers as numbers (to summarise
    them again without measuring)."""
    import csv

    nums = ("load", "load_before", "load_after", "foreign_cpu", "irq_cpu", "quiet_wait_s")
    with open(path, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["row"] == "run"]
    for r in rows:
        for k in nums:
            r[k] = float(r[k]) if r.get(k) not in (None, "") else None
    return rows


@quiet_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cycles", default="0.01,0.1,1", help="cycle times in ms")
    ap.add_argument("--batches", default="75")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--csv", default=None, help="output CSV (default benchmarks/results/...)")
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / "out" / "cycle"))
    ap.add_argument(
        "--summarise",
        metavar="CSV",
        help="no measurement: summarise the run rows of this CSV again (and rewrite it)",
    )
    add_quiet_args(ap)
    a = ap.parse_args(argv)
    configure_quiet(a)
    if a.summarise:
        runs = runs_from_csv(a.summarise)
        write_csv("bench_cycle_time", runs + summarise(runs), a.csv or a.summarise)
        return 0
    cycles = [float(c) for c in a.cycles.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    workers = [int(w) for w in a.workers.split(",")]
    work = Path(a.work)
    cfg = base_config(a.samples, a.epochs, batches)
    data = build_data(work / f"data{a.samples}", cfg)
    plan = [(b, w, c) for b in batches for w in workers for c in cycles]
    runs: list[dict] = []
    for rep in range(a.repeats):
        for batch, w, cycle in paired_order(plan, rep):
            r, err, m, wall = measured_run(
                f"cycle {cycle:g} ms w{w} b{batch}", run_once, cfg, data, work, w, batch, cycle
            )
            runs.append(
                {
                    "row": "run",
                    "batch": batch,
                    "workers": w,
                    "cycle_ms": cycle,
                    "repeat": rep,
                    "throughput": r.get("throughput"),
                    "epoch_throughputs": " ".join(
                        f"{t:.0f}" for t in r.get("epoch_throughputs", [])
                    ),
                    "horovod_cycle_env": r.get("horovod_env", {}).get("HOROVOD_CYCLE_TIME"),
                    "compute_us_step": r.get("compute_us_step"),
                    "sync_us_step": r.get("sync_us_step"),
                    "status": "ok" if r else "failed",
                    "error": err.replace("\n", " "),
                    "wall_s": wall,
                    **m.fields(),
                }
            )
            thr = r.get("throughput")
            print(
                f"r{rep} b{batch} w{w} cycle {cycle:g} ms: "
                + (f"{thr:.0f} samples/s" if thr else f"failed {err[-200:]}")
                + f" (load {m.before:.2f}, foreign CPU {m.foreign})",
                flush=True,
            )
    summary = summarise(runs)
    path = write_csv("bench_cycle_time", runs + summary, a.csv)
    for s in summary:
        print(
            f"b{s['batch']} w{s['workers']} cycle {s['cycle_ms']:g} ms: {s['throughput']:.0f} "
            f"samples/s, auto/this {s['auto_vs_this']} {s['auto']}"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
