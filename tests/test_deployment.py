"""environment.deployment (issue 29, env-modules): the deployment against Snakemake's
--sdm (refused at `snakemake -n`), the ranks' PYTHONPATH under env-modules/conda, and a
`module load` that failed stopping the launch by the module's name."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_train import base_config

from hvdscale.config.load import validate_config
from hvdscale.errors import UserError
from hvdscale.launch.command import check_modules_loaded, check_train_python
from hvdscale.launch.launchspec import build_launch, rank_path_env
from hvdscale.launch.runner import train_python_problem
from hvdscale.slurm.deployment import deployment_problem, missing_modules, module_load_problem
from hvdscale.slurm.jobspec import JobSpec

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["GCCcore/11.3.0", "OpenMPI/4.1.4", "TensorFlow/2.15.1"]

SDMS = [(), ("env-modules",), ("conda",), ("apptainer",), ("conda", "env-modules")]


def expected_problem(deployment: str, modules: list[str], sdm: tuple[str, ...]) -> str | None:
    """What the check refuses, written out per case: the method the deployment needs is
    missing, a method of another deployment is given, or env-modules without modules."""
    if deployment in ("env-modules", "conda") and deployment not in sdm:
        return "needs"
    if any(m in sdm and m != deployment for m in ("env-modules", "conda")):
        return "other"
    if deployment == "env-modules" and not modules:
        return "empty"
    return None


@pytest.mark.parametrize(
    "deployment,modules,sdm",
    list(itertools.product(["venv", "env-modules", "conda"], [[], MODULES], SDMS)),
)
def test_deployment_against_sdm_every_combination(deployment, modules, sdm):
    problem = deployment_problem(deployment, modules, list(sdm))
    kind = expected_problem(deployment, modules, sdm)
    if kind is None:
        assert problem is None
        return
    assert problem is not None
    # the key, its value and the flags given
    assert f"environment.deployment is {deployment!r}" in problem
    given = f"--sdm {' '.join(sorted(sdm))}" if sdm else "no --sdm"
    if kind == "needs":
        assert f"Snakemake runs with {given}" in problem
        assert f"Add `--sdm {deployment}`" in problem
    elif kind == "other":
        assert f"Snakemake runs with {given}" in problem
        assert "leave `--sdm" in problem
    else:
        assert "environment.modules is empty" in problem


def test_deployment_problem_texts():
    assert deployment_problem("venv", [], []) is None
    assert deployment_problem("venv", MODULES, []) is None  # modules unused without --sdm
    assert deployment_problem("env-modules", MODULES, ["env-modules"]) is None
    assert deployment_problem("conda", [], ["conda"]) is None
    msg = deployment_problem("env-modules", MODULES, [])
    assert "no --sdm" in msg and "login" not in msg and "shell that started Snakemake" in msg
    msg = deployment_problem("venv", [], ["env-modules"])
    assert "'venv'" in msg and "--sdm env-modules" in msg and "to env-modules" in msg
    msg = deployment_problem("conda", [], ["env-modules"])  # both directions at once
    assert "Add `--sdm conda`" in msg


@pytest.mark.parametrize(
    "loaded,missing",
    [
        (None, MODULES),
        ("", MODULES),
        ("GCCcore/11.3.0:OpenMPI/4.1.4:TensorFlow/2.15.1", []),
        # a failed load of the last name (Environment Modules loads the others)
        ("GCCcore/11.3.0:OpenMPI/4.1.4", ["TensorFlow/2.15.1"]),
        # Lmod loads nothing when one name is unknown; a sticky module stays
        ("modenv/hiera", MODULES),
        # full names with a suffix of the version given
        ("GCCcore/11.3.0:OpenMPI/4.1.4:TensorFlow/2.15.1-CUDA-11.7.0", []),
        # not a version of it: 2.15.10 is another release
        ("GCCcore/11.3.0:OpenMPI/4.1.4:TensorFlow/2.15.10", ["TensorFlow/2.15.1"]),
    ],
)
def test_missing_modules(loaded, missing):
    assert missing_modules(MODULES, loaded) == missing


def test_missing_modules_name_without_version():
    assert missing_modules(["OpenMPI"], "OpenMPI/4.1.4") == []
    assert missing_modules(["OpenMPI"], "OpenMPI-extra/1") == ["OpenMPI"]


def test_module_load_problem_names_the_module():
    assert module_load_problem(MODULES, ":".join(MODULES)) is None
    msg = module_load_problem(MODULES, "GCCcore/11.3.0:OpenMPI/4.1.4")
    assert "TensorFlow/2.15.1 not loaded" in msg
    assert "loaded: GCCcore/11.3.0, OpenMPI/4.1.4" in msg
    assert "module spider TensorFlow" in msg and "no rank was started" in msg


def _cfg(deployment: str, modules=MODULES) -> dict:
    cfg = validate_config(base_config())
    cfg["environment"].update(deployment=deployment, modules=list(modules))
    return cfg


def test_check_modules_loaded_only_for_env_modules():
    check_modules_loaded(_cfg("venv"), environ={})  # nothing to load: no check
    check_modules_loaded(_cfg("env-modules"), environ={"LOADEDMODULES": ":".join(MODULES)})
    with pytest.raises(UserError, match="OpenMPI/4.1.4, TensorFlow/2.15.1 not loaded"):
        check_modules_loaded(_cfg("env-modules"), environ={"LOADEDMODULES": "GCCcore/11.3.0"})


def test_rank_path_env():
    assert rank_path_env({"deployment": "venv"}, "/proj", {}) == {}
    assert rank_path_env(None, "/proj", {}) == {}
    for dep in ("env-modules", "conda"):
        assert rank_path_env({"deployment": dep}, "/proj", {}) == {"PYTHONPATH": "/proj/src"}
    # ahead of what the modules put there (their TensorFlow, Horovod), not instead of it
    env = rank_path_env(
        {"deployment": "env-modules"}, "/proj", {"PYTHONPATH": "/sw/tf/lib:/proj/src:"}
    )
    assert env == {"PYTHONPATH": "/proj/src:/sw/tf/lib"}


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun", "srun"])
def test_ranks_get_the_project_src_under_env_modules(launcher, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/sw/tf/lib")
    kw = dict(
        launcher=launcher,
        job=JobSpec("p", "mpi", 1, 2, 2, 0),
        program_argv=["python", "-m", "hvdscale.cli", "train"],
        training=validate_config(base_config())["training"],
        is_root_user=False,
        cpu_count=2,
    )
    spec = build_launch(**kw, environment={"deployment": "env-modules", "modules": MODULES})
    src = str(ROOT / "src")
    assert spec.env["PYTHONPATH"] == f"{src}:/sw/tf/lib"
    if launcher == "mpirun":  # passed on to every rank
        assert "PYTHONPATH" in [spec.argv[i + 1] for i, a in enumerate(spec.argv) if a == "-x"]
    # venv: unchanged (.venv-train has hvdscale installed)
    assert "PYTHONPATH" not in build_launch(**kw, environment={"deployment": "venv"}).env
    assert "PYTHONPATH" not in build_launch(**kw).env


def test_module_python_imports_hvdscale_with_the_ranks_pythonpath(tmp_path):
    """A Python without hvdscale installed (-S: no site-packages, as a module's Python
    without the project) imports hvdscale.cli's package with the ranks' PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import hvdscale.project, sys; print(hvdscale.project.__file__)"
    bare = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert bare.returncode != 0 and "No module named 'hvdscale'" in bare.stderr
    env.update(rank_path_env({"deployment": "env-modules"}, ROOT, env))
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(ROOT / "src" / "hvdscale" / "project.py")


