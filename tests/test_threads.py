"""Threads per rank (training.threads_per_worker, issue 29): an integer as it is, auto
from the task's SLURM_CPUS_PER_TASK (1 outside SLURM), in every place that uses it (the
ranks' OMP_NUM_THREADS, the local job's cores, the run record)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hvdscale.config.load import validate_config
from hvdscale.errors import ConfigError, UserError
from hvdscale.launch.launchspec import build_launch
from hvdscale.record.build import _record_config
from hvdscale.slurm.jobspec import JobSpec
from hvdscale.slurm.threads import planned_threads, threads_for_rank


@pytest.mark.parametrize(
    "setting, environ, expected",
    [
        (1, {}, 1),
        (3, {"SLURM_CPUS_PER_TASK": "8"}, 3),  # an integer setting wins over SLURM
        ("auto", {"SLURM_CPUS_PER_TASK": "4"}, 4),
        ("auto", {"SLURM_CPUS_PER_TASK": " 6 "}, 6),
        ("auto", {}, 1),  # outside SLURM: as with 1
        ("auto", {"SLURM_CPUS_PER_TASK": ""}, 1),
    ],
)
def test_threads_for_rank(setting, environ, expected):
    assert threads_for_rank(setting, environ) == expected


@pytest.mark.parametrize("bad", ["0", "-2", "four", "2(x3)"])
def test_auto_with_a_bad_slurm_value_is_an_error_naming_it(bad):
    with pytest.raises(UserError, match="SLURM_CPUS_PER_TASK") as info:
        threads_for_rank("auto", {"SLURM_CPUS_PER_TASK": bad})
    assert repr(bad) in str(info.value) and "threads_per_worker" in str(info.value)


def test_planned_threads_counts_auto_as_one():
    assert (planned_threads("auto"), planned_threads(1), planned_threads(4)) == (1, 1, 4)


def test_config_accepts_auto_and_integers_and_defaults_to_auto():
    assert validate_config({})["training"]["threads_per_worker"] == "auto"  # SLURM's, else 1
    for value in ("auto", 1, 8):
        cfg = validate_config({"training": {"threads_per_worker": value}})
        assert cfg["training"]["threads_per_worker"] == value


@pytest.mark.parametrize("bad", ["two", 0, -1, 1.5, None])
def test_config_rejects_other_values(bad):
    with pytest.raises(ConfigError, match="threads_per_worker"):
        validate_config({"training": {"threads_per_worker": bad}})


def _omp(setting, monkeypatch, slurm: str | None) -> str:
    if slurm is None:
        monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    else:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", slurm)
    training = {"threads_per_worker": setting, "timeline": False, "horovod": {}}
    s = build_launch(
        launcher="mpirun",
        job=JobSpec("p", "mpi", 1, 2, 2, 0),
        program_argv=["prog"],
        training=training,
        is_root_user=False,
        cpu_count=16,
    )
    return s.env["OMP_NUM_THREADS"]


def test_launch_omp_threads_resolved_in_the_launchers_environment(monkeypatch):
    assert _omp("auto", monkeypatch, "4") == "4"
    assert _omp("auto", monkeypatch, None) == "1"
    assert _omp(2, monkeypatch, "4") == "2"
    with pytest.raises(UserError, match="SLURM_CPUS_PER_TASK"):
        _omp("auto", monkeypatch, "x")


def _cfg(threads) -> dict:
    part = {"cores_per_node": 4, "mem_mb_per_node": 8000, "workers_per_node": 2}
    sweep = {"partitions": ["haswell"], "workers": [2], "backends": ["mpi"],
             "batch_sizes": [75], "lr_rules": ["none"]}  # fmt: skip
    return validate_config(
        {
            "scaling": {"partitions": {"haswell": part}, "sweeps": [sweep]},
            "training": {"threads_per_worker": threads},
        }
    )


def test_jobspec_local_threads_counts_auto_as_one(monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "16")  # planning does not read it
    job = JobSpec.for_workers(_cfg("auto"), "haswell", "mpi", 2)
    assert job.threads_per_worker == 1 and job.local_threads == 4  # max(2 x 1, 4 cores)
    job = JobSpec.for_workers(_cfg(3), "haswell", "mpi", 2)
    assert job.threads_per_worker == 3 and job.local_threads == 6  # max(2 x 3, 4 cores)


def test_record_states_the_resolved_integer(monkeypatch):
    cfg = _cfg("auto")
    run = SimpleNamespace(partition="haswell", backend="mpi", nodes=1, workers_per_node=2,
                          batch=75, lr_rule="none", repeat=0, framework="horovod-tf")  # fmt: skip
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "2")
    args = (run, cfg, 2, "mpi", "mpirun", 1e-3, 1e-3, 7, "")
    assert _record_config(*args)["threads_per_worker"] == 2
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert _record_config(*args)["threads_per_worker"] == 1
