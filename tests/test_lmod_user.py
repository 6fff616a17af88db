"""A cluster user without root, with Python and MPI from Lmod modules (issue 29).

As a non-root account (tests/lmod_support.py: made here, Debian's Lmod, Lua modulefiles
for the system OpenMPI and Python and a TensorFlow/Horovod module over the train env):
a fresh clone of HEAD, `make setup`, then a 2-rank training run through
`snakemake --profile profiles/slurm --sdm env-modules` on the local SLURM cluster, with
the config's environment.deployment env-modules; and a config naming a module that does
not exist stops its job before any rank, naming the module. Everything runs as that
user in a login shell with a clean environment, the jobs under the user's uid. No mocks:
real useradd, Lmod, make setup, Snakemake, sbatch, srun and Horovod.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from lmod_support import (
    MODULES,
    clone_head,
    ensure_user,
    give_wheel_cache,
    lmod_skip_reason,
    run_as_user,
    write_modulefiles,
)
from required_layers import require_layer
from slurm_support import own_cluster, slurm_skip_reason

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.horovod]

RUN = "local_mpi_n1_w2_b75_lrnone_r0"
#: the run of the wrong-module case: another run of the same sweep, so its job reuses
#: the data of the first and is the only job
BAD_RUN = "local_mpi_n1_w1_b75_lrnone_r0"
BAD_MODULE = "nosuch/1.0"
# the test cluster's timing (profiles/test-slurm has the same); the rest is profiles/slurm
CLUSTER_FLAGS = (
    "--slurm-init-seconds-before-status-checks 2 --slurm-status-command squeue"
    " --seconds-between-status-checks 2 --latency-wait 5"
)


def study_config(modules: list[str]) -> dict:
    """One sweep of 1- and 2-worker MPI runs on the local partition, srun inside the job,
    an absolute target (no calibration run), the train env from ``modules``."""
    sweep = {"name": "lmod", "partitions": ["local"], "workers": [1, 2], "backends": ["mpi"],
             "batch_sizes": [75], "lr_rules": ["none"]}  # fmt: skip
    return {
        "training": {"launcher": "srun", "target": {"mode": "absolute", "value": 0.5}},
        "scaling": {"sweeps": [sweep], "tune": None},
        "environment": {"deployment": "env-modules", "modules": list(modules)},
    }


@pytest.fixture(scope="module")
def lmod_cluster():
    """A SLURM instance of the test's own (partition ``local``) under /tmp: the user must
    reach its slurm.conf and munge socket, which a checkout under a private home (CI's
    clone may lie anywhere) would hide from other users."""
    require_layer("slurm", slurm_skip_reason(1))
    with own_cluster("lmodcl", "local", "lmodnode", 6941, "/tmp/hvd-lmod-cluster") as env:
        yield env


@pytest.fixture(scope="module")
def lmod_user():
    """The test user with a clone of HEAD set up by `make setup` (as the user) and the
    modulefiles; yields (user, clone, modulefile dir, setup output). The account, its
    wheel cache and the clone's venvs stay for the next run: the next run's clone is
    brought to its HEAD in place (nothing untracked kept but the venvs), so its `make
    setup` reinstalls an env only where its lock stamp changed (the venvs took 100-130 s
    to install). HVD_LMOD_FRESH=1: a fresh clone and full setup, removed afterwards."""
    require_layer("lmod", lmod_skip_reason())
    fresh = os.environ.get("HVD_LMOD_FRESH") == "1"
    user = ensure_user()
    give_wheel_cache(user)
    clone = Path(user.pw_dir) / "hvdscale"
    head = clone_head(user, clone, keep_envs=not fresh)
    setup = run_as_user(f"cd '{clone}' && make setup", user, timeout=1800)
    assert setup.returncode == 0, f"make setup as {user.pw_name} failed:\n{setup.stdout[-6000:]}"
    tree = write_modulefiles(user, clone)
    yield user, clone, tree, head, setup.stdout
    if fresh:
        shutil.rmtree(clone, ignore_errors=True)


def snakemake_as_user(user, clone: Path, tree: Path, cfg: dict, name: str, target: str,
                      env: dict, extra: str = "") -> subprocess.CompletedProcess:  # fmt: skip
    """What the user types on the login node: `module use`, then Snakemake with the
    SLURM profile and --sdm env-modules; ``cfg`` is written into the clone as ``name``."""
    path = clone / name
    path.write_text(yaml.safe_dump(cfg))
    shutil.chown(path, user.pw_uid, user.pw_gid)
    script = (
        f"cd '{clone}' && module use '{tree}' && .venv/bin/snakemake --profile profiles/slurm"
        f" --sdm env-modules {CLUSTER_FLAGS} {extra} --configfile .test/config/config.yaml"
        f" {name} -- results/runs/{target}/metrics.json"
    )
    return run_as_user(script, user, env=env, timeout=900)


def test_lmod_user_sets_up_and_runs_two_ranks_with_env_modules(lmod_user, lmod_cluster):
    user, clone, tree, head, setup_out = lmod_user
    # the clone is HEAD with nothing of an earlier run, and setup ran as the user from
    # the system Python (no root packages installed; the cached Horovod wheel used, or a
    # train env kept from an earlier run whose lock stamp still holds)
    rev = run_as_user(f"git -C '{clone}' rev-parse HEAD", user)
    assert rev.stdout.strip() == head
    assert not (clone / "results").exists() and not (clone / ".snakemake").exists()
    assert "installing Debian packages" not in setup_out
    assert any(
        said in setup_out
        for said in ("using cached Horovod wheel", "building Horovod", ".venv-train: up to date")
    ), setup_out[-3000:]
    assert "done: workflow env .venv, train env .venv-train" in setup_out
    assert (clone / ".venv-train").stat().st_uid == user.pw_uid
    cfg_home = (clone / ".venv-train" / "pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg_home, cfg_home
    # `module` exists in the non-interactive shell of a job: Lmod's BASH_ENV
    probe = run_as_user(
        f"module use '{tree}'; bash -c 'module purge && module load {' '.join(MODULES)};"
        " type -t module; echo LOADED=$LOADEDMODULES; command -v python'",
        user,
    )
    assert "function" in probe.stdout and f"LOADED={':'.join(MODULES)}" in probe.stdout, (
        probe.stdout
    )
    assert probe.stdout.strip().endswith("/lmod/sw/python-3.11/bin/python"), probe.stdout

    env = {"SLURM_CONF": lmod_cluster["SLURM_CONF"]}
    reach = run_as_user("squeue -h -o %i", user, env=env, timeout=60)
    assert reach.returncode == 0, (
        f"{user.pw_name} cannot reach the test cluster ({env['SLURM_CONF']} and the munge "
        f"socket beside it must be readable by other users):\n{reach.stdout}"
    )
    out = snakemake_as_user(user, clone, tree, study_config(MODULES), "lmod.yaml", RUN, env)
    assert out.returncode == 0, out.stdout[-6000:]
    record = json.loads((clone / "results" / "runs" / RUN / "metrics.json").read_text())
    assert record["status"] == "completed"
    assert record["label_proof"]["world_size"] == 2 and record["label_proof"]["ok"], record[
        "label_proof"
    ]
    environment = record["environment"]
    assert environment["modules"] == MODULES
    assert environment["tensorflow"] == "2.15.1" and environment["horovod"] == "0.28.1"
    assert record["config"]["launcher"] == "srun"
    log = (clone / "results" / "logs" / "train_run" / f"{RUN}.log").read_text()
    # the ranks ran the module's `python` with the module's site-packages behind the
    # project's src
    assert "srun --mpi=pmix -n 2" in log and " python -m hvdscale.cli train" in log, log
    site = clone / ".venv-train" / "lib" / "python3.11" / "site-packages"
    assert f"PYTHONPATH={clone}/src:{site}" in log, log
    # the job ran under the user's uid
    job = environment["slurm_job_id"]
    show = subprocess.run(
        ["scontrol", "show", "job", job], capture_output=True, text=True, env=lmod_cluster
    )
    assert f"UserId={user.pw_name}({user.pw_uid})" in show.stdout, show.stdout + show.stderr

    # a module name that does not exist: `module load` fails in the partition's preflight
    # job, `hvdscale preflight` stops it at its modules check naming the module, no rank
    # starts and no training job is submitted
    bad = snakemake_as_user(
        user, clone, tree, study_config([BAD_MODULE]), "lmod-bad.yaml", BAD_RUN, env,
        extra="--retries 0",
    )  # fmt: skip
    assert bad.returncode != 0, bad.stdout[-4000:]
    assert "Error in rule preflight_partition" in bad.stdout, bad.stdout[-4000:]
    assert "rule generate_shard" not in bad.stdout  # the data of the first run reused
    assert "rule train_run" not in bad.stdout  # no training job submitted
    bad_log = (clone / "results" / "logs" / "preflight_partition" / "local.log").read_text()
    assert "failed at check 'modules'" in bad_log, bad_log
    assert f"module(s) {BAD_MODULE} not loaded (loaded: none)" in bad_log, bad_log
    assert "no rank was started" in bad_log
    assert not (clone / "results" / "logs" / "train_run" / f"{BAD_RUN}.log").exists()
    run_dir = clone / "results" / "runs" / BAD_RUN
    assert not (run_dir / "metrics.json").exists() and not (run_dir / "failure.json").exists()
    # Lmod's own message is in the preflight job's SLURM log
    slurm_logs = list(
        (clone / ".snakemake" / "slurm_logs" / "rule_preflight_partition" / "local").glob("*")
    )
    lmod_said = "".join(p.read_text(errors="replace") for p in slurm_logs)
    assert f'unknown: "{BAD_MODULE}"' in lmod_said.replace("\n", " "), lmod_said[-3000:]
