"""Issue 12 settings without a cluster: NCCL variables for every launcher, srun --mpi
type, per-partition SLURM cluster, the time-limit signal and per-attempt runtime as the
workflow resolves them (a real Snakemake dry run), and the launcher's own warning."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hvdscale.launch.launchspec import build_launch
from hvdscale.slurm import jobspec, site, timelimit
from hvdscale.slurm.jobspec import JobSpec

ROOT = Path(__file__).resolve().parents[1]
PROG = ["/venv/bin/python", "-m", "hvdscale.cli", "train", "--run-id", "X"]
NCCL = {"socket_ifname": "ib0", "ib_hca": "mlx5_0:1", "debug": "INFO"}
T = {"threads_per_worker": 1, "timeline": False, "horovod": {}, "nccl": NCCL}


@pytest.mark.parametrize(
    "launcher,backend",
    [("horovodrun", "gloo"), ("mpirun", "mpi"), ("srun", "mpi"), ("srun", "gloo")],
)
def test_nccl_settings_reach_the_ranks_with_every_launcher(launcher, backend):
    s = build_launch(
        launcher=launcher,
        job=JobSpec("p", backend, 1, 2, 2),
        program_argv=PROG,
        training=T,
        hosts=["localhost"] if launcher == "srun" and backend == "gloo" else None,
        is_root_user=False,
        cpu_count=4,
    )
    want = {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0:1", "NCCL_DEBUG": "INFO"}
    assert {k: s.env[k] for k in want} == want
    if launcher == "mpirun":  # Open MPI passes only what -x names
        assert all(s.argv[s.argv.index(k) - 1] == "-x" for k in want)


def test_nccl_env_is_empty_by_default_and_recorded_from_the_environment():
    assert site.nccl_env({"nccl": {"socket_ifname": None}}) == {}
    assert site.nccl_env_now({"NCCL_DEBUG": "WARN", "PATH": "/bin"}) == {"NCCL_DEBUG": "WARN"}


def test_srun_mpi_type_is_configurable():
    s = build_launch(
        launcher="srun",
        job=JobSpec("p", "mpi", 1, 2, 2),
        program_argv=PROG,
        training={**T, "srun_mpi": "pmi2"},
    )
    assert s.argv[:2] == ["srun", "--mpi=pmi2"]
    assert site.srun_mpi({}) == "--mpi=pmix"


def test_time_limit_signal_and_runtime_per_attempt():
    assert jobspec.signal_option({"time_limit_margin_s": 120}, workers=2) == "--signal=USR1@120"
    assert jobspec.signal_option({"time_limit_margin_s": 0}, workers=2) is None
    # a 1-worker job's own step (Snakemake under srun -n1) would die of SLURM's signal
    assert jobspec.signal_option({"time_limit_margin_s": 120}, workers=1) is None
    part = {"runtime_min": 120, "runtime_min_retry": 240}
    assert [jobspec.runtime_for(part, a) for a in (1, 2, 3)] == [120, 240, 240]
    assert jobspec.runtime_for({"runtime_min": 30, "runtime_min_retry": None}, 2) == 30


def test_launcher_sends_sigusr1_margin_seconds_before_the_job_end(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    monkeypatch.setattr(timelimit, "job_end_time", lambda job: time.time() + 3.0)
    env = timelimit.launch_env({"time_limit_margin_s": 2}, tmp_path / "run", 1)
    assert env[timelimit.MARGIN_ENV] == "2"
    (tmp_path / "run" / ".pids").mkdir(parents=True)
    (tmp_path / "run" / ".pids" / "rank-0.pid").write_text("1\n")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, lambda *a: (print('USR1', flush=True), sys.exit(0)))\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)  # the child's handler is in place
    timelimit.watch(child, env)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0 and out.strip() == "USR1"


def test_workflow_resolves_signal_cluster_and_retry_runtime(tmp_path):
    override = tmp_path / "o.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "training": {"launcher": "srun", "time_limit_margin_s": 90},
                "scaling": {
                    "partitions": {
                        "alpha": {
                            "gpus_per_node": 8,
                            "cores_per_node": 48,
                            "mem_mb_per_node": 990000,
                            "runtime_min": 60,
                            "runtime_min_retry": 180,
                            "cluster": "alpha",
                        }
                    },
                    "sweeps": [
                        {
                            "partitions": ["alpha"],
                            "workers": [16],
                            "backends": ["mpi"],
                            "batch_sizes": [75],
                            "lr_rules": ["none"],
                        }
                    ],
                },
            }
        )
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--forceall",
            "--configfile",
            "config/config.yaml",
            str(override),
            "--",
            "results/runs/alpha_mpi_n2_w16_b75_lrnone_r0/metrics.json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # the job of the 16-worker run (the target's calibration runs are planned too)
    blocks = out.stdout.split("\nrule ")
    block = next(b for b in blocks if b.startswith("train_run:") and "alpha_mpi_n2_w16" in b)
    line = next(ln for ln in block.splitlines() if "resources:" in ln)
    assert "slurm_cluster=alpha" in line and "runtime=60" in line, line
    assert "--signal=USR1@90" in line and "--ntasks-per-node=8 --exclusive" in line, line
