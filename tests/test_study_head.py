"""A study run by its head job (scripts/study.sbatch) on the local SLURM cluster in
emulated-Taurus mode (two nodes: the head job on one, the exclusive training jobs on the
other):
hvdscale status mid-study (runs done, queued, one failed; an ETA), the head job
cancelled mid-study and submitted again: the study completes and the runs finished
before are not trained again. Real sbatch/squeue/scancel, real training runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from required_layers import require_layer
from slurm_support import (
    horovod_skip_reason,
    slurm_cluster_two_nodes,  # noqa: F401  (pytest fixture)
)

from hvdscale.cli import main
from hvdscale.config.load import run_config_hash, validate_config
from hvdscale.matrix.runtable import run_config
from hvdscale.study.plan import merged_config, plan
from hvdscale.study.status import squeue_jobs, status

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.horovod, pytest.mark.slurm, pytest.mark.multinode]
RESULTS = "results-test-study-head"
CONFIG = ".test/slurm-thesis.yaml"
# 1-worker runs of the emulated partition alpha: one exclusive node each, so while the
# head job holds one node they run one at a time on the other and the rest queue. Six
# runs: after the victim's last attempt has failed (it is prioritised) some are still left,
# so the moment the test waits for (a run done, the victim failed, a run queued) lasts
# for a whole run; with four it could pass between two status polls
OVERRIDE = {
    "results_dir": RESULTS,
    "training": {"repeats": 3, "max_epochs": 3},
    "scaling": {
        "sweeps": [
            {
                "name": "head",
                "partitions": ["alpha"],
                "workers": [1],
                "backends": ["gloo", "mpi"],
                "batch_sizes": [75],
                "lr_rules": ["none"],
            }
        ]
    },
}
VICTIM = "alpha_mpi_n1_w1_b75_lrnone_r1"  # fails: its checkpoint cannot be read


def plant_broken_checkpoint(cfg: dict, results: Path) -> None:
    """A checkpoint of the victim's own configuration whose weights are garbage: the run
    resumes from it and fails reading it (twice: the profile retries once)."""
    slice_ = validate_config(run_config(cfg, VICTIM))
    d = results / "runs" / VICTIM / "checkpoint" / "epoch-0000"
    d.mkdir(parents=True)
    state = {"run_id": VICTIM, "config_hash": run_config_hash(slice_), "workers": 1, "epoch": 0}
    (d / "state.json").write_text(json.dumps(state))
    (d / "weights.index").write_text("not a checkpoint")
    (d.parent / "LATEST").write_text("epoch-0000\n")


def head_jobs(env: dict) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-n", "hvdscale-head", "-o", "%i"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    return out.split()


def submit_head(env: dict, configs: list[str]) -> str:
    extra = ["--jobs", "2", "--prioritize", f"{RESULTS}/runs/{VICTIM}/metrics.json"]
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--time=60",
            "--mem=1500",
            f"--chdir={ROOT}",
            "scripts/study.sbatch",
            *configs,
            "--",
            *extra,
        ],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            **env,
            "HVDSCALE_PROFILE": "profiles/test-slurm",
            "SNAKEMAKE": f"{sys.executable} -m snakemake",
        },
        check=True,
    )
    return proc.stdout.strip().split(";")[0]


def head_log(job_id: str) -> str:
    path = ROOT / f"hvdscale-head-{job_id}.log"
    return path.read_text() if path.exists() else ""


@pytest.fixture
def study(slurm_cluster_two_nodes, tmp_path, monkeypatch):
    require_layer("horovod", horovod_skip_reason())
    env = slurm_cluster_two_nodes
    for key in ("SLURM_CONF", "PATH"):
        if key in env:
            monkeypatch.setenv(key, env[key])
    shutil.rmtree(ROOT / RESULTS, ignore_errors=True)
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump(OVERRIDE))
    # config/config.yaml first: the Snakefile's configfile, beneath the files the head
    # job's Snakemake is given; hvdscale status and plan merge only the files named, so
    # they name it too to see the study the jobs run (its data noise, max_train_s)
    configs = ["config/config.yaml", CONFIG, str(override)]
    jobs: list[str] = []
    yield env, configs, jobs
    for job_id in jobs:
        subprocess.run(["scancel", job_id], env=env, capture_output=True)
        (ROOT / f"hvdscale-head-{job_id}.log").unlink(missing_ok=True)
    shutil.rmtree(ROOT / RESULTS, ignore_errors=True)


def test_head_job_status_mid_study_and_restart_after_cancel(study, capsys):
    env, configs, jobs = study
    cfg = merged_config([ROOT / c for c in configs])
    results = ROOT / RESULTS
    plant_broken_checkpoint(cfg, results)
    assert plan(cfg, results)["retrain"] == {}  # nothing trained yet

    first = submit_head(env, configs)
    jobs.append(first)
    snapshots = []
    done_before: dict[str, float] = {}
    deadline = time.time() + 900
    while time.time() < deadline:
        s = status(cfg, results, squeue_jobs(), workdir=ROOT)
        t = s["total"]
        snapshots.append(t)
        if t["done"] >= 1 and t["failed"] >= 1 and t["queued"] >= 1:
            # mid-study (a run done, the victim failed, a run waiting for its node while
            # another trains): cancel the head job
            done_before = {
                p.parent.name: p.stat().st_mtime for p in results.glob("runs/*/metrics.json")
            }
            subprocess.run(["scancel", first], env=env, check=True)
            break
        if first not in head_jobs(env):  # it ended before that moment came: fail now
            break
        time.sleep(2)
    assert done_before, (json.dumps(snapshots), head_log(first)[-4000:])
    mid = [t for t in snapshots if t["done"] >= 1 and t["queued"] + t["running"] >= 1]
    assert any(t["queued"] >= 1 and t["failed"] >= 1 for t in mid), json.dumps(snapshots)
    # the status command mid-study: counts, the failed run's reason, an ETA
    assert main(["status", *configs]) == 0
    out = capsys.readouterr().out
    assert "ETA: " in out and "ETA: done" not in out
    assert f"{VICTIM}: " in out
    while first in head_jobs(env):
        time.sleep(1)

    second = submit_head(env, configs)
    jobs.append(second)
    deadline = time.time() + 900
    while second in head_jobs(env) and time.time() < deadline:
        time.sleep(2)
    log = head_log(second)
    assert second not in head_jobs(env), log[-4000:]
    assert "Snakemake exited with status" in log, log[-4000:]
    # every run but the victim finished; the runs done before the cancel were kept
    s = status(cfg, results, squeue_jobs(), workdir=ROOT)
    assert s["total"]["done"] == 5 and s["total"]["failed"] == 1, (s, log[-4000:])
    for run_id, mtime in done_before.items():
        assert (results / "runs" / run_id / "metrics.json").stat().st_mtime == mtime, run_id
    assert not (ROOT / ".snakemake" / "hvdscale-head.jobid").exists()
    # the stored config slices are the ones the current config gives: nothing retrains
    p = plan(cfg, results)
    assert p["total"]["jobs_done"] == 5 and p["retrain"] == {}
    assert main(["status", *configs]) == 0
    out = capsys.readouterr().out
    assert "ETA: nothing left to run but the failed runs" in out
