"""training.mkl_code_path (issue 32): hvdscale.native's second library, which makes the MKL
in torch take its Intel code path (built from its source with the system C compiler,
preloaded into a real train-env torch process), how hvdscale launch preloads it into the
ranks of torch-ddp runs only and refuses a run without it, the config key's validation,
the run's config slice and the rank's own check for its record."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest_train import TRAIN_PY, base_config, sub_env, train_code_env, write_config
from required_layers import require_layer
from test_torch_ddp import needs_torch

from hvdscale import native
from hvdscale.config.load import validate_config
from hvdscale.errors import ConfigError, UserError
from hvdscale.launch.launchspec import build_launch, mkl_env
from hvdscale.matrix.runtable import run_config
from hvdscale.slurm.jobspec import JobSpec

TORCH_DDP = "local_torch-ddp_gloo_n1_w2_b75_lrnone_r0"
HOROVOD_TF = "local_gloo_n1_w2_b75_lrnone_r0"

# one fp32 GEMM of issue 32's shape (1000x600 @ 600x192) on seeded data, one thread; the
# product goes to argv[1] (.npy); prints what the run record would say: cpu_kernels, the
# rank's mkl_code_path, and how often MKL asked the library's vendor check (-1: no library)
GEMM = """
import ctypes, json, sys
import numpy as np, torch
from hvdscale import native
from hvdscale.record.system import cpu_kernels
torch.set_num_threads(1)
g = torch.Generator().manual_seed(32)
a = torch.randn(1000, 600, generator=g)
b = torch.randn(600, 192, generator=g)
np.save(sys.argv[1], (a @ b).numpy())
try:
    checks = ctypes.c_ulong.in_dll(ctypes.CDLL(None), "hvdscale_mkl_intel_checks").value
except ValueError:
    checks = -1
print(json.dumps({"kernels": cpu_kernels(), "path": native.mkl_code_path(), "checks": checks,
                  "blas": torch.__config__.show()}))
