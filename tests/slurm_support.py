"""Helpers and fixtures for tests against the local SLURM cluster.

The cluster is started by ``scripts/slurm-cluster.sh`` (Debian's slurm-wlm + munge, as
root, everything under ``.slurm-local/`` or ``$HVD_SLURM_DIR``). Use it from a test
module with::

    from slurm_support import slurm_cluster  # noqa: F401  (pytest fixture)

    @pytest.mark.slurm
    def test_something(slurm_cluster):
        subprocess.run(["sbatch", "--wait", ...], env=slurm_cluster, check=True)

``slurm_cluster`` is session-scoped: the first test that needs it runs ``up`` (one
node); at the end of the session the cluster is put back the way it was found (left
up if it was up before, otherwise ``down``). Tests skip with a clear reason when
not run as root or when SLURM/munge are not installed (layers ``slurm`` and
``multinode`` of tests/required_layers.py: CI fails instead).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from required_layers import require_layer
from streams import again_after_lock_race

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = PROJECT_ROOT / "scripts" / "slurm-cluster.sh"
TRAIN_PYTHON = PROJECT_ROOT / ".venv-train" / "bin" / "python"
PARTITION = os.environ.get("HVD_SLURM_PARTITION", "local")
#: first three octets of the private /24 of two-node mode (see slurm-cluster.sh)
TWO_NODE_SUBNET = os.environ.get("HVD_SLURM_SUBNET", "10.213.0")

# command -> Debian package that provides it
_REQUIRED = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "squeue": "slurm-client",
    "scontrol": "slurm-client",
    "munged": "munge",
}
_REQUIRED_TWO_NODES = {"ip": "iproute2", "unshare": "util-linux", "nsenter": "util-linux"}

#: a tiny Horovod program: every rank contributes rank+1; with 2 ranks the sum is 3
HOROVOD_ALLREDUCE = """\
import os, socket
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
total = hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)
print(f"HVD rank={hvd.rank()} size={hvd.size()} local_size={hvd.local_size()} "
      f"host={socket.gethostname()} sum={float(total):g}", flush=True)
"""


def cluster_dir() -> Path:
    return Path(os.environ.get("HVD_SLURM_DIR", PROJECT_ROOT / ".slurm-local"))


def slurm_skip_reason(nodes: int = 1) -> str | None:
    """Why the local cluster cannot run here, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "local SLURM cluster needs root (slurmd, munged, network namespaces)"
    required = dict(_REQUIRED)
    if nodes == 2:
        required.update(_REQUIRED_TWO_NODES)
    missing = sorted({pkg for cmd, pkg in required.items() if shutil.which(cmd) is None})
    if missing:
        return (
            f"SLURM/munge not installed (missing {', '.join(missing)}): "
            "apt-get install -y slurm-wlm munge"
        )
    if not CLUSTER_SCRIPT.exists():
        return f"{CLUSTER_SCRIPT} not found"
    return None


def horovod_skip_reason() -> str | None:
    """Why the train env cannot run Horovod programs, or None when it can."""
    if not TRAIN_PYTHON.exists():
        return f"train env missing ({TRAIN_PYTHON}); run scripts/setup.sh"
    probe = subprocess.run(
        [
            str(TRAIN_PYTHON),
            "-c",
            "import importlib.util as u, sys; sys.exit(0 if u.find_spec('horovod') else 1)",
        ],
        capture_output=True,
        timeout=60,
    )
    if probe.returncode != 0:
        return "Horovod is not installed in .venv-train yet (scripts/setup.sh builds it)"
    return None


