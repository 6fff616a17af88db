"""Who am I in a torch.distributed job: ``TorchWorker`` is ``hvdscale.trainer.worker.WorkerInfo``
with its book-keeping collectives (metric sums, gathering hosts, broadcasting the resume
state, barriers) done by ``torch.distributed`` instead of Horovod, so that the framework-
free parts of the Horovod trainer (data planning, the epoch loop, checkpoints, time
limits, the run record) run unchanged on it.

torchrun (and, in phase 2, srun) announce the rank in RANK / WORLD_SIZE / LOCAL_RANK /
LOCAL_WORLD_SIZE and the rendezvous in MASTER_ADDR / MASTER_PORT (``env://``). Started
without them, the process is a one-rank job on a private TCP store (so that DDP and
``get_backend()`` work the same for one rank).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from hvdscale.trainer.worker import WorkerInfo

#: how long a collective may wait for a missing rank before it raises (a killed rank is
#: noticed by torchrun much sooner; this is the bound for a hung one)
COLLECTIVE_TIMEOUT_S = 300


def torch_rank_env() -> dict:
    """Rank, size and local rank/size from torchrun's environment (0, 1, 0, 1 without)."""
    env = os.environ
    return {
        "rank": int(env.get("RANK", 0)),
        "size": int(env.get("WORLD_SIZE", 1)),
        "local_rank": int(env.get("LOCAL_RANK", 0)),
        "local_size": int(env.get("LOCAL_WORLD_SIZE", 1)),
    }


def detect_torch_launcher() -> str:
    """``torchrun`` when torch's elastic agent started this process, else ``srun`` when
    SLURM did, else ``direct``."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    if "SLURM_PROCID" in os.environ and "SLURM_STEP_ID" in os.environ:
        return "srun"
    return "direct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TorchWorker(WorkerInfo):
    """A rank of a torch.distributed process group (``dist`` is the module)."""

    dist: Any = None
    backend: str = "gloo"
    device: Any = None  # torch.device of this rank (cuda:LOCAL_RANK with nccl), None: CPU

    @property
    def distributed(self) -> bool:
        return self.dist is not None and self.size > 1

    @classmethod
    def init(cls, backend: str = "gloo", device=None) -> TorchWorker:  # type: ignore[override]
        """Join (or, started directly, create) the process group with ``backend``; with a
        CUDA ``device`` (``device.choose_device``) it becomes the current device first."""
        import torch.distributed as dist  # reason: torch lives in the train env only

        from hvdscale.trainer.torch_ddp.device import bind_device  # reason: imports torch

        if device is not None:
            bind_device(device)
        r = torch_rank_env()
        timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        if "MASTER_ADDR" in os.environ and "RANK" in os.environ:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://127.0.0.1:{_free_port()}",
                rank=0,
                world_size=1,
                timeout=timeout,
            )
        return cls(
            rank=dist.get_rank(),
            size=dist.get_world_size(),
            local_rank=r["local_rank"],
            local_size=r["local_size"],
            controller=str(dist.get_backend()),
            dist=dist,
            backend=str(dist.get_backend()),
            device=device,
        )

    # ------------------------------------------------------------------ collectives

    def allreduce(self, values, op: str = "average", name: str | None = None) -> np.ndarray:
        """Average (or sum, min, max) a small float64 vector over all ranks."""
        arr = np.asarray(values, dtype=np.float64)
        if not self.distributed:
            return arr.copy()
        import torch  # reason: torch lives in the train env only

        ops = {"sum": self.dist.ReduceOp.SUM, "average": self.dist.ReduceOp.SUM}
        ops.update(min=self.dist.ReduceOp.MIN, max=self.dist.ReduceOp.MAX)
        t = torch.from_numpy(arr.copy())
        if self.device is not None:  # nccl reduces device tensors only
            t = t.to(self.device)
        self.dist.all_reduce(t, op=ops[op])
        out = t.cpu().numpy().astype(np.float64)
        return out / self.size if op == "average" else out

    def allgather_object(self, obj, name: str | None = None) -> list:
        if not self.distributed:
            return [obj]
        out: list = [None] * self.size
        self.dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj, root_rank: int = 0, name: str | None = None):
        if not self.distributed:
            return obj
        box = [obj]
        self.dist.broadcast_object_list(box, src=root_rank)
        return box[0]

    def barrier(self, name: str = "barrier") -> None:
        if self.distributed:
            on_gpu = self.device is not None and self.device.type == "cuda"
            # nccl: the barrier's dummy allreduce on this rank's GPU, not a guessed one
            self.dist.barrier(device_ids=[self.device.index] if on_gpu else None)

    def shutdown(self) -> None:
        """Wait for every rank, then leave the process group (every rank, at the end;
        nothing that holds the group, such as DDP, may outlive it)."""
        if self.dist is not None and self.dist.is_initialized():
            self.barrier(name="shutdown")
            self.dist.destroy_process_group()
