"""Where a torch-ddp rank computes: ``cuda:{LOCAL_RANK}`` with the ``nccl`` backend (one
GPU per rank, the Horovod trainer's pinning), the CPU with ``gloo``; and the device
helpers the steps need (``synchronize`` at timing boundaries, the record's device name).

``choose_device`` is a pure function of the backend, the local rank and what torch finds
(``CudaFacts``: a CUDA build, the number of visible GPUs) that returns the device's name
(``torch.device(name)``), so that it and its errors are tested on a CPU without torch;
torch is imported only by the helpers that need it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdscale.errors import UserError


@dataclass(frozen=True)
class CudaFacts:
    """What this process's torch can use: its version, whether it is a CUDA build with a
    driver (``torch.cuda.is_available()``) and how many GPUs it sees."""

    torch_version: str
    available: bool
    count: int

    @classmethod
    def probe(cls) -> CudaFacts:
        import torch  # reason: the train env only

        available = bool(torch.cuda.is_available())
        return cls(torch.__version__, available, torch.cuda.device_count() if available else 0)


def choose_device(backend: str, local_rank: int, run_id: str, cuda: CudaFacts) -> str:
    """``cuda:{local_rank}`` for ``nccl``, ``cpu`` for ``gloo``; a UserError naming the run,
    the backend and what was found when nccl has no GPU for this rank."""
    if backend == "gloo":
        return "cpu"
    if backend != "nccl":
        raise UserError(f"run {run_id}: torch-ddp backend {backend!r}; expected gloo or nccl")
    if not cuda.available or cuda.count <= local_rank:
        raise UserError(
            f"run {run_id}: backend nccl needs a CUDA build of torch and a GPU per rank "
            f"(local rank {local_rank} uses GPU {local_rank}); found torch "
            f"{cuda.torch_version}, {cuda.count} GPU{'s' if cuda.count != 1 else ''}"
            + ("" if cuda.available else " (torch.cuda.is_available() is False)")
            + "; run gloo on CPU partitions (scaling.sweeps[].backends)"
        )
    return f"cuda:{local_rank}"


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


def device_label(device) -> str:
    """The record's name of the device (a torch.device), as the Horovod trainer writes it:
    ``GPU:{index} ({name})`` or ``CPU:0`` (``labelproof`` counts GPU vs CPU by the prefix)."""
    if device.type == "cuda":
        import torch  # reason: the train env only

        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"GPU:{index} ({torch.cuda.get_device_name(index)})"
    return "CPU:0"
