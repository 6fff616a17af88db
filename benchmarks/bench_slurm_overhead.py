#!/usr/bin/env python3
"""Scheduler overhead on the local SLURM cluster: wall time of the same 2-worker
training run (a) launched directly with mpirun, (b) submitted with `sbatch --wait`
and started inside the job with `srun --mpi=pmix`, (c) through Snakemake and the
SLURM executor plugin (profiles/test-slurm), in one script run, interleaved.

Needs root (it starts scripts/slurm-cluster.sh if the cluster is not up and stops it
again afterwards). Prints a table; --repeats sets the number of rounds. Writes
benchmarks/results/bench_slurm_overhead.csv (median, bootstrap 95 % interval from 3 rounds
on, overhead against the direct launch, load before/after).

``--arm arrays`` (issue 20; ``--arm all`` runs both): the thesis matrix scaled to seconds
per job, N runs of one job shape (1 worker, 1 epoch; --array-runs) through Snakemake and
the plugin, one sbatch per run against one SLURM job array
(``--slurm-array-jobs=train_run``), interleaved: sbatch calls (from the plugin's log),
wall time, submission span (first to last SubmitTime) and the scheduler's wait per job
(StartTime - SubmitTime, `scontrol show job`). Writes benchmarks/results/bench_slurm_arrays.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/out/slurm-overhead"
RUN_ID = "local_mpi_n1_w2_b75_lrnone_r0"
PY = sys.executable
HVD = [PY, "-m", "hvdscale.cli"]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import (  # noqa: E402
    Measured,
    add_quiet_args,
    configure_quiet,
    merge_fields,
    quiet_main,
    training_budget,
    write_csv,
)

from hvdscale.analysis.stats import median_interval  # noqa: E402

# the arm's processes outside this process tree: the daemons that run the SLURM paths' jobs
SLURM_NAMES = ("slurmctld", "slurmd", "slurmstepd", "munged")


def sh(cmd, env=None, check=True, **kw):
    """Run ``cmd`` in the project root; a failure shows its output (then raises)."""
    proc = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, **(env or {})}, text=True, capture_output=True, **kw
    )
    if check and proc.returncode:
        print(f"{' '.join(map(str, cmd))[:300]}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        proc.check_returncode()
    return proc


def cluster_env() -> dict:
    out = sh(["bash", "scripts/slurm-cluster.sh", "env"]).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export ") :].partition("=")
            env[k] = v.strip("'\"")
    return env


JOB_S = 600.0  # the overhead as a share of a 10-minute training job


def launch_argv(cfg: str, out: Path, launcher: str) -> list[str]:
    """`hvdscale launch` of the benchmark's run with ``launcher``, writing to ``out``."""
    return [*HVD, "launch", "--config", cfg, "--run-id", RUN_ID] + [
        "--data-dir",
        f"{RESULTS}/data",
        "--out-dir",
        str(out),
        "--launcher",
        launcher,
    ]


def run_path(path: str, cfg: str, res: Path, env: dict, smk: list, target: str) -> float:
    """Wall time of one training run through ``path``."""
    if path.startswith("direct"):
        out = res / "direct"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        sh(launch_argv(cfg, out, "mpirun"))
        return time.perf_counter() - t0
    if path.startswith("sbatch"):
        out = res / "sbatch"
        shutil.rmtree(out, ignore_errors=True)
        wrap = " ".join(launch_argv(cfg, out, "srun"))
        t0 = time.perf_counter()
        sh(
            ["sbatch", "--wait", "-p", "local", "-N", "1", "-n", "2", "--cpus-per-task=1"]
            + ["--exclusive", "-o", str(res / "sbatch-%j.log"), "--wrap", wrap],
            env=env,
        )
        return time.perf_counter() - t0
    shutil.rmtree(res / "runs" / RUN_ID / "checkpoint", ignore_errors=True)
    t0 = time.perf_counter()
    sh(
        [*smk, "--profile", "profiles/test-slurm", "--forcerun", "train_run", "--", target],
        env=env,
    )
    return time.perf_counter() - t0


ARRAY_RESULTS = "benchmarks/out/slurm-arrays"
ARRAY_RUN = "local_mpi_n1_w1_b75_lrnone_r{}"


def _slurm_time(text: str, key: str) -> float:
    import re
    from datetime import datetime

    m = re.search(rf"{key}=(\S+)", text)
    return datetime.fromisoformat(m.group(1)).timestamp()


