"""hvdscale.native: the epoll_wait library that makes Gloo's spinning loop thread yield
(built from its source here with the system C compiler, preloaded into a real
interpreter), how hvdscale launch preloads it into Gloo ranks and refuses a run without
it, and the rank's own check for its record."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest_train import base_config, sub_env, write_config

from hvdscale import native
from hvdscale.errors import UserError
from hvdscale.launch.launchspec import gloo_env

# epoll_wait on a pipe with a byte in it (always ready) ten times, then on an empty pipe
# (timeout 0: returns 0) once; prints the library's yield count after each part and
# whether the process sees the library mapped (hvdscale.native.loaded)
PROBE = """
import ctypes, os, select
from hvdscale.native import loaded
lib = ctypes.CDLL(None)
count = lambda: ctypes.c_ulong.in_dll(lib, "hvdscale_epoll_yields").value
r, w = os.pipe(); os.write(w, b"x")
ep = select.epoll(); ep.register(r, select.EPOLLIN)
for _ in range(10):
    assert ep.poll(0)
ready = count()
r2, w2 = os.pipe()
ep2 = select.epoll(); ep2.register(r2, select.EPOLLIN)
assert ep2.poll(0) == []
after_idle = count()
for _ in range(3):
    assert ep.poll(0)
print(ready, after_idle, count(), loaded())
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return native.build(tmp_path_factory.mktemp("native") / native.LIBRARY.name)


def probe(preload):
    env = sub_env()
    env["LD_PRELOAD"] = str(preload)
    r = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_the_library_yields_from_the_third_ready_return_on(library):
    ready, after_idle, again, loaded = probe(library)
    # calls 3..10 of the ready streak yield first; the idle call still follows a streak
    # (it yields once) and ends it; the next ready streak starts from nothing: 3 calls, 1 yield
    assert (int(ready), int(after_idle), int(again)) == (8, 9, 10)
    assert loaded == "True"


def test_loaded_reads_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 42   /x/{native.LIBRARY.name}\n")
    assert native.loaded(maps)
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 42   /usr/lib/libc.so.6\n")
    assert not native.loaded(maps)
    assert not native.loaded(tmp_path / "absent")


def test_a_compile_error_names_the_library(tmp_path, monkeypatch):
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    monkeypatch.setattr(native, "SOURCE", bad)
    with pytest.raises(UserError, match=r"building .*x\.so from .*bad\.c failed"):
        native.build(tmp_path / "x.so")
    assert not (tmp_path / "x.so").exists()


def test_gloo_ranks_preload_it_and_keep_what_was_preloaded(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert gloo_env({}, "gloo")["LD_PRELOAD"] == str(native.LIBRARY)
    monkeypatch.setenv("LD_PRELOAD", "/opt/a.so /opt/b.so")
    env = gloo_env({}, "gloo")
    assert env["LD_PRELOAD"] == f"{native.LIBRARY}:/opt/a.so:/opt/b.so"
    assert gloo_env({"gloo_yield_when_spinning": False}, "gloo") == {}
    assert gloo_env({}, "mpi") == {}  # Open MPI: its own yield (mpi_yield_when_idle)
    assert gloo_env({}, "nccl") == {}  # a Gloo controller only coordinates
    # torch.distributed's gloo has the same loop thread (measured); its nccl does not
    assert gloo_env({}, "gloo", "torch-ddp")["LD_PRELOAD"].startswith(str(native.LIBRARY))
    assert gloo_env({}, "nccl", "torch-ddp") == {}


@pytest.mark.parametrize(
    "run_id, launcher, preloaded",
    [
        ("local_gloo_n1_w2_b75_lrnone_r0", "horovodrun", True),
        ("local_gloo_n1_w2_b75_lrnone_r0", "srun", True),  # slurm.rendezvous: srun passes the env
        ("local_mpi_n1_w2_b75_lrnone_r0", "mpirun", False),
        ("local_torch-ddp_gloo_n1_w2_b75_lrnone_r0", "horovodrun", True),  # torchrun
    ],
)
def test_the_launch_command_carries_it(tmp_path, run_id, launcher, preloaded):
    cfg = base_config()
    torch = dict(cfg["scaling"]["sweeps"][0], name="torch", backends=["gloo"])
    cfg["scaling"]["sweeps"].append(dict(torch, frameworks=["torch-ddp"]))
    path = write_config(tmp_path / "config.json", cfg)
    argv = [sys.executable, "-m", "hvdscale.cli", "launch", "--config", str(path)]
    argv += ["--run-id", run_id, "--data-dir", "d", "--out-dir", str(tmp_path / "run")]
    argv += ["--launcher", launcher, "--dry-run"]
    env = {**sub_env(), "LD_PRELOAD": ""}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (f"LD_PRELOAD={native.LIBRARY}" in r.stdout) is preloaded, r.stdout


def test_a_gloo_launch_is_refused_when_the_library_is_not_built(tmp_path):
    cfg = write_config(tmp_path / "config.json", base_config())
    missing = tmp_path / "nowhere" / native.LIBRARY.name
    code = (
        "import sys, pathlib, hvdscale.native as n; n.LIBRARY = pathlib.Path(sys.argv[1]); "
        "from hvdscale.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    out = tmp_path / "run"
    argv = [sys.executable, "-c", code, str(missing), "launch", "--config", str(cfg)]
    argv += ["--data-dir", "d", "--out-dir", str(out)]
    env = {**sub_env(), "LD_PRELOAD": ""}
    r = subprocess.run(
        [*argv, "--run-id", "local_gloo_n1_w2_b75_lrnone_r0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert str(missing) in r.stderr and "gloo_yield_when_spinning" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()  # nothing started


def test_setup_built_it():
    # scripts/setup.sh builds the library the launch preloads (make test runs setup first)
    assert native.LIBRARY.is_file() and os.access(native.LIBRARY, os.R_OK)
    assert native.LIBRARY.stat().st_mtime >= native.SOURCE.stat().st_mtime
