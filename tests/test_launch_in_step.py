"""A 1-worker run under ``--launcher srun`` (issue 29): no srun, no nested job step. The
rank is a child of ``hvdscale launch`` in the launcher's own job step (under the
Snakemake SLURM plugin: the job's one task, with its CPUs, memory and GPUs), for every
framework and controller, with the environment an srun task of the 2-worker path gets.

Unit tests build the launch specs; the environment tests run the specs' real commands
(the ``exec`` wrapper, ``env -u``) with a program that prints its environment, in an
environment like the plugin's job step (SLURM_JOB_ID, SLURM_STEP_ID, ...), and the
2-worker ranks as srun would start them. The slow tests train 1-worker runs through
``hvdscale launch --launcher srun`` with an ``srun`` on PATH that fails when called, in
that step-like environment: Open MPI aborts a singleton that sees SLURM_STEP_ID (it
takes it for a rank srun started without PMI), which the launcher prevents. The real
SLURM check (the plugin's job, no second step) is in tests/test_pipeline.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_train import (
    TRAIN_PY,
    base_config,
    cached_data,
    launch,
    load_record,
    needs_train_env,
    write_config,
)

from hvdscale.launch.launchspec import build_launch
from hvdscale.slurm import rendezvous
from hvdscale.slurm.jobspec import JobSpec

SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ)))"
PROG = [sys.executable, "-c", SHOW_ENV]
T = {"threads_per_worker": 1, "timeline": False, "horovod": {}}
HOST = socket.gethostname().split(".")[0]
#: what the plugin's job step (srun -n1) gives the process that runs `hvdscale launch`
STEP_ENV = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOBID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "1",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_NNODES": "1",
    "SLURM_NODELIST": HOST,
    "SLURM_JOB_NODELIST": HOST,
    "SLURM_CPUS_PER_TASK": "2",
}
CASES = {  # id -> (framework, backend, controller)
    "horovod-mpi": ("horovod-tf", "mpi", "mpi"),
    "horovod-gloo": ("horovod-tf", "gloo", "gloo"),
    "torch-ddp-gloo": ("torch-ddp", "gloo", "gloo"),
}
#: the variables whose value is the run's size (1 worker: 1, 2 workers: 2)
SIZE_VARS = {
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_SIZE",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    rendezvous.PLAN_WORKERS,
    rendezvous.PLAN_PER_NODE,
    "HVDSCALE_TIME_LIMIT_READY",  # <out_dir>/.pids:<workers>
}


@pytest.fixture
def in_step(monkeypatch):
    """This process as `hvdscale launch` in the plugin's job step of job 77."""
    for k in list(os.environ):
        if k.startswith(("SLURM_", "HOROVOD_")) or k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
            monkeypatch.delenv(k)
    for k, v in STEP_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", os.environ["PATH"])


def spec(case: str, workers: int, **kw):
    framework, backend, _ = CASES[case]
    job = JobSpec("local", backend, 1, workers, workers, framework=framework, **kw)
    return build_launch(launcher="srun", job=job, program_argv=PROG, training=T)


@pytest.mark.parametrize("case", CASES)
def test_one_worker_starts_no_srun_and_says_where_the_rank_runs(case, in_step):
    one, two = spec(case, 1), spec(case, 2)
    assert two.argv[0] == "srun"  # 2 workers: one srun task per rank, as before
    assert one.launcher == "srun" and one.controller == CASES[case][2]
    assert "srun" not in one.argv and not [a for a in one.argv if "overlap" in a]
    assert one.argv[-len(PROG) :] == PROG
    note = one.notes[-1]
    assert note.startswith("1 worker: rank 0 runs as a child of this launcher in SLURM job ")
    assert "job step 77.0, the launcher's own" in note and "no nested step" in note
    assert ("MPI singleton" in note) == (CASES[case][2] == "mpi")
    if CASES[case][0] == "torch-ddp":
        assert one.argv[:7] == [sys.executable, "-m", rendezvous.MODULE, "exec"] + [
            "--framework",
            "torch-ddp",
            "--rank",
        ]
    elif CASES[case][2] == "gloo":
        assert one.argv[:6] == [sys.executable, "-m", rendezvous.MODULE, "exec", "--rank", "0"]
        # Horovod's rendezvous server still runs next to the launcher (rendezvous_for)
        assert one.env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == rendezvous.PORT_PLACEHOLDER
    else:
        assert one.argv[:5] == ["env", "-u", "SLURM_STEP_ID", "-u", "SLURM_STEPID"]


