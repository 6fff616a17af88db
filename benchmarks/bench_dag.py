#!/usr/bin/env python3
"""Time to plan the full thesis DAG: `snakemake -n` on config/thesis.yaml (every
partition x workers x backend x batch x LR rule x repeat), through the SLURM profile
when it exists. Target: under 5 s. Prints the median of --repeats runs."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3, help="dry runs to time (default 3)")
    ap.add_argument("--configfile", default="config/thesis.yaml", help="config to plan")
    args = ap.parse_args()
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
    med = statistics.median(times)
    print(f"{jobs}")
    print(
        f"snakemake -n ({' '.join(cmd[3:])}): median {med:.2f} s over {args.repeats} runs "
        f"(target < 5 s: {'met' if med < 5 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