def run_cluster_script(
    *args: str, timeout: float = 300, check: bool = False
) -> subprocess.CompletedProcess:
    """Run scripts/slurm-cluster.sh with ``args``; output captured as text."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"slurm-cluster.sh {' '.join(args)} failed (exit {proc.returncode}):\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    return proc


def cluster_mode() -> str:
    """'1', '2', '2-alpha' or 'down', as reported by ``slurm-cluster.sh status``."""
    proc = run_cluster_script("status", timeout=60)
    m = re.search(r"^mode:\s+(\S+)", proc.stdout, re.MULTILINE)
    if proc.returncode != 0 or not m:
        return "down"
    return m.group(1)


def cluster_env() -> dict[str, str]:
    """os.environ plus the cluster's variables (SLURM_CONF, ...), without job variables."""
    proc = run_cluster_script("env", timeout=30, check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    for line in proc.stdout.splitlines():
        m = re.fullmatch(r"export (\w+)=(.*)", line.strip())
        if m:
            env[m.group(1)] = m.group(2).strip("'\"")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def bring_up(nodes: int = 1) -> dict[str, str]:
    run_cluster_script("up", "--nodes", str(nodes), check=True)
    return cluster_env()


def mode_args(mode: str) -> list[str]:
    """slurm-cluster.sh arguments that put the cluster into ``mode`` ('1', '2',
    '2-alpha' or 'down')."""
    if mode in ("1", "2"):
        return ["up", "--nodes", mode]
    if mode == "2-alpha":  # issue 12: emulated thesis partition
        return ["up", "--nodes", "2", "--emulate", "alpha"]
    return ["down"]


def restore(mode: str) -> None:
    """Put the cluster back into ``mode`` ('1', '2', '2-alpha' or 'down')."""
    run_cluster_script(*mode_args(mode), check=True)


def our_processes() -> list[tuple[int, str]]:
    """(pid, command) of live processes started by this cluster (they carry
    HVD_SLURM_MARK=<cluster dir> in their environment)."""
    mark = f"HVD_SLURM_MARK={cluster_dir()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmd = (
                (entry / "cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
                .strip()
            )
        except OSError:
            continue
        if mark in environ.split(b"\0"):
            found.append((int(entry.name), cmd))
    return found


def run(
    cmd: list[str], env: dict[str, str], timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run a SLURM client command; on failure the assertion shows its output."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed (exit {proc.returncode}):\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"({exc})"


def cluster_diagnostics(env: dict[str, str], logs: list[Path] = ()) -> str:
    """What a person needs to see when a job on the test cluster did not end: the
    queue, every job's record, the newest job logs, the daemons' log tails."""
    parts = []
    for cmd in (
        ["squeue", "--states=all", "-o", "%i %j %T %M %l %D %R"],
        ["scontrol", "show", "job", "-d"],
    ):
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
            parts.append(f"$ {' '.join(cmd)}\n{out.stdout[-6000:]}{out.stderr[-1000:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            parts.append(f"$ {' '.join(cmd)}: {exc}")
    newest = []
    for d in logs:
        if d.is_dir():
            newest += [f for f in d.rglob("*") if f.is_file()]
    newest.sort(key=lambda f: f.stat().st_mtime)
    for f in newest[-8:]:
        parts.append(f"--- {f} (last 1500 characters)\n{_tail(f)}")
    for f in sorted(Path(env.get("HVD_SLURM_DIR") or cluster_dir()).glob("**/*.log"))[:6]:
        parts.append(f"--- {f} (last 1500 characters)\n{_tail(f)}")
    return "\n".join(parts)


def run_plugin(
    args: list[str], env: dict[str, str], timeout: float, logs: list[Path] = ()
) -> subprocess.CompletedProcess:
    """:func:`_run_plugin`, once more after a lost lock folder (streams.again_after_lock_race)."""
    return again_after_lock_race(lambda: _run_plugin(args, env, timeout, logs))


def _run_plugin(
    args: list[str], env: dict[str, str], timeout: float, logs: list[Path] = ()
) -> subprocess.CompletedProcess:
    """Run Snakemake (``args`` after ``python -m snakemake``) in the project root.

    Past ``timeout`` it is not killed outright (that leaves its lock on the directory
    and its jobs in the queue for the next test): it gets SIGINT, which cancels its
    SLURM jobs and releases the lock, then SIGKILL after 60 s; the test fails with
    Snakemake's output and :func:`cluster_diagnostics`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", *args],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        diagnostics = cluster_diagnostics(env, list(logs))
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, timeout=30)
        pytest.fail(
            f"snakemake {' '.join(args)} did not end within {timeout:.0f} s\n"
            f"--- snakemake stdout (tail)\n{out[-4000:]}\n--- stderr (tail)\n{err[-6000:]}\n"
            f"{diagnostics}"
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """A running one-node local SLURM cluster; yields the environment for its clients."""
    require_layer("slurm", slurm_skip_reason(1))
    before = cluster_mode()
    try:
        env = bring_up(1)
    except AssertionError as exc:
        pytest.fail(str(exc))
    yield env
    restore("1" if before == "1" else "down")


#: the two-node tests' cluster: an instance of its own (own directory and ports), so the
#: one-node test cluster stays up beside it (tests/run.sh runs both streams at once)
TWO_NODE_DIR = PROJECT_ROOT / ".slurm-two-node"
TWO_NODE_PORT = 6951


@pytest.fixture(scope="session")
def slurm_cluster_two_nodes() -> Iterator[dict[str, str]]:
    """A two-node cluster with the emulated alpha partition (node1/node2 in their own
    network namespaces; partition ``local`` spans both, ``alpha`` declares the thesis's
    GPU nodes: ``up --nodes 2 --emulate alpha``), brought up once for every two-node test
    of the session, in a directory of its own (``TWO_NODE_DIR``, port ``TWO_NODE_PORT``):
    the one-node cluster of ``slurm_cluster`` can be up beside it. Stopped and removed
    afterwards."""
    require_layer("multinode", slurm_skip_reason(2))
    up = ("--nodes", "2", "--emulate", "alpha")
    with own_cluster("hvdtwonode", PARTITION, "node1", TWO_NODE_PORT, str(TWO_NODE_DIR), up) as env:
        yield {**env, "TF_CPP_MIN_LOG_LEVEL": env.get("TF_CPP_MIN_LOG_LEVEL", "2")}


__all__ = [
    "HOROVOD_ALLREDUCE",
    "PARTITION",
    "PROJECT_ROOT",
    "TRAIN_PYTHON",
    "TWO_NODE_DIR",
    "TWO_NODE_SUBNET",
    "bring_up",
    "cluster_dir",
    "cluster_env",
    "cluster_mode",
    "horovod_skip_reason",
    "our_processes",
    "restore",
    "run",
    "run_plugin",
    "cluster_diagnostics",
    "run_cluster_script",
    "slurm_cluster",
    "slurm_cluster_two_nodes",
    "slurm_skip_reason",
]

if __name__ == "__main__":  # pragma: no cover - manual check
    print(slurm_skip_reason() or "local SLURM cluster can run here", file=sys.stderr)


# --------------------------------------------------------------------------- own instances


def _own_env(name: str, partition: str, node: str, port: int, directory: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.update(
        HVD_SLURM_DIR=directory,
        HVD_SLURM_CTLD_PORT=str(port),
        HVD_SLURM_PARTITION=partition,
        HVD_SLURM_CLUSTER_NAME=name,
        HVD_SLURM_NODE_NAME=node,
    )
    return env


def marked_processes(directory: str) -> list[int]:
    """PIDs of the daemons that slurm-cluster.sh started for ``directory``."""
    mark = f"HVD_SLURM_MARK={directory}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@contextlib.contextmanager
def own_cluster(
    name: str, partition: str, node: str, port: int, directory: str, up: tuple[str, ...] = ()
) -> Iterator[dict[str, str]]:
    """A SLURM instance of its own beside the shared test cluster (its own directory,
    ports ``port``/``port + 1``, cluster, partition and node name; ``up``: more arguments
    of ``slurm-cluster.sh up``, e.g. two nodes): what a cluster with its own Slurm looks
    like, and, in a directory under /tmp, reachable by other users wherever the checkout
    lies. Yields its client environment (SLURM_CONF, ...); stopped and removed
    afterwards, with no daemon left."""

    def script(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), *args],
            env=_own_env(name, partition, node, port, directory),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check:
            out = proc.stdout + proc.stderr
            assert proc.returncode == 0, f"{name}: slurm-cluster.sh {args}: {out}"
        return proc

    script("down", check=False)
    shutil.rmtree(directory, ignore_errors=True)
    try:
        script("up", *up)
        env = _own_env(name, partition, node, port, directory)
        for line in script("env").stdout.splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = value.strip("'\"")
        yield env
    finally:
        script("down", check=False)
    assert marked_processes(directory) == [], f"{name}: processes left after down"
    shutil.rmtree(directory, ignore_errors=True)
