"""Where a torch-ddp rank computes: with the ``nccl`` backend, and with ``gloo`` on a
partition with GPUs, the GPU the Horovod trainer would pin (``trainer.placement.gpu_for_rank``:
``cuda:{LOCAL_RANK}`` when the rank sees several GPUs, ``cuda:0`` when SLURM bound one GPU
to the task); the CPU with ``gloo`` on a CPU partition (or one whose GPUs are emulated);
and the device helpers the steps need (``synchronize`` at timing boundaries, the record's
device name).

``choose_device`` is a pure function of the backend, the local rank, what torch finds
(``CudaFacts``: a CUDA build, the number of visible GPUs, CUDA_VISIBLE_DEVICES) and what
the partition asks (``trainer.placement.GpuDemand``) that returns the device's name
(``torch.device(name)``), so that it and its errors are tested on a CPU without torch;
torch is imported only by the helpers that need it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hvdscale.errors import UserError
from hvdscale.trainer.placement import GpuDemand, framework_sees, gpu_for_rank, gpu_label


@dataclass(frozen=True)
class CudaFacts:
    """What this process's torch can use: its version, whether it is a CUDA build with a
    driver (``torch.cuda.is_available()``), how many GPUs it sees and the
    CUDA_VISIBLE_DEVICES value that chose them (None when unset)."""

    torch_version: str
    available: bool
    count: int
    visible: str | None = None
    #: torch.version.cuda: the CUDA version torch was built with; None for a CPU-only build
    cuda_build: str | None = None

    @classmethod
    def probe(cls) -> CudaFacts:
        import torch  # reason: the train env only

        available = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if available else 0
        return cls(
            torch.__version__,
            available,
            count,
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            torch.version.cuda,
        )

    def sees(self) -> str:
        """What torch reports about its GPUs (``trainer.placement.framework_sees``)."""
        return framework_sees(
            f"torch {self.torch_version}",
            self.count if self.available else 0,
            self.cuda_build is not None,
            "torch.version.cuda is None",
            self.visible,
        )


def choose_device(
    backend: str,
    local_rank: int,
    run_id: str,
    cuda: CudaFacts,
    *,
    rank: int | None = None,
    local_size: int | None = None,
    demand: GpuDemand | None = None,
    host: str = "",
) -> str:
    """``cuda:{i}`` for ``nccl``, and for ``gloo`` on a partition with GPUs (``demand``;
    torch's Gloo reduces CUDA tensors through the host), with ``i`` from ``gpu_for_rank``
    (the local rank, or 0 when the rank sees the one GPU SLURM bound to it); ``cpu`` for
    ``gloo`` on a CPU partition or where the partition's GPUs are emulated and torch finds
    none. A UserError (``GpuDemand.check``: the run, the rank, ``host``, what torch sees,
    the fix) when a rank of a GPU partition finds no GPU; naming the run, the backend and
    what was found when nccl finds no GPU elsewhere; ``gpu_for_rank``'s (naming ``rank``
    when given) when the rank has no GPU of its own."""
    if backend not in ("gloo", "nccl"):
        raise UserError(f"run {run_id}: torch-ddp backend {backend!r}; expected gloo or nccl")
    gpu_partition = demand is not None and demand.gpu_partition
    if backend == "gloo" and not gpu_partition:
        return "cpu"
    usable = cuda.available and cuda.count >= 1
    if not usable and demand is not None:
        demand.check(False, rank=rank, host=host or "?", sees=cuda.sees())
    if not usable and backend == "gloo":
        return "cpu"  # a partition whose GPUs are emulated (GpuDemand.check let it pass)
    if not usable:
        raise UserError(
            f"run {run_id}: backend nccl needs a CUDA build of torch and a GPU per rank; "
            f"found torch {cuda.torch_version}, {cuda.count} GPU{'s' if cuda.count != 1 else ''}"
            + ("" if cuda.available else " (torch.cuda.is_available() is False)")
            + "; run gloo on CPU partitions (scaling.sweeps[].backends)"
        )
    try:
        index = gpu_for_rank(local_rank, local_size, cuda.count, rank, cuda.visible)
    except UserError as exc:
        raise UserError(f"run {run_id}: backend {backend}: {exc}") from None
    return f"cuda:{index}"


def bind_device(device) -> None:
    """Make ``device`` (a torch.device) this process's current CUDA device (before
    init_process_group, so that NCCL's communicator and the object collectives use this
    rank's GPU)."""
    if device.type == "cuda":
        import torch  # reason: the train env only

        torch.cuda.set_device(device)


def synchronizer(device):
    """A function that waits for the device's (a torch.device) queued work:
    ``torch.cuda.synchronize`` on a GPU, a no-op on the CPU (whose ops have finished when
    they return)."""
    if device.type == "cuda":
        import torch  # reason: the train env only

        return lambda: torch.cuda.synchronize(device)
    return _no_sync


def _no_sync() -> None:
    return None


def device_label(device, env: Mapping[str, str] | None = None) -> str:
    """The record's name of the device (a torch.device), as the Horovod trainer writes it
    (``trainer.placement.gpu_label``: ``GPU:{id} ({name})`` with the node's id of the GPU, from
    CUDA_VISIBLE_DEVICES in ``env``, this process's environment by default) or ``CPU:0``
    (``labelproof`` counts GPU vs CPU by the prefix)."""
    if device.type == "cuda":
        import torch  # reason: the train env only

        index = device.index if device.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        return gpu_label(index, name, os.environ if env is None else env)
    return "CPU:0"
