"""Horovod-TF against torch DDP, both over Gloo, 1 and 2 workers, per-worker batch 75 and
1000, paired repeats behind the quiet guard (workflow env; starts real training runs in
the train env), with bench_scaling's independent arm as the machine's ceiling. The method,
the figures (speedups, efficiency against 1 worker and against the ceiling, sync, the
torch / Horovod epoch ratio) and the ``--settings`` (``COMPILE/PRECISION[/MKL]``, each run
by both frameworks in the same repeats) are in docs/performance.md ("Horovod-TF against
torch DDP"). ``--add`` measures only the given settings and keeps the other settings' rows
already in the two CSVs (each row keeps its own commit, date and load).

Writes benchmarks/results/frameworks.csv (summary) and frameworks_runs.csv (every run);
``--quick`` (smoke test, figures meaningless) writes to benchmarks/out/frameworks/.

  .venv/bin/python benchmarks/bench_frameworks.py [--repeats 3] [--samples 40000]
      [--epochs 8] [--batches 75,1000] [--target 0.01] [--quick] [--out-dir DIR]
      [--max-load 0.5] [--quiet-timeout 600] [--no-ceiling-check]
      [--settings off/fp32,default/bf16,off/fp32/intel] [--add]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _frameworks_summary import (  # noqa: E402
    CEILING_BASE,
    FRAMEWORKS,
    INDEPENDENT,
    SYNC_KEYS,
    arm_result,
    left_out_counts,
    run_row,
    summarise,
)
from _results import (  # noqa: E402
    RESULTS,
    ROOT,
    Measured,
    NotQuiet,
    add_quiet_args,
    configure_quiet,
    load_avg,
    paired_order,
    warn_load,
    write_csv,
)
from _scaling_runner import (  # noqa: E402
    HVD,
    TRAIN_PY,
    Arm,
    Runner,
    base_config,
    build_data,
    hvd,
    start,
    wait_all,
)
from bench_scaling import CEILING_MAX, CeilingError, check_ceiling  # noqa: E402

from hvdscale.matrix.runid import step_setting_suffix  # noqa: E402
from hvdscale.matrix.runtable import find_run  # noqa: E402
from hvdscale.target import calibrate_target  # noqa: E402

BASE_SETTING = "off/fp32"  # eager torch, graph Horovod-TF, float32
CALLS_PER_EPOCH = 6  # of the 2-worker runs (spe = steps // this, 1..64)


def parse_setting(setting: str) -> tuple[str, str, str]:
    """``COMPILE/PRECISION[/MKL]`` -> (compile, precision, training.mkl_code_path)."""
    comp, prec, *rest = setting.split("/")
    mkl = rest[0] if rest else "vendor"
    if (
        comp not in ("off", "default", "max")
        or prec not in ("fp32", "bf16")
        or mkl not in ("vendor", "intel")
        or len(rest) > 1
    ):
        raise SystemExit(
            f"bench_frameworks: setting {setting!r}; expected COMPILE/PRECISION[/MKL] with "
            f"COMPILE off, default or max, PRECISION fp32 or bf16 (a CPU benchmark) and MKL "
            f"vendor (default) or intel (training.mkl_code_path: torch-ddp's MKL on its "
            f"Intel code path)"
        )
    return comp, prec, mkl


def bench_config(a, batch: int, axis: bool, setting: str = BASE_SETTING) -> dict:
    """bench_scaling's config for one batch: Gloo, both frameworks, ``repeats`` repeats,
    the target, the steps per call, the setting's compile and precision."""
    cfg = base_config(a.samples, a.epochs, [batch])
    comp, prec, mkl = parse_setting(setting)
    cfg["training"].update(compile=comp, precision=prec, mkl_code_path=mkl)
    sweep = cfg["scaling"]["sweeps"][0]
    sweep.update(backends=["gloo"], repeats=a.repeats)
    if axis:
        sweep["frameworks"] = list(FRAMEWORKS)
    train_2w = a.samples * 0.75 * 0.9 / 2  # rows per rank (75 % train, 10 % validation)
    spe = max(1, min(64, int(train_2w // batch) // CALLS_PER_EPOCH))
    cfg["training"].update(steps_per_execution=spe, instrument_every=10)
    return cfg


def run_id(
    fw: str, workers: int, batch: int, rule: str, rep: int, axis: bool, setting=BASE_SETTING
) -> str:
    """The arm's run id; it names the setting's precision and compile mode where they are
    not fp32 and off (``..._lrnone_bf16_cdefault_r0``)."""
    tag = "_torch-ddp" if axis and fw == "torch-ddp" else ""
    comp, prec, _ = parse_setting(setting)
    step = step_setting_suffix(prec, comp)
    return f"local{tag}_gloo_n1_w{workers}_b{batch}_lr{rule}{step}_r{rep}"


def launch_argv(cfg_path: Path, rid: str, data: Path, out: Path) -> list:
    """The run's ``hvdscale launch``; the target file lies beside the config."""
    argv = [*HVD, "launch", "--config", cfg_path, "--run-id", rid, "--data-dir", data]
    argv += ["--out-dir", out, "--target", cfg_path.parent / "target.json"]
    return [*argv, "--train-python", TRAIN_PY]


class Bench:
    """The arms of one benchmark: a config per batch, the data, the launchers."""

    def __init__(self, a, work: Path):
        self.a, self.work = a, work
        self.data = build_data(work / f"data{a.samples}", base_config(a.samples, a.epochs, [75]))
        self.cfg_paths, self.runners = {}, {}
        work.mkdir(parents=True, exist_ok=True)  # the study's target, as calibrate_target
        absolute = {"training": {"target": {"mode": "absolute", "value": a.target}}}
        (work / "target.json").write_text(json.dumps(calibrate_target(absolute, {})))
        for setting in a.settings:
            tag = "" if setting == BASE_SETTING else "_" + setting.replace("/", "-")
            for b in a.batches:
                cfg = bench_config(a, b, True, setting)
                path = work / f"config{a.samples}_e{a.epochs}_b{b}{tag}.json"
                hvd("write-config", "--json", json.dumps(cfg), "--out", path)
                for fw in FRAMEWORKS:  # the ids exist in the matrix
                    for w in (1, 2):
                        rule = a.lr_rule_2w if w > 1 else "none"
                        rid = run_id(fw, w, b, rule, 0, True, setting)
                        find_run(json.loads(path.read_text()), rid)
                self.cfg_paths[(setting, b)] = path
                if setting == a.settings[0]:  # the ceiling: one per batch
                    self.runners[b] = Runner(a, path, self.data, work, a.lr_rule_2w)

    def run(self, arm: str, workers: int, batch: int, rep: int, setting=BASE_SETTING) -> dict:
        if arm == INDEPENDENT:
            runner = self.runners[batch]
            return runner.run_independent(batch, runner.out(Arm(INDEPENDENT, 2), batch))
        rule = self.a.lr_rule_2w if workers > 1 else "none"
        rid = run_id(arm, workers, batch, rule, rep, True, setting)
        out = self.work / "runs" / setting.replace("/", "-") / arm / rid
        if out.exists():
            shutil.rmtree(out)
        cfg_path = self.cfg_paths[(setting, batch)]
        argv = launch_argv(cfg_path, rid, self.data, out)
        p = start(argv, "0" if workers == 1 else None, {"OMP_NUM_THREADS": "1"})
        wait_all([p], rid)
        return arm_result(json.loads((out / "metrics.json").read_text()))


def plan(rep: int, settings=(BASE_SETTING,)) -> list:
    """The paired order of one repeat: (arm, workers) with one setting, (setting, arm,
    workers) with several; the independent arm once, under the first setting."""
    if len(settings) == 1:
        arms = [(fw, w) for w in (1, 2) for fw in FRAMEWORKS] + [(INDEPENDENT, 2)]
        return paired_order(arms, rep)
    arms = [(s, fw, w) for s in settings for w in (1, 2) for fw in FRAMEWORKS]
    return paired_order(arms + [(settings[0], INDEPENDENT, 2)], rep)


def measure(bench: Bench, arm: str, w: int, batch: int, rep: int, rows: list,
            setting: str = BASE_SETTING) -> dict | None:  # fmt: skip
    t0 = time.time()
    with Measured(f"{arm} {setting} w{w} b{batch} r{rep}") as m:
        try:
            r = bench.run(arm, w, batch, rep, setting)
        except Exception as exc:  # one failed run is reported, not fatal
            r = {"error": str(exc)[-1500:]}
    wall = time.time() - t0 - m.waited  # the arm, not the guard's wait
    row = {"setting": setting, **run_row(rep, batch, arm, w, r, m.fields(), wall)}
    rows.append(row)
    if "error" in r:
        print(f"  r{rep} b{batch:5d} {arm:12s} {setting} w{w}: FAILED\n    {r['error'][-1500:]}",
              flush=True)  # fmt: skip
        return None
    ttt = r.get("ttt_s")
    print(
        f"  r{rep} b{batch:5d} {arm:12s} {setting} w{w}: {r['throughput']:9.0f} samples/s"
        + (f", epoch {r['epoch_s']:.3f} s, TTT {ttt:.2f} s" if ttt is not None else "")
        + (f", val {r['final_val_loss']:.4g}" if r.get("final_val_loss") is not None else "")
        + f"  ({row['wall_s']:.0f} s, load {m.before:.2f} -> {m.after:.2f}, foreign CPU "
        f"{m.foreign})" + ("" if row["valid"] == "true" else f"  INVALID: {row['invalid_reason']}"),
        flush=True,
    )
    return {**r, "fields": m.fields()} if row["valid"] == "true" else None


def save(a, results: dict, rows: list) -> list[dict]:
    """``results[setting][batch][(arm, workers)][repeat]``: every setting's summary, each
    with the independent arm of the first setting (the machine's ceiling)."""
    summary = []
    first = results.get(a.settings[0], {})
    for setting in a.settings:
        mine = {b: dict(r) for b, r in results.get(setting, {}).items()}
        for b, r in first.items():
            if (INDEPENDENT, 2) in r and setting != a.settings[0]:
                mine.setdefault(b, {})[(INDEPENDENT, 2)] = r[(INDEPENDENT, 2)]
                if ("horovod-tf", 1) in r:  # the step the independent arm runs
                    mine[b][(CEILING_BASE, 1)] = r[("horovod-tf", 1)]
        left = left_out_counts([x for x in rows if x.get("setting") == setting])
        summary += [{"setting": setting, **x} for x in summarise(a.batches, mine, left)]
    extra = {"samples": a.samples, "epochs": a.epochs, "repeats": a.repeats}
    extra.update(target=a.target, lr_rule_2w=a.lr_rule_2w, quick=int(a.quick))
    for r in summary:
        r.update(extra)
    out = Path(a.out_dir)
    kept = ([], [])
    if getattr(a, "add", False):  # the other settings' rows, each with its own commit
        kept = tuple(kept_rows(out / f, a.settings) for f in ("frameworks_runs.csv",
                                                               "frameworks.csv"))  # fmt: skip
    write_csv("frameworks_runs", kept[0] + rows, out / "frameworks_runs.csv")
    write_csv("frameworks", kept[1] + summary, out / "frameworks.csv")
    return summary  # this run's settings only (the kept rows are the CSVs' text)


def kept_rows(path: Path, settings) -> list[dict]:
    """The rows of ``path`` (a CSV this benchmark wrote) of settings other than
    ``settings``, as they are (``--add``: their commit, date and load stay theirs)."""
    import csv

    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [r for r in csv.DictReader(f) if (r.get("setting") or BASE_SETTING) not in settings]


QUALITY_KEYS = ("load", "load_before", "load_after", "foreign_cpu", "irq_cpu", "valid",
                "invalid_reason", "quiet_wait_s")  # fmt: skip
FLOAT_KEYS = ("epoch_s", "throughput", "ttt_s", "final_val_loss", "test_loss", *SYNC_KEYS)


def results_from_runs(rows: list[dict]) -> dict:
    """``results[setting][batch][(arm, workers)][repeat]`` rebuilt from the runs CSV's
    valid rows (as ``measure`` builds it while running), for ``--resummarise``."""

    def number(v):
        return float(v) if v not in (None, "") else None

    results: dict = {}
    for r in rows:
        if r.get("valid") != "true" or r.get("status") != "ok":
            continue
        x = {k: number(r.get(k)) for k in FLOAT_KEYS}
        x.update(run_id=r.get("run_id"), reached=r.get("reached") == "True")
        x["fields"] = {k: (r.get(k) if k in ("valid", "invalid_reason") else number(r.get(k)))
                       for k in QUALITY_KEYS}  # fmt: skip
        by = results.setdefault(r.get("setting") or BASE_SETTING, {})
        by = by.setdefault(int(r["batch"]), {}).setdefault((r["arm"], int(r["workers"])), {})
        by[int(r["repeat"])] = x
    return results


def resummarise(a) -> int:
    """The summary again from a runs CSV (no run is started): e.g. after a fix of the
    summary's arithmetic."""
    import csv

    rows = list(csv.DictReader(open(a.resummarise)))
    a.settings = list(dict.fromkeys(r.get("setting") or BASE_SETTING for r in rows))
    a.batches = sorted({int(r["batch"]) for r in rows})
    summary = save(a, results_from_runs(rows), rows)
    print(f"bench_frameworks: {len(summary)} summary rows from {len(rows)} runs", flush=True)
    return 0


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3, help="paired repeats (default 3)")
    ap.add_argument("--samples", type=int, default=40000, help="curves (75 %% train)")
    ap.add_argument("--epochs", type=int, default=8, help="epochs per run, the first warm-up")
    ap.add_argument("--batches", default="75,1000", help="per-worker batch sizes")
    ap.add_argument("--target", type=float, default=0.01,
                    help="validation-loss target of the time to target (absolute)")  # fmt: skip
    ap.add_argument("--lr-rule-2w", choices=["none", "linear"], default="linear",
                    help="learning-rate rule of every 2-worker run (both frameworks)")  # fmt: skip
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 repeat, 8,000 curves, 2 epochs, output in "
                    "benchmarks/out/frameworks (figures meaningless)")  # fmt: skip
    add_quiet_args(ap)
    ap.add_argument("--no-ceiling-check", action="store_true",
                    help=f"do not fail (exit 4) when the independent ceiling is above "
                    f"{CEILING_MAX} (--quick never fails)")  # fmt: skip
    ap.add_argument("--out-dir", default=None, help="where the two CSVs go")
    ap.add_argument("--settings", default=BASE_SETTING, type=lambda s: s.split(","),
                    help="COMPILE/PRECISION[/MKL] settings, both frameworks each ("
                         "MKL: vendor or intel, training.mkl_code_path)")  # fmt: skip
    ap.add_argument("--add", action="store_true",
                    help="keep the other settings' rows already in the CSVs (each keeps "
                         "its commit, date and load); replace only these settings'")  # fmt: skip
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / "out" / "frameworks"))
    ap.add_argument("--resummarise", default=None, metavar="RUNS_CSV",
                    help="write the summary again from a runs CSV; start nothing")  # fmt: skip
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.samples, a.epochs = 1, 8000, 2
        a.no_ceiling_check = True
    a.out_dir = a.out_dir or (str(Path(a.work) / "results") if a.quick else str(RESULTS))
    a.batches = [int(b) for b in a.batches.split(",")]
    for s in a.settings:
        parse_setting(s)
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.resummarise:
        return resummarise(a)
    configure_quiet(a)
    t_start, load0 = time.time(), load_avg()
    warn_load(load0, "the start of bench_frameworks")
    bench = Bench(a, Path(a.work))
    print(
        f"bench_frameworks: {a.samples} curves, {a.epochs} epochs (1 warm-up), batches "
        f"{a.batches}, {a.repeats} paired repeat(s), target {a.target:g}, settings "
        f"{a.settings}, load {load0:.2f}",
        flush=True,
    )
    rows: list[dict] = []
    results: dict = {}
    try:
        for rep in range(a.repeats):
            for batch in a.batches:
                for step in plan(rep, a.settings):
                    setting, arm, w = step if len(step) == 3 else (a.settings[0], *step)
                    r = measure(bench, arm, w, batch, rep, rows, setting)
                    if r:
                        by = results.setdefault(setting, {}).setdefault(batch, {})
                        by.setdefault((arm, w), {})[rep] = r
                save(a, results, rows)  # after every block: a stopped run keeps it
    except NotQuiet as exc:
        save(a, results, rows)
        print(f"bench_frameworks stopped: {exc}", file=sys.stderr)
        return 3
    summary = save(a, results, rows)
    print(f"\n{'setting':13s} {'batch':>5} {'metric':30s} {'arm':12s} {'w':>2} {'median':>10} "
          f"{'95 % CI':>22}")  # fmt: skip
    for r in summary:
        ci = f"({r['ci_low']:.3g}-{r['ci_high']:.3g})" if r["ci_low"] is not None else "(none)"
        med = "n/a" if r["median"] is None else f"{r['median']:.4g}"
        print(f"{r['setting']:13s} {r['batch']:5d} {r['metric']:30s} {r['arm']:12s} "
              f"{r['workers']!s:>2} "
              f"{med:>10} {ci:>22} {r['note']}")  # fmt: skip
    print(f"\nload {load0:.2f} -> {load_avg():.2f}; {time.time() - t_start:.0f} s")
    try:
        check_ceiling(summary)  # bench_scaling's rule: an impossible ceiling fails it
    except CeilingError as exc:
        print(f"bench_frameworks FAILED: {exc}", file=sys.stderr)
        return 0 if a.no_ceiling_check else 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
