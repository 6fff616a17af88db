"""Fair 1 vs 2 worker benchmark (workflow env; starts real processes in the train env):
hvdscale against Keras ``model.fit`` and MultiWorkerMirroredStrategy (MWMS), each at its
best tuned settings, with the machine's own ceiling (the "independent" control) in paired
repeats, behind the quiet guard. The method, the arms and the definitions of efficiency,
ceiling and ratios are in docs/performance.md ("Scaling: 1 vs 2 workers"); the quiet
guard and the validity of a row in benchmarks/README.md.

Writes benchmarks/results/bench_scaling.csv (summary) and bench_scaling_runs.csv (every
run); exit 3 when the machine stays busy, 4 when the independent ceiling is impossible.

  .venv/bin/python benchmarks/bench_scaling.py [--repeats 3] [--tune-repeats 1]
      [--samples 60000] [--epochs 6] [--batches 75,1000] [--quick] [--out-dir DIR]
      [--max-load 0.5] [--quiet-timeout 600] [--no-ceiling-check]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import (  # noqa: E402
    RESULTS,
    ROOT,
    Measured,
    NotQuiet,
    add_quiet_args,
    configure_quiet,
    load_avg,
    merge_fields,
    paired_order,
    warn_load,
    write_csv,
)
from _scaling_runner import Arm, Runner, base_config, build_data, candidates, hvd  # noqa: E402

from hvdscale.analysis.stats import median_interval  # noqa: E402

CEILING_MAX = 1.05  # two 1-worker runs at once cannot beat twice one alone by more


class CeilingError(RuntimeError):
    """The independent ceiling is impossible: the figures are not to be trusted."""


def check_ceiling(summary: list[dict], limit: float = CEILING_MAX) -> None:
    """Raise CeilingError when an independent ceiling (thr of two 1-worker runs at once /
    twice thr of the best 1-worker run alone) is above ``limit``: no 2-worker run can
    beat two independent ones, so a ceiling above 1 means the runs were not measured
    alike."""
    bad = [r for r in summary if r["metric"] == "ceiling" and float(r["median"]) > limit]
    if bad:
        what = ", ".join(f"batch {r['batch']}: {float(r['median']):.2f}" for r in bad)
        raise CeilingError(
            f"independent ceiling above {limit:g} ({what}): two 1-worker runs at once cannot "
            "be faster than twice one alone. Likely cause: the arms were not alone on the "
            "machine (other work took the cores during the baseline runs; see load_before "
            "and foreign_cpu in bench_scaling_runs.csv), or the timers of the arms disagree "
            "(the independent control and the baseline do not time the same work). The "
            "figures of this run are not to be trusted; rerun alone."
        )


# --------------------------------------------------------------------------- main


def measure(runner: Runner, arm: Arm, batch: int, phase: str, rep: int, rows: list) -> dict | None:
    t0 = time.time()
    with Measured(f"{arm.label} w{arm.workers} b{batch}") as m:
        try:
            r = runner.run(arm, batch)
        except Exception as exc:  # one failed candidate is reported, not fatal
            r = {"error": str(exc)[-1500:]}
    row = {
        "phase": phase,
        "repeat": rep,
        "batch": batch,
        "arm": arm.label,
        "family": arm.kind,
        "workers": arm.workers,
        "spe": arm.spe if arm.kind in ("keras", "mwms") else None,
        "jit": arm.jit if arm.kind in ("keras", "mwms") else None,
        "impl": arm.impl if arm.kind == "mwms" and arm.workers > 1 else None,
        "pinned": 1,  # every arm: rank r on core r
        "throughput": r.get("throughput"),
        "epoch_throughputs": " ".join(f"{t:.0f}" for t in r.get("epoch_throughputs", [])),
        "data_share": r.get("data_share"),
        "status": "failed" if "error" in r else "ok",
        "wall_s": round(time.time() - t0 - m.waited, 1),  # the arm, not the guard's wait
        **m.fields(),
    }
    r["fields"] = m.fields()
    rows.append(row)
    if "error" in r:
        print(f"  {phase} r{rep} b{batch:5d} {arm.label:28s} w{arm.workers}: FAILED", flush=True)
        print("    " + r["error"].strip().replace("\n", "\n    ")[-1500:], flush=True)
        return None
    print(
        f"  {phase} r{rep} b{batch:5d} {arm.label:28s} w{arm.workers}: "
        f"{r['throughput']:9.0f} samples/s  ({row['wall_s']:.0f} s, load "
        f"{m.before:.2f} -> {m.after:.2f}, foreign CPU {m.foreign})"
        + ("" if row["valid"] == "true" else f"  INVALID: {row['invalid_reason']}"),
        flush=True,
    )
    return r if row["valid"] == "true" else None  # an invalid run is no measurement


def summary_row(batch, metric, vals, arm, workers, note, loads) -> dict:
    """One figure: median and interval of ``vals`` with the fields of the runs behind it
    (their loads, the highest foreign CPU)."""
    med, lo, hi = median_interval(vals, name="benchmark")
    before = [p["load_before"] for p in loads]
    return {
        "batch": batch,
        "metric": metric,
        "arm": arm,
        "workers": workers,
        "median": med,
        "ci_low": lo,
        "ci_high": hi,
        "n": len(vals),
        "note": note,
        **merge_fields(list(loads)),
        "load_min": min(before) if before else None,
        "load_max": max(before) if before else None,
    }


def summarise(batches, paired, best, epochs, n_rep, left_out=None) -> list[dict]:
    """Summary rows from the valid paired runs (an invalid run never reaches ``paired``);
    every row carries the merged load/foreign-CPU fields of the runs of its batch and
    ``runs_left_out``, the number of paired runs of the batch marked invalid."""
    rows = []
    left_out = left_out or {}

    def add(batch, metric, vals, arm="", workers="", note="", loads=()):
        if vals:  # else an arm that was not paired (or failed every repeat)
            rows.append(summary_row(batch, metric, vals, arm, workers, note, loads))
            rows[-1]["runs_left_out"] = left_out.get(batch, 0)

    for batch in batches:
        P = paired.get(batch, {})
        loads = [r["fields"] for reps in P.values() for r in reps.values()]

        def thr(key, P=P):
            return {rep: r["throughput"] for rep, r in P.get(key, {}).items()}

        one = {k: thr(k) for k in P if k[1] == 1}
        for (label, w), _ in sorted(P.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            add(batch, "throughput", list(thr((label, w)).values()), label, w, loads=loads)
        if not one:
            continue
        base_key = max(one, key=lambda k: statistics.median(one[k].values()))
        base = one[base_key]
        note_base = f"baseline: {base_key[0]}"

        def ratio(num_key, den, factor=1.0):
            n = thr(num_key)
            return [n[r] / (factor * den[r]) for r in n if r in den]

        hv2 = ("hvdscale", 2)
        ind = ("independent", 2)
        add(batch, "efficiency", ratio(hv2, base, 2.0), "hvdscale", 2, note_base, loads)
        add(batch, "efficiency_vs_ceiling", ratio(hv2, thr(ind)), "hvdscale", 2, "", loads)
        add(batch, "ceiling", ratio(ind, base, 2.0), "independent", 2, note_base, loads)
        mw2 = best.get((batch, "mwms", 2))
        if mw2:
            add(batch, "efficiency", ratio((mw2, 2), base, 2.0), mw2, 2, note_base, loads)
            add(
                batch,
                "ratio_hvdscale_vs_mwms",
                ratio(hv2, thr((mw2, 2))),
                "hvdscale",
                2,
                mw2,
                loads,
            )
        for fam in ("keras", "mwms"):
            b1 = best.get((batch, fam, 1))
            if b1:
                add(
                    batch,
                    f"ratio_hvdscale_vs_{fam}",
                    ratio(("hvdscale", 1), thr((b1, 1))),
                    "hvdscale",
                    1,
                    b1,
                    loads,
                )
    for r in rows:
        r["epochs"] = epochs
        r["repeats"] = n_rep
    return rows


def save(a, batches, paired, best, rows) -> list[dict]:
    """Write both CSVs from what has been measured so far; returns the summary rows."""
    done = len({rep for P in paired.values() for reps in P.values() for rep in reps})
    left_out: dict = {}
    for r in rows:
        if r.get("phase") == "paired" and r.get("valid") == "false":
            left_out[int(r["batch"])] = left_out.get(int(r["batch"]), 0) + 1
    summary = summarise(batches, paired, best, a.epochs, done, left_out)
    for r in summary:
        r.update({"samples": a.samples, "lr_rule_2w": a.lr_rule_2w, "quick": int(a.quick)})
    out = Path(a.out_dir)
    write_csv("bench_scaling_runs", rows, out / "bench_scaling_runs.csv")
    write_csv("bench_scaling", summary, out / "bench_scaling.csv")
    return summary


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3, help="paired repeats (default 3)")
    ap.add_argument("--tune-repeats", type=int, default=1, help="runs per tuning candidate")
    ap.add_argument("--samples", type=int, default=60000, help="curves (75 %% train)")
    ap.add_argument("--epochs", type=int, default=6, help="epochs per run, the first is warm-up")
    ap.add_argument("--batches", default="75,1000", help="per-worker batch sizes")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 8,000 curves, 3 epochs, a few candidates, 1 repeat, batch 75",
    )
    ap.add_argument(
        "--lr-rule-2w",
        choices=["none", "linear"],
        default="linear",
        help="learning-rate rule of every 2-worker run (all arms alike; no effect on speed)",
    )
    ap.add_argument(
        "--tuning-from",
        help="skip the tuning phase: take its valid rows (phase tune) from this runs CSV",
    )
    ap.add_argument(
        "--paired-1w",
        default="hvdscale",
        help="1-worker arms (their best settings) in every paired repeat (add mwms)",
    )
    add_quiet_args(ap)
    ap.add_argument(
        "--no-ceiling-check",
        action="store_true",
        help=f"do not fail when the independent ceiling is above {CEILING_MAX} (smoke tests)",
    )
    ap.add_argument("--out-dir", default=str(RESULTS), help="where the two CSVs go")
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / "out" / "scaling"))
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.tune_repeats, a.samples, a.epochs = 1, 1, 8000, 3
        if a.batches == "75,1000":
            a.batches = "75"
    return a


def tuning_from_csv(path, batches, rows, tune) -> tuple[list[Arm], list[Arm]]:
    """The tuning phase of an earlier run (its valid rows only)."""
    from _quiet import row_validity

    every = {arm.label: arm for arm in sum(candidates(False) + candidates(True), [])}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["phase"] != "tune" or int(row["batch"]) not in batches:
                continue
            arm = every[row["arm"]]
            arm = Arm(**{**arm.__dict__, "workers": int(row["workers"])})
            rows.append({k: v for k, v in row.items() if k not in ("machine",)})
            if row["status"] == "ok" and row_validity(row)[0]:
                tune.setdefault((int(row["batch"]), arm), []).append(float(row["throughput"]))
    one = [arm for (_b, arm) in tune if arm.workers == 1]
    two = [arm for (_b, arm) in tune if arm.workers == 2]
    return list(dict.fromkeys(one)), list(dict.fromkeys(two))


def pick_best(batches, one, two, tune) -> dict:
    """(batch, family, workers) -> label of the fastest (valid) tuning candidate."""
    best: dict = {}
    arms_by_label = {arm.label: arm for arm in one + two}
    for batch in batches:
        for arm in one + two:
            if (batch, arm) not in tune:
                continue
            key = (batch, arm.kind, arm.workers)
            med = statistics.median(tune[(batch, arm)])
            if key not in best or med > statistics.median(tune[(batch, arms_by_label[best[key]])]):
                best[key] = arm.label
        mine = [(k[1], k[2], v) for k, v in best.items() if k[0] == batch]
        print(f"  batch {batch}: best per arm: {mine}")
    return best


def paired_plan(a, batch, rep, tune, best, arms_by_label) -> list[tuple[Arm, int]]:
    plan = []
    fams = a.paired_1w.split(",")
    # the family of the fastest 1-worker tuning candidate is always paired too
    t1 = [(statistics.median(v), arm.kind) for (b, arm), v in tune.items()]
    t1 = [x for x, (b, arm) in zip(t1, tune) if b == batch and arm.workers == 1]
    if t1 and max(t1)[1] not in fams:
        fams.append(max(t1)[1])
    for fam in fams:
        if (batch, fam, 1) in best:
            plan.append((arms_by_label[best[(batch, fam, 1)]], 1))
    plan.append((Arm("hvdscale", 2), 2))
    plan.append((Arm("independent", 2), 2))
    if (batch, "mwms", 2) in best:
        plan.append((arms_by_label[best[(batch, "mwms", 2)]], 2))
    return paired_order(plan, rep)


def run_phases(a, runner, batches, rows, paired) -> dict:
    """Tuning (or --tuning-from), then the paired repeats; fills ``rows`` and ``paired``
    as it goes (a NotQuiet stop keeps what was measured). Returns ``best``."""
    one, two = candidates(a.quick)
    tune: dict = {}
    if a.tuning_from:
        one, two = tuning_from_csv(a.tuning_from, batches, rows, tune)
    for rep in range(0 if a.tuning_from else a.tune_repeats):
        for batch in batches:
            for arm in one + two:
                r = measure(runner, arm, batch, "tune", rep, rows)
                if r:
                    tune.setdefault((batch, arm), []).append(r["throughput"])
    best = pick_best(batches, one, two, tune)
    arms_by_label = {arm.label: arm for arm in one + two}
    for rep in range(a.repeats):
        for batch in batches:
            # every arm (the first of the repeat included) waits for a quiet machine
            for arm, w in paired_plan(a, batch, rep, tune, best, arms_by_label):
                arm = Arm(**{**arm.__dict__, "workers": w}) if arm.workers != w else arm
                r = measure(runner, arm, batch, "paired", rep, rows)
                if r:
                    paired.setdefault(batch, {}).setdefault((arm.label, w), {})[rep] = r
            save(a, batches, paired, best, rows)  # after every block: a stopped run keeps it
    return best


def main(argv=None) -> int:
    a = parse_args(argv)
    configure_quiet(a)
    batches = [int(b) for b in a.batches.split(",")]
    work = Path(a.work)
    cfg = base_config(a.samples, a.epochs, batches)
    data = build_data(work / f"data{a.samples}", cfg)
    cfg_path = work / f"config{a.samples}_e{a.epochs}.json"
    hvd("write-config", "--json", json.dumps(cfg), "--out", cfg_path)
    runner = Runner(a, cfg_path, data, work, a.lr_rule_2w)
    t_start, load0 = time.time(), load_avg()
    warn_load(load0, "the start of bench_scaling")
    print(
        f"bench_scaling: {a.samples} curves, {a.epochs} epochs (1 warm-up), batches {batches}, "
        f"{a.tune_repeats} tuning + {a.repeats} paired repeat(s), load {load0:.2f}",
        flush=True,
    )
    rows: list[dict] = []
    paired: dict = {}
    best: dict = {}
    try:
        best = run_phases(a, runner, batches, rows, paired)
    except NotQuiet as exc:
        save(a, batches, paired, best, rows)
        print(f"bench_scaling stopped: {exc}", file=sys.stderr)
        return 3
    summary = save(a, batches, paired, best, rows)
    print(f"\n{'batch':>5} {'metric':28s} {'arm':28s} {'w':>2} {'median':>10} {'95 % CI':>22}")
    for r in summary:
        ci = f"({r['ci_low']:.3g}-{r['ci_high']:.3g})" if r["ci_low"] is not None else "(n<3)"
        print(
            f"{r['batch']:5d} {r['metric']:28s} {r['arm']:28s} {r['workers']!s:>2} "
            f"{r['median']:10.4g} {ci:>22} {r['note']}"
        )
    print(f"\nload {load0:.2f} -> {load_avg():.2f}; {time.time() - t_start:.0f} s")
    try:
        check_ceiling(summary)
    except CeilingError as exc:
        print(f"bench_scaling FAILED: {exc}", file=sys.stderr)
        return 0 if a.no_ceiling_check else 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
