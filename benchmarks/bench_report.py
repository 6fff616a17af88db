"""Benchmark of the analysis stage: 1,000 synthetic run records -> aggregate ->
fit-costmodel -> plot -> report; prints the wall time of every step and the total.

The records are realistic: the thesis configuration (partitions alpha/hpdlf/gpu2,
backends nccl/mpi/gloo, batch 75..5000, LR rules none/linear/sqrt, 10 epochs, one
warm-up) with enough repeats for 1,000 runs; the rest of the run table is missing,
as in a study still running. Generating the records is timed separately.

Usage
  .venv/bin/python benchmarks/bench_report.py [--runs 1000] [--workdir DIR] [--subprocess]

--subprocess runs every step as its own `hvdscale` process (as the Snakemake rules do,
imports included); the default runs them in this process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import Measured, merge_fields, write_csv  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--runs", type=int, default=1000, help="run records to generate (default: %(default)s)"
    )
    ap.add_argument("--workdir", help="keep everything here (default: a temporary directory)")
    ap.add_argument("--subprocess", action="store_true", help="one hvdscale process per step")
    ap.add_argument("--csv", help="default: benchmarks/results/bench_report.csv")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench_report.") as tmp:
        root = Path(args.workdir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        import synthetic_runs as F

        cfg = F.bigger_thesis_config(args.runs)
        written = F.write_study(root / "runs", cfg, limit=args.runs)
        allreduce = F.study_allreduce(root / "allreduce", cfg)
        (root / "config").mkdir(exist_ok=True)
        (root / "config" / "full.json").write_text(json.dumps(cfg))
        t_gen = time.perf_counter() - t0
        n_epochs = cfg["training"].get("max_epochs", cfg["training"].get("epochs"))
        print(
            f"generate  {len(written)} run records ({n_epochs} epochs each) and "
            f"{len(allreduce)} allreduce sweeps: {t_gen:6.2f} s (not part of the total)"
        )

        s = root / "scaling"
        steps = {
            "aggregate": [
                "aggregate",
                "--runs-dir",
                str(root / "runs"),
                "--config",
                str(root / "config/full.json"),
                "--out-runs",
                str(s / "runs.csv"),
                "--out-summary",
                str(s / "summary.csv"),
                "--out-status",
                str(s / "status.csv"),
                "--quiet",
            ],
            "fit-costmodel": [
                "fit-costmodel",
                "--allreduce",
                *map(str, allreduce),
                "--summary",
                str(s / "summary.csv"),
                "--runs",
                str(s / "runs.csv"),
                "--out",
                str(s / "costmodel.json"),
            ],
            "plot": [
                "plot",
                "--runs",
                str(s / "runs.csv"),
                "--summary",
                str(s / "summary.csv"),
                "--costmodel",
                str(s / "costmodel.json"),
                "--outdir",
                str(root / "plots"),
            ],
            "report": [
                "report",
                "--config-file",
                str(ROOT / "config/thesis.yaml"),
                "--config",
                str(root / "config/full.json"),
                "--runs",
                str(s / "runs.csv"),
                "--summary",
                str(s / "summary.csv"),
                "--status",
                str(s / "status.csv"),
                "--costmodel",
                str(s / "costmodel.json"),
                "--plots-dir",
                str(root / "plots"),
                "--out",
                str(root / "report.pdf"),
            ],
        }
        times, loads = {}, {}
        for name, cmd in steps.items():
            meas = Measured(f"bench_report {name}").start()
            t = time.perf_counter()
            if args.subprocess:
                rc = subprocess.run(
                    [str(Path(sys.executable).with_name("hvdscale")), *cmd],
                    stdout=subprocess.DEVNULL,
                ).returncode
            else:
                import contextlib
                import io

                from hvdscale.cli import main as cli_main

                with contextlib.redirect_stdout(io.StringIO()):
                    rc = cli_main(cmd)
            times[name] = time.perf_counter() - t
            meas.stop()
            loads[name] = meas.fields()
            if rc != 0:
                print(f"{name}: exit status {rc}", file=sys.stderr)
                return rc
            print(f"{name:<13} {times[name]:6.2f} s")
        total = sum(times.values())
        pages = "?"
        try:
            info = subprocess.run(
                ["pdfinfo", str(root / "report.pdf")], capture_output=True, text=True
            ).stdout
            pages = next(ln.split()[-1] for ln in info.splitlines() if ln.startswith("Pages:"))
        except (OSError, StopIteration):
            pass
        print(
            f"{'total':<13} {total:6.2f} s  ({len(written)} runs, report {pages} pages, "
            f"{'one process per step' if args.subprocess else 'in-process'})"
        )
        mode = "subprocess" if args.subprocess else "in-process"
        rows = [
            {"step": k, "seconds": v, "runs": len(written), "mode": mode, **loads[k]}
            for k, v in times.items()
        ]
        # the total is valid only when every step is (merge_fields: worst foreign CPU)
        total_row = {"step": "total", "seconds": total, "runs": len(written), "mode": mode}
        rows.append({**total_row, "pages": pages, **merge_fields(list(loads.values()))})
        write_csv("bench_report", rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