"""


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    d = tmp_path_factory.mktemp("native")
    out = native.build(d / native.LIBRARY.name)
    return out, d / native.MKL_LIBRARY.name


def test_one_build_makes_both_libraries(libraries):
    gloo, mkl = libraries
    assert gloo.is_file() and mkl.is_file()
    assert "mkl" in mkl.name  # what record.system.cpu_kernels looks for in LD_PRELOAD
    syms = subprocess.run(["nm", "-D", str(mkl)], capture_output=True, text=True).stdout
    assert " T mkl_serv_intel_cpu_true" in syms


def test_a_failing_mkl_build_writes_neither_library(tmp_path, monkeypatch):
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    monkeypatch.setattr(native, "MKL_SOURCE", bad)
    with pytest.raises(UserError, match=r"building .*m\.so from .*bad\.c failed"):
        native.build(tmp_path / "g.so", mkl_out=tmp_path / "m.so")
    assert not (tmp_path / "g.so").exists() and not (tmp_path / "m.so").exists()


def test_the_cli_builds_both_and_names_them(tmp_path):
    env = train_code_env()
    argv = [sys.executable, "-m", "hvdscale.native", "build", "--out", str(tmp_path / "g.so")]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(tmp_path / "g.so"), str(tmp_path / native.MKL_LIBRARY.name)]
    path = [sys.executable, "-m", "hvdscale.native", "path", "--mkl"]
    r = subprocess.run(path, capture_output=True, text=True, env=env, timeout=60)
    assert r.stdout.strip() == str(native.MKL_LIBRARY)


def gemm(tmp_path, name, preload):
    out = tmp_path / f"{name}.npy"
    env = train_code_env(OMP_NUM_THREADS="1", LD_PRELOAD=str(preload or ""))
    r = subprocess.run(
        [str(TRAIN_PY), "-c", GEMM, str(out)], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), np.load(out)


@needs_torch
def test_a_torch_process_with_it_takes_the_intel_path_and_computes_the_same(tmp_path, libraries):
    vendor, c_vendor = gemm(tmp_path, "vendor", None)
    # the lock's x86 CPU build of torch computes fp32 GEMM with MKL
    require_layer("torch", None if "BLAS_INFO=mkl" in vendor["blas"] else "this torch's "
                  f"fp32 GEMM is not MKL's ({vendor['blas']})")  # fmt: skip
    intel, c_intel = gemm(tmp_path, "intel", libraries[1])
    assert "vendor check overridden by LD_PRELOAD" not in vendor["kernels"]
    assert f"vendor check overridden by LD_PRELOAD {libraries[1]}" in intel["kernels"]
    assert (vendor["path"], intel["path"]) == ("vendor", "intel")  # the record's value
    assert vendor["checks"] == -1
    assert intel["checks"] > 0  # MKL asked the library's vendor check, not its own
    # the same product to float32 rounding (sums of 600 products of N(0,1) numbers)
    assert c_intel.shape == c_vendor.shape == (1000, 192)
    np.testing.assert_allclose(c_intel, c_vendor, rtol=0, atol=1e-4 * np.abs(c_vendor).max())


def test_mkl_code_path_reads_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 42   /x/{native.MKL_LIBRARY.name}\n")
    assert native.mkl_code_path(maps) == "intel" and not native.loaded(maps)
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 42   /x/{native.LIBRARY.name}\n")
    assert native.mkl_code_path(maps) == "vendor" and native.loaded(maps)


def test_only_torch_ddp_ranks_with_intel_preload_it(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/a.so")
    intel = {"mkl_code_path": "intel"}
    assert mkl_env(intel, "torch-ddp")["LD_PRELOAD"] == f"{native.MKL_LIBRARY}:/opt/a.so"
    assert mkl_env(intel, "horovod-tf") == {}  # TensorFlow's GEMM is not MKL's
    assert mkl_env({"mkl_code_path": "vendor"}, "torch-ddp") == {}
    assert mkl_env({}, "torch-ddp") == {}  # the default: MKL's own choice
    # after gloo_env's library: both, the caller's own preload kept once
    gloo = {"LD_PRELOAD": f"{native.LIBRARY}:/opt/a.so"}
    both = mkl_env(intel, "torch-ddp", gloo)["LD_PRELOAD"].split(":")
    assert both == [str(native.MKL_LIBRARY), str(native.LIBRARY), "/opt/a.so"]


def launch_config(**training):
    cfg = base_config(**training)
    torch = dict(cfg["scaling"]["sweeps"][0], name="torch", backends=["gloo"])
    cfg["scaling"]["sweeps"].append(dict(torch, frameworks=["torch-ddp"]))
    return validate_config(cfg)


@pytest.mark.parametrize(
    "framework, training, want",
    [
        ("torch-ddp", {"mkl_code_path": "intel"}, [native.MKL_LIBRARY, native.LIBRARY]),
        (
            "torch-ddp",
            {"mkl_code_path": "intel", "gloo_yield_when_spinning": False},
            [native.MKL_LIBRARY],
        ),
        ("torch-ddp", {"mkl_code_path": "vendor"}, [native.LIBRARY]),
        ("horovod-tf", {"mkl_code_path": "intel"}, [native.LIBRARY]),  # ignores it
    ],
)
def test_build_launch_preloads_it_for_torch_ddp_with_intel(monkeypatch, framework, training, want):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    job = JobSpec("local", "gloo", 1, 2, 2, framework=framework)
    spec = build_launch(
        launcher="torchrun" if framework == "torch-ddp" else "horovodrun",
        job=job,
        program_argv=["python"],
        training=training,
        is_root_user=False,
        cpu_count=2,
    )
    assert spec.env["LD_PRELOAD"].split(":") == [str(p) for p in want]


def test_a_torch_launch_is_refused_when_the_library_is_not_built(tmp_path):
    cfg = write_config(tmp_path / "config.json", launch_config(mkl_code_path="intel"))
    missing = tmp_path / "nowhere" / native.MKL_LIBRARY.name
    code = (
        "import sys, pathlib, hvdscale.native as n; n.MKL_LIBRARY = pathlib.Path(sys.argv[1]); "
        "from hvdscale.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    out = tmp_path / "run"
    argv = [sys.executable, "-c", code, str(missing), "launch", "--config", str(cfg)]
    argv += ["--data-dir", "d", "--out-dir", str(out), "--run-id", TORCH_DDP]
    env = {**sub_env(), "LD_PRELOAD": ""}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert str(missing) in r.stderr and "training.mkl_code_path" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()  # nothing started


def test_the_key_is_validated():
    assert validate_config(base_config())["training"]["mkl_code_path"] == "vendor"
    with pytest.raises(ConfigError, match=r"training\.mkl_code_path") as e:
        validate_config(base_config(mkl_code_path="amd"))
    assert "'amd'" in str(e.value) and "intel" in str(e.value)


def test_it_is_in_the_torch_ddp_runs_config_slice_only():
    cfg = launch_config(mkl_code_path="intel")
    assert run_config(cfg, TORCH_DDP)["training"]["mkl_code_path"] == "intel"
    assert "mkl_code_path" not in run_config(cfg, HOROVOD_TF)["training"]
    # so switching it leaves the Horovod-TF runs' slices, and their records, as they are
    vendor = launch_config(mkl_code_path="vendor")
    assert run_config(vendor, HOROVOD_TF) == run_config(cfg, HOROVOD_TF)
    assert run_config(vendor, TORCH_DDP) != run_config(cfg, TORCH_DDP)


def test_setup_built_it():
    # scripts/setup.sh builds the library the launch preloads (make test runs setup first)
    assert native.MKL_LIBRARY.is_file()
    assert native.MKL_LIBRARY.stat().st_mtime >= native.MKL_SOURCE.stat().st_mtime
