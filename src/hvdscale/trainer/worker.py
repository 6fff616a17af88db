"""Who am I in the job: a small worker-info object that works with and without Horovod.

In the style of MLCommons HPC CosmoFlow's ``DistEnv``: the training code asks this
object for its rank, the number of workers and the collectives it needs for
book-keeping (metric averages, gathering host names, broadcasting the resume state)
and never imports Horovod itself for that. Without Horovod (``use_horovod=False``, or
Horovod not installed) it is a single worker and every collective is the identity, so
the same training code runs as a plain one-process script.

Every Horovod call in this module is marked ``# HVD:``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def launcher_rank_env() -> dict:
    """Rank/size as the launcher announced them in the environment (before hvd.init()).

    horovodrun sets HOROVOD_RANK/HOROVOD_SIZE, Open MPI OMPI_COMM_WORLD_*, SLURM's srun
    SLURM_PROCID/SLURM_NTASKS, PMIx PMIX_RANK. Used only for messages and per-rank files
    written before Horovod is up.
    """
    env = os.environ
    for rank_key, size_key, local_key in (
        ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ):
        if rank_key in env:
            return {
                "rank": int(env[rank_key]),
                "size": int(env.get(size_key, 1)),
                "local_rank": int(env.get(local_key, 0)),
            }
    return {"rank": 0, "size": 1, "local_rank": 0}


def detect_launcher() -> str:
    """Which launcher started this process: horovodrun, mpirun, srun or direct."""
    env = os.environ
    if env.get("HVDSCALE_LAUNCHER") in ("horovodrun", "mpirun", "srun"):
        return env["HVDSCALE_LAUNCHER"]
    if "HOROVOD_RANK" in env and "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env:
        return "horovodrun"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "mpirun"
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        return "srun"
    return "direct"


@dataclass
class WorkerInfo:
    """Rank, size and the few collectives the book-keeping needs."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    hostname: str = field(default_factory=socket.gethostname)
    hvd: Any = None  # the horovod.tensorflow module, or None without Horovod
    controller: str = "none"  # gloo | mpi | none

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.hvd is not None and self.size > 1

    # ------------------------------------------------------------------ construction

    @classmethod
    def init(cls, use_horovod: bool = True) -> WorkerInfo:
        """Initialise Horovod (if wanted and importable) and describe this worker.

        This must be the first thing a training process does (before any TensorFlow
        op), as in Horovod's TF2 examples: ``hvd.init()`` first, then device pinning.
        """
        if not use_horovod:
            return cls()
        try:
            import horovod.tensorflow as hvd  # HVD: the TF2 binding
        except ImportError:
            return cls()
        hvd.init()  # HVD: init first
        controller = (
            "gloo" if hvd.gloo_enabled() else ("mpi" if hvd.mpi_enabled() else "none")
        )  # HVD:
        return cls(
            rank=hvd.rank(),
            size=hvd.size(),
            local_rank=hvd.local_rank(),  # HVD:
            local_size=hvd.local_size(),
            hvd=hvd,
            controller=controller,
        )  # HVD:

    # ------------------------------------------------------------------ collectives

    def allreduce(self, values, op: str = "average", name: str | None = None) -> np.ndarray:
        """Average (or sum, min, max) a small float64 vector over all ranks."""
        arr = np.asarray(values, dtype=np.float64)
        if not self.distributed:
            return arr.copy()
        import tensorflow as tf

        hvd = self.hvd
        ops = {"average": hvd.Average, "sum": hvd.Sum, "min": hvd.Min, "max": hvd.Max}  # HVD:
        out = hvd.allreduce(tf.constant(arr), op=ops[op], name=name)  # HVD: metric reduction
        return np.asarray(out.numpy(), dtype=np.float64)

    def allgather_object(self, obj, name: str | None = None) -> list:
        """Every rank's ``obj``, in rank order (picklable objects)."""
        if not self.distributed:
            return [obj]
        return list(self.hvd.allgather_object(obj, name=name))  # HVD:

    def broadcast_object(self, obj, root_rank: int = 0, name: str | None = None):
        """Rank ``root_rank``'s ``obj`` on every rank."""
        if not self.distributed:
            return obj
        return self.hvd.broadcast_object(obj, root_rank=root_rank, name=name)  # HVD:

    def barrier(self, name: str = "barrier") -> None:
        """Wait for every rank (an allreduce of one number; Horovod 0.28 TF has no barrier)."""
        if self.distributed:
            self.allreduce([0.0], op="sum", name=name)

    def agree(self, error: str | None, name: str = "agree") -> list[tuple[int, str]]:
        """Gather an optional error message from every rank: [(rank, message), ...].

        Lets every rank stop together with the same clear message (instead of one rank
        exiting and the others waiting in the next collective).
        """
        errors = self.allgather_object(error, name=name)
        return [(r, e) for r, e in enumerate(errors) if e]

    def describe(self) -> str:
        return (
            f"rank {self.rank}/{self.size} (local {self.local_rank}/{self.local_size}) "
            f"on {self.hostname}"
        )
