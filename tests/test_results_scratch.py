"""Results on scratch: results_dir may be an absolute path (a workspace on the cluster's
scratch file system), is checked writable before anything runs, and is no part of a
run's configuration. A real finished study (real Snakemake, real training), copied with
its time stamps to an absolute results_dir, is up to date there: `snakemake -n` plans
no job, and its runs still match their config hashes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from required_layers import require_layer
from slurm_support import horovod_skip_reason

from hvdscale.analysis.aggregate import aggregate
from hvdscale.config.load import config_hash
from hvdscale.matrix.runtable import run_config, run_table
from hvdscale.study.export import export_study, read_archive
from hvdscale.study.plan import merged_config

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "results-test-scratch"
# one real training run (absolute target: no calibration run; one worker: no allreduce
# sweep), a minute of the whole pipeline on a 2-core machine
STUDY = {
    "training": {
        "max_epochs": 1,
        "warmup_epochs": 0,
        "target": {"mode": "absolute", "value": 10},
    },
    "scaling": {
        "sweeps": [
            {
                "name": "scratch",
                "partitions": ["local"],
                "workers": [1],
                "backends": ["mpi"],
                "batch_sizes": [75],
                "lr_rules": ["none"],
            }
        ]
    },
}
CONFIGS = [".test/config/config.yaml", f"{RESULTS}/study.yaml"]


def snakemake(*args, timeout: float = 1800) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SNAKEMAKE_PROFILE"}
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/local"]
        + ["--configfile", *CONFIGS, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,  # a hang guard for a loaded machine, not a tolerance
    )


@pytest.fixture(scope="module")
def finished_study():
    """A finished study in RESULTS (inside the project), trained for real."""
    require_layer("horovod", horovod_skip_reason())
    res = ROOT / RESULTS
    subprocess.run(["rm", "-rf", str(res)], check=True)
    res.mkdir()
    (ROOT / CONFIGS[1]).write_text(yaml.safe_dump(STUDY))
    out = snakemake("--config", f"results_dir={RESULTS}")
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert (res / "report.pdf").is_file()
    yield res
    subprocess.run(["rm", "-rf", str(res)], check=True)


@pytest.mark.slow
@pytest.mark.horovod
def test_a_moved_study_plans_no_job_and_keeps_its_config_hashes(finished_study, tmp_path):
    # in place: up to date
    out = snakemake("-n", "--config", f"results_dir={RESULTS}", timeout=300)
    assert out.returncode == 0 and "Nothing to be done" in out.stdout + out.stderr, out.stdout
    # moved to an absolute results_dir, files copied with their time stamps
    scratch = tmp_path / "ws" / "study"
    scratch.parent.mkdir()
    subprocess.run(["cp", "-a", str(finished_study), str(scratch)], check=True)
    out = snakemake("-n", "--config", f"results_dir={scratch}", timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "Nothing to be done" in text and "Job stats" not in text, text[-4000:]
    # the plan agrees: the finished run is done, nothing retrains
    plan = subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", "plan", "--json", "config/config.yaml", *CONFIGS]
        + ["--config", f"results_dir={scratch}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert plan.returncode == 0, plan.stderr
    total = json.loads(plan.stdout)["total"]
    assert (total["jobs_done"], total["jobs_retrain"]) == (1, 0), plan.stdout
    # the run records match their slices of the moved study's config, and the hash they
    # recorded is not the one that had the old results_dir in it
    cfg = merged_config(
        [ROOT / "config/config.yaml", *(ROOT / c for c in CONFIGS)],
        overrides=[f"results_dir={scratch}"],
    )
    assert cfg["results_dir"] == str(scratch)
    (run,) = [r.run_id for r in run_table(cfg)]
    agg = aggregate(scratch / "runs", cfg)
    assert list(agg.runs.run_id) == [run] and agg.runs.config_hash_match.map(bool).all()
    old = merged_config([ROOT / "config/config.yaml", *(ROOT / c for c in CONFIGS)])
    assert agg.runs.config_hash[0] != config_hash(run_config(old, run))
    # its archive names the results directory results/, never the absolute path
    manifest = export_study(
        tmp_path / "study.tar.gz", config_files=CONFIGS, results=str(scratch), root=ROOT
    )
    assert manifest["results_dir"] == "results"
    names = read_archive(tmp_path / "study.tar.gz")
    assert f"results/runs/{run}/metrics.json" in names and "results/report.pdf" in names


def test_an_unwritable_results_dir_is_refused_before_anything_runs(tmp_path):
    (tmp_path / "a-file").write_text("")
    for bad, why in (
        ("/proc/hvdscale-results", "cannot create a file in /proc"),
        (f"{tmp_path}/a-file/results", f"{tmp_path}/a-file is not a directory"),
    ):
        out = snakemake("-n", "--config", f"results_dir={bad}", timeout=300)
        text = out.stdout + out.stderr
        assert out.returncode != 0 and "Job stats" not in text
        assert f"config key results_dir: {bad}: {why}" in text, text[-3000:]
        assert "--config results_dir=PATH" in text
        plan = subprocess.run(
            [sys.executable, "-m", "hvdscale.cli", "plan", "config/config.yaml"]
            + ["--config", f"results_dir={bad}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert plan.returncode != 0 and f"config key results_dir: {bad}: {why}" in plan.stderr
    assert not Path("/proc/hvdscale-results").exists()
