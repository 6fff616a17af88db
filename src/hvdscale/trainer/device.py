"""Where this rank runs: its local rank (from the launcher's environment), its CPU cores,
and its TensorFlow device. All of it happens before any TensorFlow op runs."""

from __future__ import annotations

import os

from hvdscale.errors import UserError
from hvdscale.trainer.worker import WorkerInfo


def local_rank_and_size() -> tuple[int, int]:
    """This process's local rank and the number of ranks on its node, from the launcher's
    environment (before hvd.init(); 0, 1 when started directly)."""
    env = os.environ
    for rk, sk in (
        ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    ):
        if rk in env and sk in env:
            try:
                return int(env[rk]), int(env[sk].split("(")[0].split(",")[0])
            except ValueError:
                continue
    return 0, 1


def bind_cpus(
    policy: str, local_rank: int | None = None, local_size: int | None = None
) -> list[int] | None:
    """Pin this rank (and every thread it starts later: TensorFlow's pools, Horovod's
    background thread, the MPI/Gloo progress threads) to its own share of the node's cores.

    ``core``: the cores this process may use are cut into ``local_size`` equal consecutive
    groups and the rank takes group ``local_rank`` (with more ranks than cores, core
    local_rank mod cores). A rank that the launcher already bound (its allowed cores are
    fewer than the node's) is left as it is. ``none``: leave placement to the OS. ``auto``:
    ``core`` when the node runs more than one rank and at least one core per rank, else
    ``none``. Must run before hvd.init() and before any TensorFlow op (threads inherit the
    mask). Returns the cores bound to, or None when not bound.
    """
    if policy not in ("auto", "none", "core"):
        raise UserError(
            f"config key training.cpu_binding: got {policy!r}; expected auto, none or core"
        )
    if policy == "none" or not hasattr(os, "sched_setaffinity"):
        return None
    lr, ls = local_rank_and_size()
    lr = lr if local_rank is None else local_rank
    ls = ls if local_size is None else local_size
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < (os.cpu_count() or len(cores)):
        # the launcher already bound this rank (srun --cpu-bind, mpirun --bind-to): keep it
        return None
    if policy == "auto" and not (1 < ls <= len(cores)):
        return None
    if ls <= len(cores):
        k = len(cores) // max(ls, 1)
        mine = cores[lr * k : (lr + 1) * k]
    else:
        mine = [cores[lr % len(cores)]]
    if not mine:
        return None
    os.sched_setaffinity(0, mine)
    return mine


def pin_device(worker: WorkerInfo, threads: int) -> tuple[str, str]:
    """One device per local rank; thread pools sized before any TensorFlow op runs.

    Returns (TF device string, description for the record).
    """
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if worker.local_rank >= len(gpus):
            raise UserError(
                f"rank {worker.rank}: local rank {worker.local_rank} but only {len(gpus)} GPU(s) "
                "on this node; start one worker per GPU"
            )
        gpu = gpus[worker.local_rank]  # HVD: one GPU per local rank
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")  # HVD: pin the rank to its GPU
        try:
            name = tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
        except Exception:
            name = "GPU"
        return "/GPU:0", f"GPU:{worker.local_rank} ({name})"
    tf.config.set_visible_devices([], "GPU")
    return "/CPU:0", f"CPU ({threads} thread{'s' if threads > 1 else ''})"
