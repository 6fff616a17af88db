"""A description of the machine: CPU model, cores, memory, GPUs (model, driver, memory),
CUDA, cuDNN and NCCL versions where present, MPI implementation and version, network
interfaces (with their addresses; NCCL_SOCKET_IFNAME), node names, kernel, host name.
"""

from __future__ import annotations

import ipaddress
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

# MPI implementations by a marker in the first line of `mpirun --version`
_MPI_NAMES = (
    ("open mpi", "Open MPI"),
    ("openrte", "Open MPI"),
    ("intel", "Intel MPI"),
    ("mvapich", "MVAPICH"),
    ("hydra", "MPICH"),
    ("mpich", "MPICH"),
)


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


def _run(cmd: list[str], *, both: bool = False) -> str:
    """stdout of ``cmd`` ('' when the program is missing or fails to start); ``both``:
    stderr where stdout is empty (some MPIs print their version there)."""
    if shutil.which(cmd[0]) is None:
        return ""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    text = out.stdout.strip()
    return text or (out.stderr.strip() if both else "")


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


def _cuda_driver() -> str:
    """The CUDA version the driver supports (nvidia-smi's header), or ''."""
    m = re.search(r"CUDA Version:\s*([0-9.]+)", _run(["nvidia-smi"]))
    return m.group(1) if m else ""


def _tf_build() -> dict:
    """CUDA and cuDNN versions TensorFlow was built with, if TensorFlow is imported."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return {}
    info = dict(tf.sysconfig.get_build_info())
    return {
        "cuda_build": str(info.get("cuda_version", "")),
        "cudnn": str(info.get("cudnn_version", "")),
    }


def _torch_build() -> dict:
    """CUDA, cuDNN and NCCL versions PyTorch was built with, if torch is imported (a
    torch-ddp rank; '' each on a CPU build)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    cuda = torch.version.cuda or ""
    out = {"cuda_build": str(cuda), "cudnn": "", "nccl": ""}
    if cuda and torch.cuda.is_available():
        out["cudnn"] = str(torch.backends.cudnn.version() or "")
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return out


def _cpu_vendor() -> str:
    m = re.search(r"^vendor_id\s*:\s*(\S+)", _read("/proc/cpuinfo"), re.M)
    return m.group(1) if m else ""


def _mkl_path(vendor: str) -> str:
    """MKL's code path as far as it can be told from outside: MKL dispatches by CPU vendor
    (since MKL 2020.1 MKL_DEBUG_CPU_TYPE no longer moves a non-Intel CPU onto the Intel
    path); an LD_PRELOADed library that answers MKL's vendor check (issue 32's measurement)
    is named as it is."""
    entries = re.split(r"[:\s]+", os.environ.get("LD_PRELOAD", ""))
    preload = [x for x in entries if "mkl" in os.path.basename(x).lower()]
    if preload:
        return f"vendor check overridden by LD_PRELOAD {' '.join(preload)}"
    if vendor == "GenuineIntel":
        return "Intel code path"
    return f"non-Intel code path ({vendor or 'CPU vendor unknown'})"


def cpu_kernels(torch_config: str | None = None, vendor: str | None = None) -> str:
    """Which CPU kernels the imported frameworks use for their matrix products (issue 32:
    TensorFlow's oneDNN switch; PyTorch's BLAS (MKL and its code path), oneDNN and ATen's
    CPU capability), '' when neither is imported. ``torch_config``/``vendor``: for tests
    (default: ``torch.__config__.show()`` and /proc/cpuinfo)."""
    vendor = _cpu_vendor() if vendor is None else vendor
    parts = []
    if sys.modules.get("tensorflow") is not None:
        from tensorflow.python.util import _pywrap_util_port as port  # TF's own switch

        flag = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
        parts.append(
            f"TensorFlow: oneDNN {'on' if port.IsMklEnabled() else 'off'} "
            f"(TF_ENABLE_ONEDNN_OPTS={flag if flag is not None else 'unset'})"
        )
    torch = sys.modules.get("torch")
    if torch is not None or torch_config is not None:
        show = torch.__config__.show() if torch_config is None else torch_config
        blas = re.search(r"BLAS_INFO=(\w+)", show)
        mkl = re.search(r"Math Kernel Library Version ([0-9.]+)", show)
        dnn = re.search(r"(?:MKL-DNN|oneDNN) v([0-9.]+)", show)
        cap = re.search(r"CPU capability usage: (\w+)", show)
        gemm = blas.group(1) if blas else "unknown BLAS"
        if gemm == "mkl":
            gemm = f"MKL {mkl.group(1) if mkl else '?'}, {_mkl_path(vendor)}"
        text = f"PyTorch: fp32 GEMM {gemm}"
        text += f"; oneDNN {dnn.group(1)}" if dnn else "; no oneDNN"
        text += f"; ATen CPU capability {cap.group(1)}" if cap else ""
        parts.append(text)
    return " | ".join(parts)