def test_launch_stops_on_a_module_that_did_not_load(tmp_path):
    """`hvdscale launch` of an env-modules config whose module did not load (LOADEDMODULES
    without it) exits non-zero naming the module, before any rank or failure.json."""
    cfg = _cfg("env-modules")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    out_dir = tmp_path / "run"
    env = {**os.environ, "LOADEDMODULES": "GCCcore/11.3.0:OpenMPI/4.1.4"}
    r = subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", "launch", "--config", str(config)]
        + ["--run-id", "local_mpi_n1_w2_b75_lrnone_r0", "--data-dir", str(tmp_path)]
        + ["--out-dir", str(out_dir), "--launcher", "mpirun", "--train-python", "false"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode != 0
    assert "TensorFlow/2.15.1 not loaded" in r.stderr, r.stderr
    assert not (out_dir / "failure.json").exists()


def _bare_python(tmp_path: Path) -> str:
    """A Python without site-packages (-S), standing in for a module's Python that has
    none of hvdscale's dependencies."""
    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    return str(bare)


def test_train_python_problem_names_what_the_ranks_python_lacks(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ranks = {**env, **rank_path_env({"deployment": "env-modules"}, ROOT, env)}
    assert train_python_problem(sys.executable, ranks) is None  # the workflow env has all
    bare = _bare_python(tmp_path)
    msg = train_python_problem(bare, ranks)  # hvdscale from src, its dependencies missing
    assert "cannot import numpy, h5py, pyyaml, jsonschema:" in msg and bare in msg
    assert "--system-site-packages" in msg
    assert "cannot import hvdscale, numpy" in train_python_problem(bare, env)  # no src
    assert "not on PATH" in train_python_problem(str(tmp_path / "nopython"), env)


def test_check_train_python_only_outside_venv(tmp_path):
    missing = str(tmp_path / "nopython")
    check_train_python(_cfg("venv"), missing, {})  # .venv-train: not checked
    for dep in ("env-modules", "conda"):
        with pytest.raises(UserError, match="not on PATH"):
            check_train_python(_cfg(dep), missing, {})
    check_train_python(
        _cfg("env-modules"), sys.executable, rank_path_env({"deployment": "env-modules"})
    )


@pytest.mark.parametrize(
    "environ,modules",
    [
        ({}, None),  # no module system: no `modules` in the record
        ({"LOADEDMODULES": ""}, []),  # Lmod, nothing loaded (after `module purge`)
        ({"LOADEDMODULES": "openmpi/4.1.4:python/3.11"}, ["openmpi/4.1.4", "python/3.11"]),
    ],
)
def test_record_lists_the_loaded_modules(environ, modules, monkeypatch):
    """The run record's environment.modules (issue 29): LOADEDMODULES where rank 0 ran,
    checked against the run schema."""
    from jsonschema import Draft202012Validator

    from hvdscale.record.build import load_run_schema
    from hvdscale.record.environment import environment_block, loaded_modules

    assert loaded_modules(environ) == modules
    monkeypatch.delenv("LOADEDMODULES", raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    env = environment_block(
        config_hash="x", hostnames=["h"], devices=["CPU"], tensorflow="2.15.1",
        horovod="0.28.1", started_utc="2026-01-01T00:00:00Z",
    )  # fmt: skip
    assert env.get("modules") == modules and ("modules" in env) == (modules is not None)
    schema = load_run_schema()["properties"]["environment"]
    assert not list(Draft202012Validator(schema).iter_errors(env))
