"""The GPU train env: ``HVD_GPU=1 scripts/setup.sh`` builds it from envs/train-gpu.lock.txt
on this machine, which has no GPU (the CUDA pieces come from the lock's nvidia packages).

It is built into a folder of its own (``HVD_TRAIN_ENV``), never the checkout's .venv-train,
the CPU env the other tests use. The Horovod wheel comes from the wheel cache when a build
with the same TensorFlow, MPI, CUDA and torch is kept there (the first build compiles it:
envs/README.md gives the cold and warm times); its build-info.txt must then show that it
was built with NCCL and PyTorch. An nvcc on PATH is left out, so the CUDA of the nvidia
packages is the one used, as on a login node without a CUDA module.

The env (about 9.5 GB, 2-7 minutes to install) is kept for the next session under
``~/.cache/hvdscale/test-gpu-env/<key>`` (``HVD_TEST_GPU_ENV_DIR`` moves it), the key a hash
of what builds it: scripts/setup.sh, the lock and the Horovod patch. A change to any of
them builds it afresh (and removes the older keys); otherwise the session runs setup
again over the kept env (its stamp says up to date; the check-build runs again) and the
tests read the output of the build that made it. ``HVD_TEST_GPU_ENV_FRESH=1`` builds into
a temporary folder and removes it afterwards.

What only a GPU node can show (a GPU allreduce over NCCL, TensorFlow and torch on the
device) is not tested here.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from required_layers import require_layer

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
LOCK = ROOT / "envs" / "train-gpu.lock.txt"
#: what builds the env: a change to any of them builds it afresh
BUILT_FROM = [SETUP, LOCK, ROOT / "envs" / "horovod-0.28.1-torch-cxx17.patch"]
KEEP_DIR = Path(
    os.environ.get("HVD_TEST_GPU_ENV_DIR", Path.home() / ".cache/hvdscale/test-gpu-env")
)
# the env (about 9.5 GB) and pip's unpacking need room; the lock is for Linux x86_64
NEEDS_GB = 20

pytestmark = [pytest.mark.slow, pytest.mark.stream("apart")]


def _missing() -> str | None:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "the GPU lock's wheels are for Linux x86_64"
    for cmd in ("mpicc", "mpirun", "cc", "c++", "cmake"):
        if shutil.which(cmd) is None:
            return f"{cmd} not on PATH (scripts/setup.sh --check-only names what provides it)"
    if (KEEP_DIR / build_key() / "setup-output.txt").exists():
        return None  # kept: nothing to install
    for where in ("/tmp", KEEP_DIR.parent if KEEP_DIR.parent.exists() else Path.home()):
        free = shutil.disk_usage(where).free / 1e9
        if free < NEEDS_GB:
            return f"{free:.0f} GB free under {where}, the GPU train env needs {NEEDS_GB} GB"
    return None


def build_key() -> str:
    digest = hashlib.sha256()
    for path in BUILT_FROM:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _path_without_nvcc() -> str:
    """PATH less the folders that hold an nvcc (this machine has CUDA 13.0 in /usr/local)."""
    keep = [
        d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvcc").exists()
    ]
    return os.pathsep.join(keep)


def _setup(env_dir: Path) -> str:
    """``HVD_GPU=1 scripts/setup.sh`` into ``env_dir``; its output (fails the test if setup
    fails)."""
    env = {
        **os.environ,
        "HVD_GPU": "1",
        "HVD_TRAIN_ENV": str(env_dir),
        "HVD_SKIP_APT": "1",
        "PATH": _path_without_nvcc(),
        # the interpreter itself, not the workflow venv's python
        "PYTHON": getattr(sys, "_base_executable", sys.executable),
    }
    for var in ("CUDA_HOME", "HOROVOD_CUDA_HOME", "HOROVOD_NCCL_HOME"):
        env.pop(var, None)
    r = subprocess.run(
        ["bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=5400, cwd=ROOT
    )
    assert r.returncode == 0, f"setup failed:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def gpu_env(tmp_path_factory):
    """The GPU variant built by setup: (env dir, the output of the setup that built it)."""
    require_layer("gpu-env", _missing())
    if os.environ.get("HVD_TEST_GPU_ENV_FRESH") == "1":
        env_dir = tmp_path_factory.mktemp("gpu-env") / "train-gpu"
        yield env_dir, _setup(env_dir)
        shutil.rmtree(env_dir, ignore_errors=True)
        return
    kept = KEEP_DIR / build_key()
    env_dir, built = kept / "train-gpu", kept / "setup-output.txt"
    for old in KEEP_DIR.glob("*"):
        if old != kept:  # built from another setup.sh, lock or patch
            shutil.rmtree(old, ignore_errors=True)
    if built.exists():
        again = _setup(env_dir)  # over the kept env: nothing to install
        assert f"{env_dir}: up to date (gpu variant)" in again, again[-3000:]
        yield env_dir, built.read_text()
        return
    shutil.rmtree(kept, ignore_errors=True)  # a build that did not finish
    kept.mkdir(parents=True)
    out = _setup(env_dir)
    built.write_text(out)
    yield env_dir, out


def _run_py(env_dir: Path, code: str) -> str:
    r = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout


def test_setup_builds_the_gpu_variant_and_checks_nccl(gpu_env):
    env_dir, out = gpu_env
    assert "train-gpu.lock.txt (gpu variant: HVD_GPU=1)" in out
    assert "horovodrun --check-build: TensorFlow, MPI, Gloo, PyTorch, NCCL available" in out, out[
        -3000:
    ]
    stamp = (env_dir / ".hvdscale-stamp").read_text()
    assert "variant: gpu" in stamp
    assert "nvcc on PATH: none" in stamp


def test_check_build_lists_nccl_tensorflow_and_pytorch(gpu_env):
    env_dir, _ = gpu_env
    r = subprocess.run(
        [str(env_dir / "bin" / "horovodrun"), "--check-build"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}"},
    )
    assert r.returncode == 0, r.stderr
    for item in ("TensorFlow", "PyTorch", "MPI", "Gloo", "NCCL"):
        assert re.search(rf"\[X\] {item}\b", r.stdout), r.stdout
    assert "Horovod v0.28.1" in r.stdout


def test_frameworks_are_cuda_builds_and_horovod_finds_nccl(gpu_env):
    env_dir, _ = gpu_env
    out = _run_py(
        env_dir,
        "import tensorflow as tf, torch\n"
        "import horovod.tensorflow as htf, horovod.torch as hth\n"
        "print('tf', tf.__version__, tf.test.is_built_with_cuda())\n"
        "print('torch', torch.__version__, torch.version.cuda)\n"
        "print('torch-nccl', '.'.join(map(str, torch.cuda.nccl.version())))\n"
        "print('hvd-nccl', htf.nccl_built(), hth.nccl_built())\n",
    )
    assert "tf 2.15.1 True" in out
    assert re.search(r"^torch 2\.13\.0\S* 13\.\d+$", out, re.M), out
    # one NCCL for both frameworks and Horovod: the newer one, which torch 2.13 needs
    assert "torch-nccl 2.29.7" in out
    assert re.search(r"^hvd-nccl (True|[1-9]\d*) (True|[1-9]\d*)$", out, re.M), out


def test_horovod_libraries_load_nccl_from_the_env(gpu_env):
    """The wheel's libraries find the env's NCCL through their $ORIGIN run path, wherever
    the env lives (the cached wheel serves every env of its key)."""
    env_dir, _ = gpu_env
    site = next((env_dir / "lib").glob("python3.*/site-packages"))
    libs = sorted((site / "horovod").glob("*/mpi_lib*.so"))
    assert {p.parent.name for p in libs} >= {"tensorflow", "torch"}, libs
    for lib in libs:
        r = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, timeout=60)
        found = re.search(r"libnccl\.so\.2 => (\S+)", r.stdout)
        assert found, r.stdout  # found at all (not "not found")
        want = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        assert Path(found.group(1)).resolve() == want.resolve(), r.stdout


def test_cached_wheel_says_how_it_was_built(gpu_env):
    _, out = gpu_env
    m = re.search(r"(?:cached in |using cached Horovod wheel )(\S+?)(?:;|/horovod-)", out)
    assert m, out[-3000:]
    cache_dir = Path(m.group(1))
    assert cache_dir.name.endswith("_cuda-13.0_torch-2.13.0"), cache_dir
    info = (cache_dir / "build-info.txt").read_text()
    assert "train env variant: gpu" in info
    assert "HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_PYTORCH=1" in info
    assert "torch: 2.13.0" in info
    assert re.search(r"CUDA toolkit: .*nvcc release 13\.0\)", info), info
    assert "(NCCL 2.29.7)" in info
    assert list(cache_dir.glob("horovod-0.28.1-*.whl"))
