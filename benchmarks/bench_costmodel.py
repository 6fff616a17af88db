#!/usr/bin/env python3
"""The cost model across nodes on the emulated two-node partition, measured alone
(docs/performance.md, "Cost model across nodes"): allreduce size sweeps through Snakemake
and the SLURM plugin (.test/slurm-costmodel.yaml), then benchmarks/record_costmodel.py.

Needs root: starts ``scripts/slurm-cluster.sh up --nodes 2 --emulate alpha`` and puts the
cluster back the way it was. The data stage and the sweeps' configs are made first (not
measured); the sweeps run behind the quiet guard with the SLURM daemons counted as the
arm's own processes. Writes benchmarks/results/costmodel_emulated{,_errors}.csv and
benchmarks/out/costmodel/costmodel.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import Measured, add_quiet_args, configure_quiet, load_avg, quiet_main  # noqa: E402

SLURM_NAMES = ("slurmctld", "slurmd", "slurmstepd", "munged")  # their CPU is the arm's own
CONFIG = ".test/slurm-costmodel.yaml"
RESULTS = "benchmarks/out/costmodel"
SMK = [sys.executable, "-m", "snakemake", "--profile", "profiles/test-slurm"]


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
    """The local SLURM cluster's environment (``slurm-cluster.sh env``)."""
    out = sh(["bash", "scripts/slurm-cluster.sh", "env"]).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export ") :].partition("=")
            env[k] = v.strip("'\"")
    return env


def cluster_mode() -> str:
    """'1', '2', '2-alpha' or 'down', as reported by ``slurm-cluster.sh status``."""
    out = sh(["bash", "scripts/slurm-cluster.sh", "status"], check=False)
    m = re.search(r"^mode:\s+(\S+)", out.stdout, re.MULTILINE)
    return m.group(1) if out.returncode == 0 and m else "down"


def restore(mode: str) -> None:
    up = ["bash", "scripts/slurm-cluster.sh", "up", "--nodes"]
    if mode == "2-alpha":
        return
    if mode in ("1", "2"):
        sh([*up, mode])
    else:
        sh(["bash", "scripts/slurm-cluster.sh", "down"])


def sweep_targets() -> list[str]:
    from hvdscale.matrix.allreduce_sweeps import allreduce_jobs
    from hvdscale.study.plan import merged_config

    cfg = merged_config([ROOT / CONFIG], None)
    return [f"{RESULTS}/allreduce/{job['id']}.csv" for job in allreduce_jobs(cfg)]


class LoadSampler:
    """The 1-minute load average every ``every`` seconds while the sweeps run."""

    def __init__(self, every: float = 5.0):
        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(f"{time.strftime('%H:%M:%S', time.gmtime())} {load_avg()}")
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


@quiet_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_quiet_args(ap)
    args = ap.parse_args(argv)
    guard = configure_quiet(args)
    before = cluster_mode()
    if before != "2-alpha":
        sh(["bash", "scripts/slurm-cluster.sh", "up", "--nodes", "2", "--emulate", "alpha"])
    try:
        env = cluster_env()
        smk = [*SMK, "--configfile", CONFIG, "--config", f"results_dir={RESULTS}", "--"]
        targets = sweep_targets()
        shutil.rmtree(ROOT / RESULTS / "allreduce", ignore_errors=True)
        configs = [
            t.replace("/allreduce/", "/config/allreduce/").replace(".csv", ".json") for t in targets
        ]
        sh([*smk, *configs], env=env)  # the data stage and the sweeps' configs: not measured
        start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with Measured("allreduce sweeps", guard=guard, names=SLURM_NAMES) as m:
            with LoadSampler() as loads:
                sh([*smk, *targets], env=env)
        end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    finally:
        restore(before)
    load_file = ROOT / RESULTS / "loads.txt"
    load_file.write_text("\n".join(loads.samples) + "\n")
    record = [
        sys.executable,
        str(ROOT / "benchmarks" / "record_costmodel.py"),
        "--allreduce",
        *targets,
        "--loads",
        str(load_file),
        "--load-before",
        str(m.before),
        "--load-after",
        str(m.after),
        "--measured",
        f"{start}/{end}",
        "--json",
        f"{RESULTS}/costmodel.json",
    ]
    if m.foreign is not None:
        record += ["--foreign-cpu", f"{m.foreign:.4f}"]
    return subprocess.run(record, cwd=ROOT, env={**os.environ}).returncode


if __name__ == "__main__":
    sys.exit(main())
