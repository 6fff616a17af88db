"""The conda train env (environment.deployment: conda) can be built by Snakemake's
documented mechanics: envs/train.conda.yaml holds only what conda and pip can install
from a requirements list (no `-e`, no relative paths, no --no-build-isolation, no
Horovod), and the post-deploy script beside it (Snakemake's own naming rule) builds
Horovod 0.28.1 after TensorFlow is installed, as scripts/setup.sh does. Conda channels
are not reachable on the test machines, so the env is not built here: these tests check
the files, the pins against envs/train.lock.txt, and run the script with stand-ins."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ENV_FILE = "envs/train.conda.yaml"
SCRIPT = ROOT / "envs/train.conda.post-deploy.sh"
# pip options that a requirements file accepts and that name no local path
PIP_OPTIONS_OK = ("--extra-index-url ", "--index-url ")


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "envs/train.lock.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version.strip()
    return pins


def _horovod_pin() -> str:
    """Horovod's version as scripts/setup.sh builds it and the lock file names it."""
    setup = re.search(r"^HOROVOD_VERSION=(\S+)$", (ROOT / "scripts/setup.sh").read_text(), re.M)
    lock = re.search(r"horovod==(\S+)", (ROOT / "envs/train.lock.txt").read_text())
    assert setup and lock and setup.group(1) == lock.group(1)
    return setup.group(1)


def _pip_lines(env_file: str = ENV_FILE) -> list[str]:
    env = yaml.safe_load((ROOT / env_file).read_text())
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert len(pips) == 1
    return [str(x).strip() for x in pips[0]]


def test_env_file_is_the_default_and_parses():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["environment"]["properties"]["conda_env"]["default"] == ENV_FILE
    env = yaml.safe_load((ROOT / ENV_FILE).read_text())
    assert "conda-forge" in env["channels"]
    conda_deps = [d for d in env["dependencies"] if isinstance(d, str)]
    for want in ("python=3.11", "pip", "cxx-compiler", "make"):
        assert want in conda_deps, want
    assert any(d.startswith("openmpi") for d in conda_deps)
    assert "cmake=3.25" in conda_deps  # not cmake 4 (Horovod's vendored gloo)


@pytest.mark.parametrize("env_file", [ENV_FILE, "envs/workflow.conda.yaml"])
def test_pip_list_is_a_plain_requirements_list(env_file):
    """Both conda envs: pins only. Snakemake builds an env from a copy of its file, so a
    relative `-e ../` (hvdscale from this checkout) would point nowhere: the rules put the
    checkout's src on PYTHONPATH instead (the launcher for the ranks, HVD for the rest)."""
    for line in _pip_lines(env_file):
        if line.startswith("-"):
            assert line.startswith(PIP_OPTIONS_OK), line  # no -e, -r, --no-build-isolation
            continue
        assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][A-Za-z0-9.+]*", line), line
        assert "horovod" not in line.lower()  # built by the post-deploy script
    text = (ROOT / env_file).read_text()
    assert "../" not in text and "file:" not in text


def test_pins_are_the_lock_files():
    lock = _lock()
    pins = {}
    for line in _pip_lines():
        if not line.startswith("-"):
            name, version = line.split("==")
            pins[re.sub(r"\[.*\]", "", name).lower().replace("_", "-")] = version.split("+")[0]
    assert pins["tensorflow-cpu"] == lock["tensorflow-cpu"] == "2.15.1"
    assert pins["numpy"] == lock["numpy"]
    for name, version in pins.items():
        if name in lock:
            assert version == lock[name], (name, version, lock[name])
    # what hvdscale itself needs in the ranks' python (launch/runner.py checks these)
    for need in ("numpy", "h5py", "pyyaml", "jsonschema"):
        assert need in pins, need


def test_post_deploy_script_is_where_snakemake_looks():
    from snakemake.sourcecache import LocalSourceFile

    aux = LocalSourceFile(str(ROOT / ENV_FILE)).replace_suffix([".yaml", ".yml"], ".post-deploy.sh")
    assert aux is not None and Path(aux.get_path_or_uri(secret_free=True)) == SCRIPT
    assert SCRIPT.is_file()
    assert SCRIPT.read_text().startswith("#!/usr/bin/env bash\n")  # Snakemake runs the shebang
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_post_deploy_script_builds_setup_shs_horovod():
    text = SCRIPT.read_text()
    assert "set -euo pipefail" in text
    assert f"HOROVOD_VERSION={_horovod_pin()}\n" in text
    assert "--no-build-isolation" in text
    setup = (ROOT / "scripts/setup.sh").read_text()
    flags = set(re.findall(r"HOROVOD_WITH(?:OUT)?_[A-Z]+=1", setup))
    assert {"HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_TENSORFLOW=1"} <= flags
    # the conda env is the CPU variant: setup's GPU variant alone builds the PyTorch ops
    assert "HOROVOD_WITH_PYTORCH=1" in flags and "HOROVOD_WITHOUT_PYTORCH=1" in flags
    flags.discard("HOROVOD_WITH_PYTORCH=1")
    for flag in flags:
        assert flag in text, flag


FAKE_PYTHON = """#!/bin/sh
[ "$1" = -c ] && exit 0   # import tensorflow
{ echo "python $*"; env | grep '^HOROVOD_' | sort; } >> "$LOG"
"""
FAKE_HOROVODRUN = """#!/bin/sh
printf 'Available Frameworks:\\n    [X] TensorFlow\\n    [ ] PyTorch\\n'
printf 'Available Controllers:\\n    [X] MPI\\n    [%s] Gloo\\n' "$GLOO"
"""


def _run_script(tmp_path, gloo="X", conda_prefix="/fake/env"):
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for name, body in [
        ("python", FAKE_PYTHON),
        ("horovodrun", FAKE_HOROVODRUN),
        ("cmake", "#!/bin/sh\n"),
    ]:
        (bin_ / name).write_text(body)
        (bin_ / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "CONDA_"))}
    env.update(PATH=f"{bin_}:{os.environ['PATH']}", LOG=str(tmp_path / "log"), GLOO=gloo)
    if conda_prefix:
        env["CONDA_PREFIX"] = conda_prefix
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30
    )


def test_post_deploy_script_runs_pip_with_the_build_flags(tmp_path):
    out = _run_script(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    log = (tmp_path / "log").read_text()
    assert (
        "python -m pip install --no-build-isolation --no-cache-dir --no-deps"
        f" horovod=={_horovod_pin()}" in log
    )
    for flag in ("HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITHOUT_PYTORCH=1"):
        assert flag in log.splitlines()
    assert f"HOROVOD_CMAKE={tmp_path / 'bin' / 'cmake'}" in log.splitlines()


@pytest.mark.parametrize("case", ["no gloo", "no env"])
def test_post_deploy_script_fails_loudly(tmp_path, case):
    if case == "no gloo":
        out = _run_script(tmp_path, gloo=" ")
        assert "does not list Gloo" in out.stderr
    else:
        out = _run_script(tmp_path, conda_prefix=None)
        assert "CONDA_PREFIX unset" in out.stderr
    assert out.returncode != 0
