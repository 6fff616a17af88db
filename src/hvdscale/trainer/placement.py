"""Where this rank runs (its placement): its local rank (from the launcher's
environment), its CPU cores, and its TensorFlow device. All of it happens before any
TensorFlow op runs.

``gpu_for_rank`` (which visible GPU a rank uses), ``visible_gpu_id`` and ``gpu_label`` (the
record's name of it) are pure and framework-free: the torch-ddp trainer's device choice
(``trainer.torch_ddp.device``) uses them too, and so does ``GpuDemand``, which stops a rank
of a GPU partition that would compute on the CPU before its first step (whatever the
framework and backend), unless the partition declares its GPUs emulated
(``scaling.partitions.<name>.emulated_gpus``, a test cluster's)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hvdscale.errors import UserError
from hvdscale.record.labelproof import compact_cores, visible_ids
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


def affinity() -> str:
    """The cores this process may run on now (after ``bind_cpus``), as ``compact_cores``
    writes them; ``""`` where the platform cannot tell (no ``os.sched_getaffinity``)."""
    if not hasattr(os, "sched_getaffinity"):
        return ""
    return compact_cores(os.sched_getaffinity(0))


def cuda_visible_devices(env: Mapping[str, str] | None = None) -> str | None:
    """The CUDA_VISIBLE_DEVICES value this rank started with, as its launcher set it (srun
    --gpus-per-task=1 or --gpu-bind=single:1: the one GPU id SLURM bound to the task;
    ``scaling.partitions.<name>.gpu_bind``); None when unset. The run record keeps it per
    rank (``environment.visible_gpus``) even where no framework can use a GPU, and the
    label proof compares the bound ids of a host's ranks."""
    return (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")


def gpu_for_rank(
    local_rank: int,
    local_size: int | None,
    n_visible: int,
    rank: int | None,
    visible: str | None = None,
) -> int | None:
    """The index, among the GPUs this process sees, of the one this rank uses; None for the
    CPU (no GPU visible).

    ``n_visible``: how many GPUs the framework lists; ``visible``: the CUDA_VISIBLE_DEVICES
    value (None when unset); ``local_size`` and ``rank`` only name the rank in the error
    (None: not known). Several visible: GPU ``local_rank`` (one GPU per local rank,
    the Horovod convention). Exactly one visible and CUDA_VISIBLE_DEVICES names exactly one
    id (SLURM's ``--gpus-per-task=1`` or ``--gpu-bind=single:1`` bound that GPU to this
    task): that GPU, whatever the local rank. A UserError when the rank has no GPU of its
    own: more local ranks than visible GPUs, or a local rank above 0 that sees one GPU not
    bound to it alone (CUDA_VISIBLE_DEVICES unset or naming several ids: the node's local
    ranks would share it).
    """
    if n_visible <= 0:
        return None
    if local_rank < n_visible:
        return local_rank
    if n_visible == 1 and len(visible_ids(visible)) == 1:
        return 0
    who = "this rank" if rank is None else f"rank {rank}"
    of = "" if local_size is None else f" of {local_size}"
    cvd = "CUDA_VISIBLE_DEVICES unset" if visible is None else f"CUDA_VISIBLE_DEVICES={visible}"
    found = (
        f"{who} (local rank {local_rank}{of} on its node) sees {n_visible} "
        f"GPU{'s' if n_visible != 1 else ''} ({cvd})"
    )
    if n_visible == 1:
        problem = "it would share that GPU with local rank 0"
    else:
        problem = f"one GPU per local rank needs GPU {local_rank}, which it does not see"
    raise UserError(
        f"{found}: {problem}; start one worker per GPU (at most {n_visible} per node), or "
        "give each task its own GPU (srun --gpus-per-task=1 or --gpu-bind=single:1)"
    )


#: how a rank of a GPU partition gets its GPU: the three things a CPU rank there lacks
GPU_FIX = (
    "build the GPU train env (make setup-gpu, or HVD_GPU=1 scripts/setup.sh, on a machine "
    "with the cluster's CUDA) and train with it, load the CUDA module it was built with "
    "(config key environment.modules or your --sdm env-modules list), and request the "
    "partition's GPUs (scaling.partitions.{partition}.gpus_per_node, with your site's GPU "
    "gres); or run the sweep on a partition with gpus_per_node 0"
)


def framework_sees(
    framework: str, n_visible: int, cuda_build: bool, build_probe: str, visible: str | None
) -> str:
    """What a framework reports about its GPUs, for ``GpuDemand``'s error: how many it
    lists, whether it is a CPU-only build (``build_probe``: the expression that says so,
    e.g. ``tf.test.is_built_with_cuda() is False``) and the CUDA_VISIBLE_DEVICES value."""
    listed = f"{n_visible} GPU{'s' if n_visible != 1 else ''}" if n_visible else "no GPU"
    build = (
        f"a CPU-only build ({build_probe})"
        if not cuda_build
        else "a CUDA build that finds no usable GPU (no driver, or no GPU given to this task)"
    )
    cvd = "CUDA_VISIBLE_DEVICES unset" if visible is None else f"CUDA_VISIBLE_DEVICES={visible!r}"
    return f"{framework} lists {listed}: {build}; {cvd}"


@dataclass(frozen=True)
class GpuDemand:
    """What a run's partition asks of every rank's device. A partition with GPUs
    (``gpus_per_node`` > 0) trains on them: a rank there that would compute on the CPU
    stops before its first step (``check``), whatever the framework and backend. The one
    exception is a partition whose config declares its GPUs emulated
    (``scaling.partitions.<name>.emulated_gpus: true``: a test cluster that announces GPUs
    to SLURM but has none); its ranks train on the CPU and the record says so."""

    partition: str
    gpus_per_node: int
    emulated: bool = False
    run_id: str = ""

    @classmethod
    def of(cls, cfg: dict, run_) -> GpuDemand:
        """The demand of run ``run_`` (a matrix Run) under ``cfg`` (its partition section)."""
        part = cfg["scaling"]["partitions"][run_.partition]
        return cls(
            run_.partition,
            int(part.get("gpus_per_node") or 0),
            bool(part.get("emulated_gpus", False)),
            run_.run_id,
        )

    @property
    def gpu_partition(self) -> bool:
        """The partition has GPUs (real or emulated)."""
        return self.gpus_per_node > 0

    @property
    def needs_gpu(self) -> bool:
        """A rank must compute on a GPU: a GPU partition whose GPUs are not emulated."""
        return self.gpu_partition and not self.emulated

    def check(self, on_gpu: bool, *, rank: int | None, host: str, sees: str) -> None:
        """A UserError when this rank would compute on the CPU (``on_gpu`` false) where a
        GPU is needed, naming the run, the rank, the host, what the framework sees
        (``framework_sees``) and the fix."""
        if on_gpu or not self.needs_gpu:
            return
        who = "this rank" if rank is None else f"rank {rank}"
        run = f"run {self.run_id}: " if self.run_id else ""
        raise UserError(
            f"{run}{who} on host {host} would train on the CPU, but partition "
            f"{self.partition!r} has {self.gpus_per_node} GPU"
            f"{'s' if self.gpus_per_node != 1 else ''} per node; stopped before the first "
            f"step. The framework sees: {sees}. To fix: " + GPU_FIX.format(partition=self.partition)
        )


def visible_gpu_id(index: int, env: Mapping[str, str]) -> str:
    """The id of visible GPU ``index`` as the node knows it: entry ``index`` of
    CUDA_VISIBLE_DEVICES (an ordinal, a UUID or a MIG id) when that is set, else the index."""
    ids = visible_ids(env.get("CUDA_VISIBLE_DEVICES"))
    return ids[index] if index < len(ids) else str(index)


def gpu_label(index: int, name: str, env: Mapping[str, str]) -> str:
    """The record's name of visible GPU ``index`` (``environment.devices``):
    ``GPU:{id} ({name})`` with ``id`` the node's (``visible_gpu_id``), and the
    CUDA_VISIBLE_DEVICES value before the name when it is set, e.g.
    ``GPU:3 (CUDA_VISIBLE_DEVICES=3; NVIDIA A100-SXM4-40GB)``."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    detail = name if value is None else f"CUDA_VISIBLE_DEVICES={value}; {name}"
    return f"GPU:{visible_gpu_id(index, env)} ({detail})"


def pin_device(
    worker: WorkerInfo, threads: int, demand: GpuDemand | None = None
) -> tuple[str, str]:
    """One device per rank (``gpu_for_rank``); thread pools sized before any TensorFlow
    op runs. A rank of a GPU partition (``demand``) that finds no GPU stops here
    (``GpuDemand.check``); without ``demand`` (a benchmark) the CPU is taken silently.

    Returns (TF device string, description for the record).
    """
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    gpus = tf.config.list_physical_devices("GPU")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    index = gpu_for_rank(worker.local_rank, worker.local_size, len(gpus), worker.rank, visible)
    if demand is not None:
        sees = framework_sees(
            f"TensorFlow {tf.__version__}",
            len(gpus),
            tf.test.is_built_with_cuda(),
            "tf.test.is_built_with_cuda() is False",
            visible,
        )
        demand.check(index is not None, rank=worker.rank, host=worker.hostname, sees=sees)
    if index is not None:
        gpu = gpus[index]  # HVD: one GPU per rank
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")  # HVD: pin the rank to its GPU
        try:
            name = tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
        except Exception:
            name = "GPU"
        return "/GPU:0", gpu_label(index, name, os.environ)
    tf.config.set_visible_devices([], "GPU")
    return "/CPU:0", f"CPU ({threads} thread{'s' if threads > 1 else ''})"