def _nccl_version(code: int) -> str:
    """Horovod's nccl_built() code (e.g. 21805 or 2805) as '2.18.5'."""
    if code >= 10000:  # NCCL >= 2.9: major*10000 + minor*100 + patch
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _horovod_build() -> dict:
    """Horovod's built-in controllers and NCCL, if horovod.tensorflow is imported."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return {}
    nccl = int(hvd.nccl_built() or 0)
    return {
        "horovod_mpi": bool(hvd.mpi_built()),
        "horovod_gloo": bool(hvd.gloo_built()),
        "nccl": _nccl_version(nccl) if nccl else "",
    }


def _mpi() -> dict:
    """{'mpi': first line of `mpirun --version`, 'mpi_implementation', 'mpi_version'}."""
    lines = [ln.strip() for ln in _run(["mpirun", "--version"], both=True).splitlines()]
    first = next((ln for ln in lines if ln), "")
    low = first.lower()
    impl = next((name for marker, name in _MPI_NAMES if marker in low), "")
    m = re.search(r"(\d+(?:\.\d+)+)", first)
    return {"mpi": first, "mpi_implementation": impl, "mpi_version": m.group(1) if m else ""}


def _ipv4(name: str) -> str:
    """The IPv4 address of interface ``name`` (SIOCGIFADDR), or ''."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            req = struct.pack("256s", name.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])
        except OSError:
            return ""


def _ipv6() -> dict[str, list[str]]:
    """Global IPv6 addresses per interface (/proc/net/if_inet6; link-local left out)."""
    out: dict[str, list[str]] = {}
    for line in _read("/proc/net/if_inet6").splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[3] == "00":  # scope global
            out.setdefault(parts[5], []).append(str(ipaddress.IPv6Address(int(parts[0], 16))))
    return out


def _interfaces() -> list[dict]:
    """Network interfaces that are up and have an address, loopback excluded, plus
    InfiniBand devices: [{'name', 'addresses'}] ('ib:mlx5_0' for an HCA)."""
    v6 = _ipv6()
    out = []
    for d in sorted(Path("/sys/class/net").glob("*")):
        if d.name == "lo" or _read(str(d / "operstate")).strip() not in ("up", "unknown"):
            continue
        addresses = [a for a in [_ipv4(d.name), *v6.get(d.name, [])] if a]
        if addresses:
            out.append({"name": d.name, "addresses": addresses})
    out += [
        {"name": f"ib:{d.name}", "addresses": []}
        for d in sorted(Path("/sys/class/infiniband").glob("*"))
    ]
    return out


def _probe(errors: dict, name: str, fn, default):
    try:
        return fn()
    except Exception as exc:  # a description must never crash its caller
        errors[name] = f"{type(exc).__name__}: {exc}"[:300]
        return default


def collect_system(nodes: list[str] | None = None) -> dict:
    """The description (keys stable, values strings/numbers/lists; missing: '' or []).

    ``nodes``: the run's host names (one per rank; stored sorted and unique), default
    this host. ``errors``: probe -> what failed (empty when every probe worked).
    """
    errors: dict[str, str] = {}
    host = _probe(errors, "hostname", socket.gethostname, "")
    info = {
        "hostname": host,
        "nodes": sorted(set(nodes or [host])),
        "cpu_model": _probe(errors, "cpu_model", _cpu_model, ""),
        "cores": _probe(errors, "cores", os.cpu_count, None),
        "memory_mb": _probe(errors, "memory_mb", _memory_mb, None),
        "gpus": _probe(errors, "gpus", _gpus, []),
        "cuda_driver": _probe(errors, "cuda_driver", _cuda_driver, ""),
        "cuda_build": "",
        "cudnn": "",
        "nccl": "",
        "mpi": "",
        "mpi_implementation": "",
        "mpi_version": "",
        "horovod_mpi": None,
        "horovod_gloo": None,
        "interfaces": _probe(errors, "interfaces", _interfaces, []),
        "nccl_socket_ifname": os.environ.get("NCCL_SOCKET_IFNAME", ""),
        "kernel": _probe(errors, "kernel", platform.release, ""),
        "os": _probe(errors, "os", platform.platform, ""),
        "python": platform.python_version(),
    }
    info.update(_probe(errors, "mpi", _mpi, {}))
    info.update(_probe(errors, "tensorflow", _tf_build, {}))
    info.update(_probe(errors, "horovod", _horovod_build, {}))
    for key, value in _probe(errors, "torch", _torch_build, {}).items():
        info[key] = info[key] or value  # TensorFlow's / Horovod's first where they are
    info["cpu_kernels"] = _probe(errors, "cpu_kernels", cpu_kernels, "")
    info["errors"] = errors
    return info


# -------------------------------------------------- the command: hvdscale describe-system


def add_arguments(p):
    p.add_argument("--out", help="write JSON here (default: print)")


def run(args) -> int:
    """A description of the machine: CPU model, cores, memory, GPUs (model, driver, memory),
    CUDA, cuDNN and NCCL versions where present, MPI implementation and version, network
    interfaces (with their addresses; NCCL_SOCKET_IFNAME), node names, kernel, host name.

    Used by ``hvdscale export`` (system.json in the archive: the machine the study was
    exported on) and by training: rank 0 puts ``collect_system(nodes=...)`` into the
    optional ``system`` object of metrics.json (``hvdscale.trainer.rank``), and aggregation
    tabulates it per partition (``hvdscale.analysis.systems``, results/scaling/systems.csv).

    Standard library only, so both environments can import it. Nothing here raises: a probe
    that fails leaves its field empty ('' or []) and names itself in ``errors``. TensorFlow
    and Horovod are only asked when the caller has already imported them (the training
    ranks), never imported here (seconds in the workflow env, and absent there).
    """
    import json

    text = json.dumps(collect_system(), indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0
