#!/usr/bin/env python3
"""Time to plan the full thesis DAG: `snakemake -n` on config/thesis.yaml (every
partition x workers x backend x batch x LR rule x repeat), through the SLURM profile
when it exists. Target: under 5 s. Prints the median of --repeats runs (with a bootstrap
95 % interval from 3 runs on) and writes benchmarks/results/bench_dag.csv."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import (  # noqa: E402
    Measured,
    add_quiet_args,
    configure_quiet,
    quiet_main,
    write_csv,
)

from hvdscale.analysis.stats import median_interval  # noqa: E402


@quiet_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5, help="dry runs to time (default 5)")
    ap.add_argument("--configfile", default="config/thesis.yaml", help="config to plan")
    ap.add_argument("--csv", help="default: benchmarks/results/bench_dag.csv")
    add_quiet_args(ap)
    args = ap.parse_args(argv)
    configure_quiet(args)
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-n",
        "--quiet",
        "all",
        "--configfile",
        args.configfile,
    ]
    if (ROOT / "profiles/slurm/config.yaml").exists():
        cmd[3:3] = ["--profile", "profiles/slurm"]
    times = []
    with Measured("bench_dag") as meas:
        for i in range(args.repeats):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if out.returncode != 0:
                print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
                return 1
            print(f"run {i + 1}: {times[-1]:.2f} s")
    jobs = subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", "check-config", "--quiet", args.configfile],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    med, lo, hi = median_interval(times, name="benchmark")
    print(f"{jobs}")
    print(
        f"snakemake -n ({' '.join(cmd[3:])}): median {med:.2f} s over {args.repeats} runs "
        f"(target < 5 s: {'met' if med < 5 else 'NOT met'}); load {meas.before:.2f} -> "
        f"{meas.after:.2f}"
    )
    write_csv(
        "bench_dag",
        [
            {
                "configfile": args.configfile,
                "profile": "profiles/slurm" if "--profile" in cmd else "",
                "jobs": jobs,
                "seconds_median": med,
                "seconds_ci_low": lo,
                "seconds_ci_high": hi,
                "seconds_min": min(times),
                "seconds_max": max(times),
                "repeats": args.repeats,
                "target_s": 5.0,
                "met": int(med < 5),
                **meas.fields(),
            }
        ],
        args.csv,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