def arrays_round(smk: list[str], env: dict, n: int, arrays: bool) -> dict:
    """One Snakemake invocation of the n runs (fresh outputs); its sbatch calls and the
    scheduler's times of the training jobs."""
    import re

    for r in range(n):  # fresh outputs, the run configs stay
        shutil.rmtree(ROOT / ARRAY_RESULTS / "runs" / ARRAY_RUN.format(r) / "checkpoint", True)
        for name in ("metrics.json", "history.csv"):
            (ROOT / ARRAY_RESULTS / "runs" / ARRAY_RUN.format(r) / name).unlink(missing_ok=True)
    targets = [f"{ARRAY_RESULTS}/runs/{ARRAY_RUN.format(r)}/metrics.json" for r in range(n)]
    flags = ["--slurm-array-jobs=train_run"] if arrays else []
    t0 = time.perf_counter()
    out = sh(
        [*smk, "--profile", "profiles/test-slurm", "--jobs", str(n), *flags, "--", *targets], env
    )
    wall = time.perf_counter() - t0
    log = out.stdout + out.stderr
    n_arrays = len(re.findall(r"Submitted array job with Snakemake IDs", log))
    n_single = len(re.findall(r"Job \d+ has been submitted with SLURM jobid", log))
    submit, wait, spans = [], [], []
    for r in range(n):
        rec = json.loads(
            (ROOT / ARRAY_RESULTS / "runs" / ARRAY_RUN.format(r) / "metrics.json").read_text()
        )
        shown = sh(["scontrol", "show", "job", rec["environment"]["slurm_job_id"]], env).stdout
        submit.append(_slurm_time(shown, "SubmitTime"))
        wait.append(_slurm_time(shown, "StartTime") - submit[-1])
        spans.append((_slurm_time(shown, "StartTime"), _slurm_time(shown, "EndTime")))
    spans.sort()
    # the jobs run one after another (whole node each): how long one ran, and how long
    # the node stood idle between the end of one and the start of the next (scheduler)
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    return {
        "wall_s": wall,
        "sbatch_calls": n_arrays + n_single,
        "submit_span_s": max(submit) - min(submit),
        "wait_per_job_s": statistics.median(wait),
        "run_per_job_s": statistics.median(e - s for s, e in spans),
        "gap_per_job_s": statistics.median(gaps) if gaps else 0.0,
    }


def arrays_arm(env: dict, n: int, repeats: int, csv: str | None) -> None:
    """One job per run against one job array for n runs of one shape (see the docstring)."""
    res = ROOT / ARRAY_RESULTS
    res.mkdir(parents=True, exist_ok=True)
    override = res / "override.yaml"
    override.write_text(
        json.dumps(
            {
                "results_dir": ARRAY_RESULTS,
                "training": {
                    "launcher": "srun",
                    **training_budget(1),
                    "warmup_epochs": 0,
                    "repeats": n,
                },
                "scaling": {
                    "sweeps": [
                        {
                            "partitions": ["local"],
                            "workers": [1],
                            "backends": ["mpi"],
                            "batch_sizes": [75],
                            "lr_rules": ["none"],
                        }
                    ]
                },
            }
        )
    )
    smk = [PY, "-m", "snakemake", "--configfile", ".test/config/config.yaml", str(override)]
    # data and run configs first, so the n runs become ready at once (as after a data stage)
    configs = [f"{ARRAY_RESULTS}/runs/{ARRAY_RUN.format(r)}/config.json" for r in range(n)]
    sh([*smk, "--profile", "profiles/local", f"{ARRAY_RESULTS}/data/manifest.json", *configs])
    arms = {"one job per run": [], "job array": []}
    fields: dict = {k: [] for k in arms}
    for i in range(repeats):
        for name in arms:  # every arm: quiet guard, load, foreign CPU (daemons are its own)
            meas = Measured(f"bench_slurm_overhead arrays {name}, round {i + 1}", names=SLURM_NAMES)
            with meas:
                arms[name].append(arrays_round(smk, env, n, arrays=name == "job array"))
            fields[name].append(meas.fields())
        print(f"arrays round {i + 1}: {arms}", flush=True)
    rows = []
    for name, rounds in arms.items():
        med, lo, hi = median_interval([r["wall_s"] for r in rounds], name="benchmark")
        rows.append(
            {
                "path": name,
                "runs": n,
                "repeats": repeats,
                "sbatch_calls": max(r["sbatch_calls"] for r in rounds),
                "seconds_median": med,
                "seconds_ci_low": lo,
                "seconds_ci_high": hi,
                "submit_span_s": statistics.median(r["submit_span_s"] for r in rounds),
                "wait_per_job_s": statistics.median(r["wait_per_job_s"] for r in rounds),
                "run_per_job_s": statistics.median(r["run_per_job_s"] for r in rounds),
                "gap_per_job_s": statistics.median(r["gap_per_job_s"] for r in rounds),
                **merge_fields(fields[name]),
            }
        )
        print(f"{name:18s} {rows[-1]}")
    write_csv("bench_slurm_arrays", rows, csv)