def test_the_note_outside_slurm_and_on_a_gpu_partition(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    assert "outside SLURM" in spec("horovod-mpi", 1).notes[-1]
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_JOB_NODELIST", HOST)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    note = spec("horovod-mpi", 1, gpus_per_node=4).notes[-1]
    assert "in SLURM job 5, outside any srun step" in note  # e.g. a batch script
    assert "the step's GPUs: CUDA_VISIBLE_DEVICES='3'" in note


def _run(argv: list[str], env: dict) -> dict:
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def rank_env_one_worker(s) -> dict:
    """The rank's environment: the spec's command as `hvdscale launch` runs it."""
    return _run(s.argv, {**os.environ, **s.env})


def rank0_env_two_workers(s) -> dict:
    """Rank 0's environment of the 2-worker spec: what srun runs, with srun's variables
    for task 0 of a nested step 77.1 (srun exports the launcher's environment)."""
    i = s.argv.index(sys.executable)  # the ranks' command after srun's options
    task = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    task.update({"SLURM_STEP_ID": "1", "SLURM_STEPID": "1", "SLURM_STEP_NUM_TASKS": "2"})
    return _run(s.argv[i:], {**os.environ, **s.env, **task})


@pytest.mark.parametrize("case", CASES)
def test_the_rank_gets_the_environment_of_an_srun_task(case, in_step):
    one = rank_env_one_worker(spec(case, 1))
    two = rank0_env_two_workers(spec(case, 2))
    ours = {k for k in one if not k.startswith("SLURM_")}
    assert ours == {k for k in two if not k.startswith("SLURM_")}
    differ = {k for k in ours if one[k] != two[k]}
    assert differ <= SIZE_VARS, {k: (one[k], two[k]) for k in differ - SIZE_VARS}
    assert all(one[k] in ("1", f"{one[k].rpartition(':')[0]}:1") for k in differ)
    assert one["HVDSCALE_LAUNCHER"] == "srun" and one["SLURM_JOB_ID"] == "77"
    framework, backend, controller = CASES[case]
    if framework == "torch-ddp":
        assert {k: one[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")} == {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }
        assert one["MASTER_ADDR"] == HOST and one["MASTER_PORT"] == str(20000 + 77)
    elif controller == "gloo":
        assert one["HOROVOD_RANK"] == "0" and one["HOROVOD_SIZE"] == "1"
        assert one["HOROVOD_LOCAL_SIZE"] == "1" and one["HOROVOD_HOSTNAME"] == HOST
        assert one["HOROVOD_CONTROLLER"] == "gloo" and "LD_PRELOAD" in one  # as for 2 ranks
    else:
        assert one["HOROVOD_CPU_OPERATIONS"] == "mpi" and "HOROVOD_RANK" not in one
    # the rank runs in the launcher's step; only an MPI singleton must not see its id
    want = None if controller == "mpi" and framework != "torch-ddp" else "0"
    assert one.get("SLURM_STEP_ID") == want and one.get("SLURM_STEPID") == want


def test_exec_refuses_a_rank_outside_the_plan():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({rendezvous.PLAN_HOSTS: "n1", rendezvous.PLAN_PER_NODE: "1"})
    env[rendezvous.PLAN_WORKERS] = "1"
    cmd = [sys.executable, "-m", rendezvous.MODULE, "exec", "--rank", "1", "--", "true"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "--rank 1 but the plan has 1" in out.stderr


# --------------------------------------------------------------------------- real runs

TORCH_SWEEP = {
    "name": "torch",
    "frameworks": ["torch-ddp"],
    "partitions": ["local"],
    "workers": [1],
    "backends": ["gloo"],
    "batch_sizes": [8],
    "lr_rules": ["none"],
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path, Path]:
    data = cached_data(tmp_path_factory, n_samples=400, train_shards=2, test_shards=1)
    cfg = base_config(n_samples=400, train_shards=2, test_shards=1, epochs=2)
    cfg["scaling"]["sweeps"].append(dict(TORCH_SWEEP))
    d = tmp_path_factory.mktemp("in_step")
    bin_dir = d / "bin"  # an srun that fails: the launcher must not call it
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\necho 'srun was called' >&2\nexit 97\n")
    (bin_dir / "srun").chmod(0o755)
    return write_config(d / "config.json", cfg), data, bin_dir


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
@pytest.mark.parametrize(
    "run_id",
    [
        "local_mpi_n1_w1_b8_lrnone_r0",
        "local_gloo_n1_w1_b8_lrnone_r0",
        "local_torch-ddp_gloo_n1_w1_b8_lrnone_r0",
    ],
)
def test_a_one_worker_run_trains_in_the_launcher_step(tmp_path, setup, run_id):
    config, data, bin_dir = setup
    if "torch" in run_id:
        from required_layers import require_layer
        from test_torch_ddp import has_torch

        require_layer("torch", None if has_torch() else "torch missing in .venv-train")
    out = tmp_path / run_id
    env = {**STEP_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env["SLURM_NODELIST"] = env["SLURM_JOB_NODELIST"] = socket.gethostname().split(".")[0]
    r = launch(config, run_id, data, out, "--launcher", "srun", env={**env, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "srun was called" not in r.stderr
    assert "1 worker: rank 0 runs as a child of this launcher in SLURM job step 77.0" in r.stderr
    rec = load_record(out)
    assert rec["status"] == "completed" and rec["config"]["workers"] == 1
    assert rec["config"]["launcher"] == "srun"
    assert rec["environment"]["slurm_job_id"] == "77"
    assert rec["label_proof"]["ok"], rec["label_proof"]
    # the launch line: the train env's interpreter, started without srun
    line = [x for x in r.stderr.splitlines() if x.startswith(f"hvdscale launch: {run_id}: ")][0]
    assert str(TRAIN_PY) in line and " srun " not in line
