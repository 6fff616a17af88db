"""The report of a GPU batch sweep, built on the CPU machine from the run records the GPU
machine carried back: ``gpu_batch_sweep.py --records DIR`` copies every run's
metrics.json and history.csv into DIR/VARIANT/RUN_ID/; this script takes one variant's
records (default ``off-fp32``, the sweep over every batch size; one report holds one
variant, whose config names its precision and compile mode, as its run ids do) through the
pipeline's own steps:

  hvdscale aggregate -> tabulate-systems (the system table: GPU model, driver, memory,
  CUDA, cuDNN, NCCL) -> plot (epoch time against batch size, utilisation, ...) -> report

into OUT/ (runs/, scaling/, plots/, report.pdf). Needs the workflow env (.venv):

  .venv/bin/python benchmarks/gpu_report.py RECORDS_DIR OUT_DIR [--variant off-fp32]
      [--config benchmarks/out/gpu_batch_sweep/config-off-fp32.json]

The config is the sweep's validated config of that variant (``--prepare-only`` writes it;
default: the one beside the records' work folder).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "benchmarks" / "out" / "gpu_batch_sweep"


def hvdscale(*args) -> None:
    argv = [sys.executable, "-m", "hvdscale.cli", *map(str, args)]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"gpu_report: hvdscale {args[0]} failed:\n{r.stderr[-3000:]}")
    print(r.stdout.strip() or f"hvdscale {args[0]}: done", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", type=Path, help="--records folder of gpu_batch_sweep.py")
    ap.add_argument("out", type=Path, help="the study folder to write")
    ap.add_argument("--variant", default="off-fp32", help="folder name: COMPILE-PRECISION")
    ap.add_argument("--config", type=Path, default=None, help="the variant's config JSON")
    a = ap.parse_args(argv)
    src = a.records / a.variant
    records = sorted(src.glob("*/metrics.json"))
    if not records:
        raise SystemExit(f"gpu_report: no run records (*/metrics.json) in {src}")
    config = a.config or WORK / f"config-{a.variant}.json"
    if not config.is_file():
        raise SystemExit(f"gpu_report: no config {config}: give --config (the sweep's JSON)")
    runs, sc = a.out / "runs", a.out / "scaling"
    shutil.rmtree(runs, ignore_errors=True)
    for rec in records:
        shutil.copytree(rec.parent, runs / rec.parent.name)
    sc.mkdir(parents=True, exist_ok=True)
    t = {k: sc / f"{k}.csv" for k in ("runs", "summary", "status", "epochs", "systems")}
    hvdscale("aggregate", "--runs-dir", runs, "--config", config, "--out-runs", t["runs"],
             "--out-summary", t["summary"], "--out-status", t["status"],
             "--out-epochs", t["epochs"])  # fmt: skip
    hvdscale("tabulate-systems", "--runs-dir", runs, "--runs", t["runs"], "--out", t["systems"])
    hvdscale("plot", "--runs", t["runs"], "--summary", t["summary"], "--epochs", t["epochs"],
             "--config", config, "--outdir", a.out / "plots")  # fmt: skip
    hvdscale("report", "--config-file", config, "--config", config, "--runs", t["runs"],
             "--summary", t["summary"], "--status", t["status"], "--epochs", t["epochs"],
             "--systems", t["systems"], "--plots-dir", a.out / "plots",
             "--out", a.out / "report.pdf")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