@quiet_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="rounds of (direct, sbatch, snakemake) (default 3)"
    )
    ap.add_argument("--epochs", type=int, default=4, help="epochs of the training run (default 4)")
    ap.add_argument("--csv", help="default: benchmarks/results/bench_slurm_overhead.csv")
    ap.add_argument(
        "--arm",
        choices=["overhead", "arrays", "all"],
        default="overhead",
        help="overhead: direct vs sbatch vs plugin (default); arrays: one job per run vs "
        "one job array (issue 20); all: both",
    )
    ap.add_argument("--array-runs", type=int, default=32, help="runs of the arrays arm (32)")
    ap.add_argument("--arrays-csv", help="default: benchmarks/results/bench_slurm_arrays.csv")
    add_quiet_args(ap)
    args = ap.parse_args(argv)
    configure_quiet(args)
    if os.geteuid() != 0:
        print("bench_slurm_overhead: needs root (it runs the local SLURM cluster)", file=sys.stderr)
        return 1
    was_up = sh(["bash", "scripts/slurm-cluster.sh", "status"], check=False).returncode == 0
    if not was_up:
        print("starting the local SLURM cluster ...", flush=True)
        sh(["bash", "scripts/slurm-cluster.sh", "up"])
    env = cluster_env()
    res = ROOT / RESULTS
    try:
        if args.arm in ("arrays", "all"):
            arrays_arm(env, args.array_runs, args.repeats, args.arrays_csv)
        if args.arm == "arrays":
            return 0
        override = res / "override.yaml"
        res.mkdir(parents=True, exist_ok=True)
        override.write_text(
            json.dumps(
                {
                    "results_dir": RESULTS,
                    "training": {"launcher": "srun", **training_budget(args.epochs)},
                    "scaling": {
                        "sweeps": [
                            {
                                "partitions": ["local"],
                                "workers": [2],
                                "backends": ["mpi"],
                                "batch_sizes": [75],
                                "lr_rules": ["none"],
                            }
                        ]
                    },
                }
            )
        )
        target = f"{RESULTS}/runs/{RUN_ID}/metrics.json"
        smk = [PY, "-m", "snakemake", "--configfile", ".test/config/config.yaml", str(override)]
        print("preparing the data (local profile) ...", flush=True)
        sh(
            [
                *smk,
                "--profile",
                "profiles/local",
                f"{RESULTS}/runs/{RUN_ID}/config.json",
                f"{RESULTS}/data/manifest.json",
                f"{RESULTS}/scaling/target.json",
            ]
        )
        cfg = f"{RESULTS}/runs/{RUN_ID}/config.json"
        times = {"direct (mpirun)": [], "sbatch --wait + srun": [], "snakemake + SLURM plugin": []}
        fields: dict = {k: [] for k in times}
        for i in range(args.repeats):
            for path in times:  # every path is an arm: quiet guard, load, foreign CPU
                meas = Measured(f"bench_slurm_overhead {path}, round {i + 1}", names=SLURM_NAMES)
                with meas:
                    times[path].append(run_path(path, cfg, res, env, smk, target))
                fields[path].append(meas.fields())
            print(
                f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()),
                flush=True,
            )
        direct = statistics.median(times["direct (mpirun)"])
        print(f"\n2-worker run {RUN_ID}, {args.epochs} epochs, median of {args.repeats} rounds:")
        print(f"{'path':28s} {'median s':>9s} {'min-max s':>13s} {'overhead s':>11s}")
        rows = []
        for k, v in times.items():
            med, lo, hi = median_interval(v, name="benchmark")
            share = 100 * (med - direct) / JOB_S
            print(
                f"{k:28s} {med:9.1f} {min(v):6.1f}-{max(v):<6.1f} {med - direct:11.1f}"
                f" {share:10.2f}% of a 10-minute job"
            )
            rows.append(
                {
                    "path": k,
                    "run_id": RUN_ID,
                    "epochs": args.epochs,
                    "repeats": args.repeats,
                    "seconds_median": med,
                    "seconds_ci_low": lo,
                    "seconds_ci_high": hi,
                    "overhead_s": med - direct,
                    "share_of_10min_job_pct": share,
                    **merge_fields(fields[k]),
                }
            )
        write_csv("bench_slurm_overhead", rows, args.csv)
    finally:
        if not was_up:
            sh(["bash", "scripts/slurm-cluster.sh", "down"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
