"""One home for the training frameworks, their collective backends and the partition kinds.

A backend belongs to a framework (``horovod-tf``, the default, or ``torch-ddp``); the
registry's key is (framework, name). Every fact about a backend lives in its ``Backend``
entry of ``REGISTRY``: the token in run ids (its name), the Horovod variables that
choose its collectives, the controller each launcher gives it (a launcher it lacks
cannot start it), whether it needs GPUs, what proves its label (the Horovod timeline
activity, or torch.distributed's process-group backend), and its plot style and order.
The run-id patterns (hvdscale.matrix.runtable, hvdscale.project), the launch specs, the label
proof, the config checks, the analysis schemas, the figures and the selection read it.
The JSON/YAML schemas repeat the names (they cannot import Python); a test checks them
against this registry (tests/test_backends.py). How to add one: docs/extending.md.

A partition's kind (``cpu`` or ``gpu``) is decided here only: ``partition_kind``.

Standard library only: both environments import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hvdscale.errors import UserError

DEFAULT_FRAMEWORK = "horovod-tf"
#: the training frameworks (config key frameworks of a sweep), the default first, each
#: with its trainer: "module:attribute" of the object hvdscale.trainer.rank.train_rank
#: runs (a hvdscale.trainer.rank.Framework), named and not imported, since matrix is below
#: trainer. The run id names a framework only when it is not the default
#: ({partition}_torch-ddp_...). A framework also needs Backend entries (REGISTRY).
TRAINERS = {
    DEFAULT_FRAMEWORK: "hvdscale.trainer.horovod_tf.framework:FRAMEWORK",
    "torch-ddp": "hvdscale.trainer.torch_ddp.framework:FRAMEWORK",
}
FRAMEWORKS = tuple(TRAINERS)
#: Horovod's controllers (coordination, not the collectives), in the systems table's order
CONTROLLERS = ("mpi", "gloo")


@dataclass(frozen=True)
class Backend:
    """A collective backend of a training framework."""

    name: str  # also the run-id token ({partition}_{name}_n...)
    framework: str = DEFAULT_FRAMEWORK
    cpu_operations: str | None = None  # HOROVOD_CPU_OPERATIONS
    gpu_operations: str | None = None  # HOROVOD_GPU_OPERATIONS
    #: launcher -> Horovod controller (torch-ddp: the torch.distributed backend, what the
    #: record's controller says); the first launcher is the fallback for the others
    controllers: Mapping[str, str] = field(default_factory=dict)
    needs_gpu: bool = False  # only on GPU partitions (the config check, the label proof)
    timeline_op: str = ""  # the timeline activity of its gradient allreduce (label proof)
    #: torch-ddp: what torch.distributed.get_backend() must report (label proof); None
    #: for Horovod, whose proof is the timeline activity
    process_group: str | None = None
    color: str | None = None  # plot style (hvdscale.figures.style)
    marker: str = "o"
    linestyle: str = "-"

    @property
    def controller(self) -> str | None:
        """The controller when every launcher gives the same one (else None)."""
        values = set(self.controllers.values())
        return values.pop() if len(values) == 1 else None


_MPI_EVERYWHERE = {"horovodrun": "mpi", "mpirun": "mpi", "srun": "mpi"}

#: (framework, name) -> entry; the order is the preference order (figures, selection)
REGISTRY: dict[tuple[str, str], Backend] = {
    (DEFAULT_FRAMEWORK, b.name): b
    for b in (
        Backend(
            "nccl",
            gpu_operations="NCCL",
            # NCCL does the GPU collectives; the controller only coordinates
            controllers={"horovodrun": "gloo", "mpirun": "mpi", "srun": "mpi"},
            needs_gpu=True,
            timeline_op="NCCL_ALLREDUCE",
            color="#1b9e77",
            marker="o",
            linestyle="-",
        ),
        Backend(
            "mpi",
            cpu_operations="mpi",
            controllers=_MPI_EVERYWHERE,
            timeline_op="MPI_ALLREDUCE",
            color="#d95f02",
            marker="s",
            linestyle="--",
        ),
        Backend(
            "gloo",
            cpu_operations="gloo",
            # Gloo needs horovodrun's rendezvous, or hvdscale.slurm.rendezvous's under srun
            controllers={"horovodrun": "gloo", "srun": "gloo"},
            timeline_op="GLOO_ALLREDUCE",
            color="#7570b3",
            marker="^",
            linestyle=":",
        ),
    )
}

# PyTorch DistributedDataParallel (issue 19): torchrun on one machine, srun on SLURM (one
# task per rank, hvdscale.slurm.rendezvous's rendezvous); no Horovod, so no Horovod
# variables and no timeline: the label proof checks what torch.distributed reports.
_TORCH = "torch-ddp"
REGISTRY.update(
    {
        (_TORCH, b.name): b
        for b in (
            Backend(
                "nccl",
                framework=_TORCH,
                controllers={"torchrun": "nccl", "srun": "nccl"},
                needs_gpu=True,
                process_group="nccl",
                color="#66a61e",
                marker="D",
                linestyle="-",
            ),
            Backend(
                "gloo",
                framework=_TORCH,
                controllers={"torchrun": "gloo", "srun": "gloo"},
                process_group="gloo",
                color="#e7298a",
                marker="v",
                linestyle=":",
            ),
        )
    }
)


def entries(framework: str | None = DEFAULT_FRAMEWORK) -> list[Backend]:
    """The registered backends of one framework (None: of every framework), in
    preference order."""
    return [b for b in REGISTRY.values() if framework is None or b.framework == framework]


def names(framework: str | None = DEFAULT_FRAMEWORK) -> list[str]:
    """Backend names of one framework (None: of any framework), in preference order,
    each once."""
    return list(dict.fromkeys(b.name for b in entries(framework)))


def frameworks() -> list[str]:
    """The frameworks that have a registered backend, the default first."""
    return list(dict.fromkeys(b.framework for b in REGISTRY.values()))


def get(name: str, framework: str = DEFAULT_FRAMEWORK) -> Backend:
    """The entry of backend ``name`` of ``framework``; a UserError naming the known ones
    otherwise."""
    try:
        return REGISTRY[(framework, name)]
    except KeyError:
        if framework not in frameworks():
            raise UserError(
                f"framework {framework!r}: expected one of {', '.join(frameworks())}"
            ) from None
        known = names(framework)
        of = "" if framework == DEFAULT_FRAMEWORK else f" of framework {framework}"
        raise UserError(
            f"backend {name!r}{of}: expected {', '.join(known[:-1])} or {known[-1]}"
            if len(known) > 1
            else f"backend {name!r}{of}: expected {known[0]}"
        ) from None


def id_alternation() -> str:
    """The backend part of the id patterns: 'nccl|mpi|gloo' (every framework's)."""
    return "|".join(names(None))


def framework_alternation() -> str:
    """The optional framework part of the run-id pattern: the frameworks but the default
    ('torch-ddp'), which run ids leave out."""
    return "|".join(f for f in frameworks() if f != DEFAULT_FRAMEWORK)


def framework_problems(framework: str, backend_names) -> list[str]:
    """The backends of ``backend_names`` that ``framework`` does not have."""
    return [b for b in backend_names if (framework, b) not in REGISTRY]


def order(name: str) -> int:
    """Preference rank of a backend (figures, the report's preferred group); 9 unknown."""
    return names().index(name) if name in names() else 9


def cpu_backends(framework: str = DEFAULT_FRAMEWORK) -> list[str]:
    """The backends (of ``framework``) that run on any partition (no GPU needed)."""
    return [b.name for b in entries(framework) if not b.needs_gpu]


# --------------------------------------------------------------------- partition kinds

#: the kinds of partition; a partition's kind decides its slots per node, its SLURM
#: GPU resources, the GPU hours of the plan and the backends it allows
PARTITION_KINDS = ("cpu", "gpu")


def _gpus_per_node(partition) -> int:
    if isinstance(partition, Mapping):
        return int(partition.get("gpus_per_node") or 0)
    return int(getattr(partition, "gpus_per_node", 0) or 0)


def partition_kind(partition) -> str:
    """'gpu' where a partition (its config section, or a Run/JobSpec laid out on it) has
    GPUs (gpus_per_node > 0), else 'cpu'."""
    return "gpu" if _gpus_per_node(partition) > 0 else "cpu"


def is_gpu_partition(partition) -> bool:
    return partition_kind(partition) == "gpu"


def gpu_problems(backend_names, partition, framework: str = DEFAULT_FRAMEWORK) -> list[str]:
    """The backends of ``backend_names`` (of ``framework``) that need GPUs the partition
    does not have."""
    if is_gpu_partition(partition):
        return []
    return [b for b in backend_names if (framework, b) in REGISTRY and get(b, framework).needs_gpu]
