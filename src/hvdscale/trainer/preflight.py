"""One rank of a partition's preflight (``hvdscale preflight-rank``, started by
``hvdscale preflight`` through the study's launcher, like a training run's ranks).

The rank imports its framework (TensorFlow + horovod.tensorflow, or torch +
torch.distributed), joins the job, says which GPUs it sees (the framework's list, NVML's
names where nvidia-ml-py is installed, CUDA_VISIBLE_DEVICES as SLURM bound it) and
completes an allreduce of the gradient's size (``GRADIENT_ELEMENTS`` float32; Horovod's
with the measurement code of ``hvdscale measure-allreduce``), then writes
OUT_DIR/rank-N.json. A rank that cannot import its framework writes the error there and
exits 3. The judging is the launcher's (hvdscale.launch.preflight).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from hvdscale.io import write_json_atomic
from hvdscale.matrix.backends import DEFAULT_FRAMEWORK
from hvdscale.slurm.preflight import GRADIENT_ELEMENTS
from hvdscale.trainer.placement import cuda_visible_devices
from hvdscale.trainer.worker import launcher_rank_env

EXIT_IMPORT = 3
#: what each framework's ranks import (the train env must have all of it)
FRAMEWORK_IMPORTS = {
    DEFAULT_FRAMEWORK: ("tensorflow", "horovod.tensorflow"),
    "torch-ddp": ("torch", "torch.distributed"),
}


def node_name() -> str:
    """The SLURM node this rank runs on (slurmd's name), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def nvml_gpus() -> dict:
    """NVML's view of this node's GPUs (names), or the reason there is none."""
    try:
        import pynvml  # reason: nvidia-ml-py, optional (GPU train envs)
    except ImportError:
        return {"error": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        pynvml.nvmlShutdown()
        return {"names": names}
    except Exception as exc:  # NVML missing (no driver): a fact to report, not a crash
        return {"error": f"NVML: {exc}"}


def _imports(framework: str) -> tuple[dict, str | None]:
    """(versions, None) after importing the framework's modules, or ({}, the error)."""
    versions = {}
    for name in FRAMEWORK_IMPORTS[framework]:
        try:
            module = __import__(name, fromlist=["_"])
        except Exception as exc:  # ImportError, or a library that fails to load
            return versions, f"cannot import {name}: {type(exc).__name__}: {exc}"
        top = sys.modules[name.split(".")[0]]
        versions[name.split(".")[0]] = getattr(top, "__version__", "?")
        del module
    return versions, None


def _horovod(backend: str) -> dict:
    """Join Horovod, pin one GPU per local rank (as measure-allreduce), allreduce."""
    from hvdscale.trainer.horovod_tf import allreduce as ar  # reason: imports TensorFlow
    from hvdscale.trainer.worker import WorkerInfo

    worker = WorkerInfo.init()  # HVD: hvd.init() first
    import tensorflow as tf  # reason: TensorFlow lives in the train env only

    gpus = tf.config.list_physical_devices("GPU")
    names = []
    for g in gpus:
        try:
            names.append(tf.config.experimental.get_device_details(g).get("device_name", g.name))
        except Exception:  # details are best effort
            names.append(g.name)
    if gpus:
        tf.config.set_visible_devices(gpus[worker.local_rank % len(gpus)], "GPU")  # HVD:
    sweep = ar.Sweep(
        out="",
        partition="",
        backend=backend,
        nodes=None,
        sizes=[4 * GRADIENT_ELEMENTS],
        iterations=3,
        warmup_iterations=1,
    )
    t0 = time.perf_counter()
    try:
        _, slowest = ar.time_allreduce(
            tf, worker, "/GPU:0" if gpus else "/CPU:0", 4 * GRADIENT_ELEMENTS, sweep
        )
        result = {"ok": True, "seconds": float(min(slowest))}
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["wall_s"] = time.perf_counter() - t0
    return {
        "rank": worker.rank,
        "size": worker.size,
        "local_rank": worker.local_rank,
        "gpus_listed": names,
        "allreduce": result,
    }


def _torch(backend: str) -> dict:
    """Join torch.distributed (nccl: on this local rank's GPU), allreduce."""
    import torch  # reason: torch lives in the train env only

    from hvdscale.trainer.torch_ddp.dist import TorchWorker, torch_rank_env

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [torch.cuda.get_device_name(i) for i in range(n)]
    local = torch_rank_env()["local_rank"]
    device = torch.device(f"cuda:{local % n}") if (backend == "nccl" and n) else None
    worker = TorchWorker.init(backend=backend, device=device)
    t0 = time.perf_counter()
    try:
        x = torch.ones(GRADIENT_ELEMENTS, dtype=torch.float32, device=device)
        times = []
        for _ in range(4):
            worker.barrier()
            t = time.perf_counter()
            y = x.clone()
            worker.dist.all_reduce(y)
            value = float(y[0].item())
            times.append(time.perf_counter() - t)
        if abs(value - worker.size) > 1e-3 * worker.size:
            raise RuntimeError(f"allreduce returned {value}, expected {worker.size}")
        result = {"ok": True, "seconds": min(times[1:])}
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["wall_s"] = time.perf_counter() - t0
    out = {
        "rank": worker.rank,
        "size": worker.size,
        "local_rank": worker.local_rank,
        "gpus_listed": names,
        "allreduce": result,
    }
    worker.shutdown()
    return out


def check_rank(framework: str, backend: str) -> tuple[dict, int]:
    """(this rank's report, exit status)."""
    report = {
        **launcher_rank_env(),
        "node": node_name(),
        "framework": framework,
        "backend": backend,
        "cuda_visible_devices": cuda_visible_devices(),
        "python": sys.executable,
    }
    versions, error = _imports(framework)
    report["versions"] = versions
    if error:
        report["import_error"] = error
        return report, EXIT_IMPORT
    report.update(_horovod(backend) if framework == DEFAULT_FRAMEWORK else _torch(backend))
    report["nvml"] = nvml_gpus()
    return report, 0 if report["allreduce"]["ok"] else 1


# -------------------------------------------------- the command: hvdscale preflight-rank


def add_arguments(p):
    p.add_argument("--framework", default=DEFAULT_FRAMEWORK, choices=sorted(FRAMEWORK_IMPORTS))
    p.add_argument("--backend", required=True, help="the collective backend (mpi, gloo, nccl)")
    p.add_argument("--out-dir", required=True, help="directory for this rank's rank-N.json")


def run(args) -> int:
    """One rank of a partition's preflight: import the framework, join the job, list the
    GPUs this rank sees and complete an allreduce of the gradient's size (153,441 float32);
    writes OUT_DIR/rank-N.json. Started by `hvdscale preflight`, not by hand."""
    report, status = check_rank(args.framework, args.backend)
    write_json_atomic(Path(args.out_dir) / f"rank-{report['rank']}.json", report)
    if status == EXIT_IMPORT:
        print(f"hvdscale preflight-rank: {report['import_error']}", file=sys.stderr, flush=True)
    return status
