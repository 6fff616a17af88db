"""A description of the machine: CPU model, cores, memory, GPUs (model, driver, via
nvidia-smi where present), MPI implementation, network interfaces, kernel, host name.

Used by ``hvdscale export`` (system.json in the archive: the machine the study was
exported on) and meant for the run records: rank 0 can put ``collect_system()`` into an
optional ``system`` field of metrics.json (see docs/study.md; not wired into training on
this branch). Standard library only, so both environments can import it.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_mb() -> int | None:
    m = re.search(r"MemTotal:\s+(\d+) kB", _read("/proc/meminfo"))
    return int(m.group(1)) // 1024 if m else None


def _run(cmd: list[str]) -> str:
    if shutil.which(cmd[0]) is None:
        return ""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _gpus() -> list[dict]:
    out = _run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    )
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"model": parts[0], "driver": parts[1], "memory": parts[2]})
    return gpus


def _mpi() -> str:
    first = _run(["mpirun", "--version"]).splitlines()
    return first[0] if first else ""


def _interfaces() -> list[str]:
    """Network interfaces that are up (InfiniBand devices included), loopback excluded."""
    names = []
    for d in sorted(Path("/sys/class/net").glob("*")):
        if d.name == "lo":
            continue
        if _read(str(d / "operstate")).strip() in ("up", "unknown"):
            names.append(d.name)
    names += [f"ib:{d.name}" for d in sorted(Path("/sys/class/infiniband").glob("*"))]
    return names


def collect_system() -> dict:
    """The description (keys stable, values strings/numbers/lists; missing: '' or [])."""
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_mb": _memory_mb(),
        "gpus": _gpus(),
        "mpi": _mpi(),
        "interfaces": _interfaces(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def add_arguments(p):
    p.add_argument("--out", help="write JSON here (default: print)")


def run(args) -> int:
    import json

    text = json.dumps(collect_system(), indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0
