"""The run record's ``environment`` block (versions of Python, TensorFlow, Horovod, MPI,
the git commit, the config hash, SLURM's job and nodes, the loaded modules) and the
Horovod variables of its config. No TensorFlow or Horovod import: the caller passes
their versions.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from hvdscale.project import git_commit


def mpi_version() -> str:
    """First line of ``mpirun --version``, or "none"."""
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return "none"
    lines = [ln.strip() for ln in (out.stdout or out.stderr).splitlines() if ln.strip()]
    return lines[0] if out.returncode == 0 and lines else "none"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def environment_block(
    *,
    config_hash: str,
    hostnames: list[str],
    devices: list[str],
    tensorflow: str,
    horovod: str,
    started_utc: str,
    cores: list[str] | None = None,
    visible_gpus: list[str | None] | None = None,
) -> dict:
    """The record's ``environment``; ``cores`` (each rank's CPU affinity as
    ``record.labelproof.compact_cores`` writes it, rank order) and ``visible_gpus`` (each
    rank's CUDA_VISIBLE_DEVICES, None where unset) only when given,
    ``modules`` (:func:`loaded_modules`) only under a module system."""
    import numpy

    env = {
        "hostnames": list(hostnames),
        "python": platform.python_version(),
        "tensorflow": tensorflow,
        "horovod": horovod,
        "mpi": mpi_version(),
        "numpy": numpy.__version__,
        "git_commit": git_commit(),
        "config_hash": config_hash,
        "started_utc": started_utc,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        # issue 12: HVDSCALE_SLURM_NODELIST from hvdscale launch when the plugin's job
        # step stripped SLURM_JOB_NODELIST (ranks not started by srun)
        "slurm_nodelist": os.environ.get("SLURM_JOB_NODELIST")
        or os.environ.get("HVDSCALE_SLURM_NODELIST"),
        "devices": list(devices),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
    }
    if cores is not None:
        env["cores"] = list(cores)
    if visible_gpus is not None:
        # issue 29: each rank's CUDA_VISIBLE_DEVICES as the launcher (SLURM) set it
        env["visible_gpus"] = list(visible_gpus)
    modules = loaded_modules()
    if modules is not None:
        env["modules"] = modules
    return env


def loaded_modules(environ=None) -> list[str] | None:
    """The environment modules loaded where this process runs (LOADEDMODULES, set by Lmod
    and Environment Modules: colon-separated full names), or None without a module
    system (the variable unset)."""
    environ = os.environ if environ is None else environ
    value = environ.get("LOADEDMODULES")
    return None if value is None else [m for m in value.split(":") if m]


_HOROVOD_ENV_SKIP = (
    "HOROVOD_GLOO_RENDEZVOUS",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_",
    "HOROVOD_CROSS_",
    "HOROVOD_HOSTNAME",
)


def horovod_env(environ=None) -> dict:
    """The HOROVOD_* settings of this process (cycle time, timeline, operations, ...)."""
    environ = os.environ if environ is None else environ
    return {
        k: v
        for k, v in sorted(environ.items())
        if k.startswith("HOROVOD_") and not k.startswith(_HOROVOD_ENV_SKIP)
    }
