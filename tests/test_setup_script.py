"""scripts/setup.sh --check-only: the system pieces setup needs, checked on PATH (no root,
no dpkg), one message naming what is missing and what provides it, and the MPI/CUDA part
of the Horovod wheel cache key. Fast: nothing is installed or built."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from required_layers import layer_skipif

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"

_TOOLS = ("mpicc", "mpirun", "cc", "c++", "cmake", "dpkg-query")
pytestmark = layer_skipif(
    "horovod",
    None
    if all(shutil.which(c) for c in _TOOLS)
    else "needs the Debian machine's compilers, MPI and cmake that build Horovod on PATH",
)


def _path_without(tmp_path, leave_out, extra=None):
    """A PATH of one folder: symlinks to /usr/bin and /bin less `leave_out`, plus `extra`
    (name -> script text)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True)
    for folder in ("/usr/bin", "/bin"):
        for entry in os.scandir(folder):
            if entry.name in leave_out or (bin_ / entry.name).exists():
                continue
            (bin_ / entry.name).symlink_to(entry.path)
    for name, text in (extra or {}).items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return str(bin_)


MPI = {"mpicc", "mpirun", "mpiexec", "mpicxx", "mpic++", "mpiCC", "orterun"}


def _check(*args, path=None, **env):
    # a train env that does not exist: its variant (CPU or GPU) does not decide the key
    full = {**os.environ, "PYTHON": sys.executable, "HVD_TRAIN_ENV": "/nonexistent/train", **env}
    if path is not None:
        full["PATH"] = path
    return subprocess.run(
        ["bash", str(SETUP), "--check-only", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_check_only_with_everything_on_path():
    r = _check()
    assert r.returncode == 0, r.stderr
    assert "all pieces present" in r.stdout
    for piece in ("Python 3.11", "C compiler", "C++ compiler", "MPI compiler wrapper", "cmake"):
        assert piece in r.stdout
    # this machine's build: Debian's OpenMPI, no GPU operations asked for
    assert "_openmpi-4.1.4_cuda-none" in r.stdout


def test_missing_mpi_is_one_message_with_apt_and_module_hints(tmp_path):
    r = _check(path=_path_without(tmp_path, MPI))
    assert r.returncode == 1
    assert r.stderr.count("setup: missing") == 1
    assert "MPI compiler wrapper [mpicc]" in r.stderr
    assert "MPI launcher [mpirun]" in r.stderr
    assert "as root: apt-get install -y libopenmpi-dev" in r.stderr
    assert "apt-get install -y --no-install-recommends libopenmpi-dev openmpi-bin" in r.stderr
    assert "module load GCC OpenMPI" in r.stderr
    # nothing else is reported missing
    assert len([line for line in r.stderr.splitlines() if line.startswith("  - ")]) == 2


def test_off_debian_gives_module_hints_only(tmp_path):
    r = _check(path=_path_without(tmp_path, MPI | {"dpkg-query", "dpkg"}))
    assert r.returncode == 1
    assert "load a module, e.g. module load OpenMPI (Debian package: libopenmpi-dev)" in r.stderr
    assert "as root" not in r.stderr
    assert "Load modules that provide them" in r.stderr


def test_workflow_only_needs_python_only(tmp_path):
    r = _check("--workflow-only", path=_path_without(tmp_path, MPI | {"cmake", "c++", "g++"}))
    assert r.returncode == 0, r.stderr
    assert "MPI" not in r.stdout


def test_wrong_python_is_named(tmp_path):
    r = _check(path=_path_without(tmp_path, set()), PYTHON="/nonexistent/python3.11")
    assert r.returncode == 1
    assert "Python 3.11 (/nonexistent/python3.11 not found)" in r.stderr
    assert "module load Python/3.11" in r.stderr


@pytest.mark.parametrize(
    "mpicc, mpirun, key",
    [
        (
            "echo 'mpicc: Open MPI 5.0.3 (Language: C)'",
            "echo 'mpirun (Open MPI) 5.0.3'",
            "openmpi-5.0.3",
        ),
        (
            "echo 'mpicc for MPICH version 4.1.2' >&2; exit 1",
            "printf 'HYDRA build details:\\n    Version:                                 4.1.2\\n'",
            "mpich-4.1.2",
        ),
        (
            "exit 1",
            "echo 'Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619'",
            "intelmpi-2021.10",
        ),
    ],
)
def test_cache_key_names_the_mpi_on_path(tmp_path, mpicc, mpirun, key):
    path = _path_without(
        tmp_path,
        MPI,
        {"mpicc": f"#!/bin/sh\n{mpicc}\n", "mpirun": f"#!/bin/sh\n{mpirun}\n"},
    )
    r = _check(path=path)
    assert r.returncode == 0, r.stderr
    assert f"tf-<TensorFlow>_{key}_cuda-none" in r.stdout


def test_cache_key_names_cuda_only_for_a_gpu_build(tmp_path):
    nvcc = "#!/bin/sh\necho 'Cuda compilation tools, release {}, V{}.1'\n"
    path = _path_without(tmp_path, {"nvcc"}, {"nvcc": nvcc.format("12.4", "12.4")})
    r = _check(path=path)
    assert "_cuda-none" in r.stdout  # nvcc alone: the CPU train env
    assert "train env: cpu variant" in r.stdout
    # GPU operations asked for: the GPU variant, compiled with CUDA 13 like torch's CUDA
    # build; a CUDA 12 nvcc on PATH is not used, the lock's nvidia packages are
    r = _check(path=path, HOROVOD_GPU_OPERATIONS="NCCL")
    assert "train env: gpu variant" in r.stdout
    assert "_openmpi-4.1.4_cuda-13.0_torch-2.13.0" in r.stdout
    assert "the nvcc on PATH is release 12.4, not CUDA 13" in r.stdout
    # a CUDA 13 on PATH (a module) wins, and names the key
    (tmp_path / "bin" / "nvcc").write_text(nvcc.format("13.1", "13.1"))
    r = _check(path=path, HVD_GPU="1")
    assert "_openmpi-4.1.4_cuda-13.1_torch-2.13.0" in r.stdout
    assert "(from nvcc on PATH)" in r.stdout


def test_gpu_switch_is_checked(tmp_path):
    r = _check(HVD_GPU="maybe")
    assert r.returncode == 2
    assert "HVD_GPU='maybe': use 1 (GPU train env), 0 (CPU train env) or auto" in r.stderr
    # an existing train env keeps its variant unless asked otherwise
    env = tmp_path / "train"
    env.mkdir()
    (env / ".hvdscale-stamp").write_text("lock: x\nvariant: gpu\n")
    r = _check(HVD_TRAIN_ENV=str(env))
    assert "train env: gpu variant" in r.stdout
    assert "train env: cpu variant" in _check(HVD_TRAIN_ENV=str(env), HVD_GPU="0").stdout


def _stamp(r):
    line = next(x for x in r.stdout.splitlines() if x.startswith("[setup] train env stamp: "))
    return line.removeprefix("[setup] train env stamp: ")


def test_train_env_stamp_follows_mpi_cuda_and_variant(tmp_path):
    """The train env is reinstalled when its stamp changes: another MPI or CUDA on PATH, or
    the other variant, gives another stamp."""
    base = _stamp(_check(path=_path_without(tmp_path / "a", set())))
    assert "variant: cpu" in base and "nvcc on PATH: none" in base
    mpi5 = _path_without(
        tmp_path / "b",
        MPI,
        {
            "mpicc": "#!/bin/sh\necho 'mpicc: Open MPI 5.0.3 (Language: C)'\n",
            "mpirun": "#!/bin/sh\necho 'mpirun (Open MPI) 5.0.3'\n",
        },
    )
    nvcc = "#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n"
    cuda = _path_without(tmp_path / "c", {"nvcc"}, {"nvcc": nvcc})
    stamps = {
        base,
        _stamp(_check(path=mpi5)),
        _stamp(_check(path=cuda)),
        _stamp(_check(path=_path_without(tmp_path / "d", set()), HVD_GPU="1")),
    }
    assert len(stamps) == 4
    assert "release 12.4" in _stamp(_check(path=cuda))
    assert "openmpi-5.0.3" in _stamp(_check(path=mpi5))
