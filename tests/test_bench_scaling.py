"""bench_scaling.py --quick runs end to end and writes its two CSVs with provenance
(slow: starts about ten training processes; no timing is asserted)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.horovod]


@pytest.mark.skipif(
    not (ROOT / ".venv-train" / "bin" / "python").exists(), reason="needs the train env"
)
def test_quick_mode_writes_the_summary_and_the_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_scaling.py"),
            "--quick",
            "--max-wait",
            "0",
            "--out-dir",
            tmp_path,
            "--work",
            tmp_path / "work",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(tmp_path / "bench_scaling_runs.csv", newline="") as fh:
        runs = list(csv.DictReader(fh))
    with open(tmp_path / "bench_scaling.csv", newline="") as fh:
        summary = list(csv.DictReader(fh))
    assert {r["phase"] for r in runs} == {"tune", "paired"}
    assert all(r["status"] == "ok" for r in runs), [r for r in runs if r["status"] != "ok"]
    assert {"hvdscale", "independent"} <= {r["arm"] for r in runs if r["phase"] == "paired"}
    for row in runs + summary:
        assert row["commit"] and row["machine"] and row["date"]
        float(row["load_before"]), float(row["load_after"])
    metrics = {r["metric"] for r in summary}
    assert {"efficiency", "efficiency_vs_ceiling", "ceiling", "ratio_hvdscale_vs_mwms"} <= metrics
    assert all(float(r["median"]) > 0 for r in summary)
