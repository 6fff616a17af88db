"""The job layout of one training run or allreduce sweep, computed in one place.

A ``JobSpec`` says how a job of ``workers`` Horovod ranks sits on a partition:
sequential distribution as in the reference study (fill every GPU, or CPU slot, of a
node before using the next one), one task per worker, whole nodes (exclusive) with all
their memory, CPUs per task = cores per node / slots per node. From it come

- the SLURM resources of the rules ``train_run`` and ``measure_allreduce``
  (``slurm_resources(attempt)``, mapped to sbatch flags by
  snakemake-executor-plugin-slurm), and
- the launcher's view of the job (``srun_args()``, ranks per node for host lists), with
  the partition's GPU binding (``gpu_bind_args``: ``--gpus-per-task=1`` by default).

Plugin 2.8 quirks live here and nowhere else:

- ``tasks`` becomes ``--ntasks-per-gpu`` on GPU jobs unless ``tasks_per_gpu`` is 0;
- the plugin's ``tasks_per_node`` cannot be combined with ``tasks``, so
  ``--ntasks-per-node`` goes into ``slurm_extra`` (with ``--exclusive``);
- the plugin refuses ``mpi`` jobs with one task: a 1-worker run is a plain job, which
  the plugin's job step runs as its one task (``srun -n1 --cpus-per-task=...``: the
  job's CPUs, memory and GPUs). Its launcher starts no srun (``in_launcher_step``): the
  single rank is the launcher's child in that step (hvdscale.slurm.rendezvous,
  ``build_in_step``), not a nested step that may get neither the GPU nor the memory.

Pure Python (no Snakemake, no TensorFlow): used by the workflow, the launcher and tests.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from hvdscale.errors import UserError
from hvdscale.matrix.backends import DEFAULT_FRAMEWORK, is_gpu_partition
from hvdscale.matrix.runid import allreduce_id_pattern
from hvdscale.slurm.threads import planned_threads

#: scaling.partitions.<name>.gpu_bind -> srun options of the ranks on a GPU partition:
#: per-task gives every task one GPU of its own (CUDA_VISIBLE_DEVICES names one id; what
#: SLURM sites such as ZIH recommend), single binds every task to one of the step's GPUs,
#: none lets every rank see the node's GPUs (the framework takes its local rank's).
GPU_BIND_SRUN = {
    "per-task": ("--gpus-per-task=1",),
    "single": ("--gpu-bind=single:1",),
    "none": (),
}
DEFAULT_GPU_BIND = "per-task"

# A value None leaves the resource unset (no sbatch flag).
RESOURCE_KEYS = (
    "slurm_partition",
    "slurm_cluster",
    "slurm_account",
    "constraint",
    "nodes",
    "tasks",
    "tasks_per_gpu",
    "cpus_per_task",
    "mem_mb",
    "runtime",
    "gres",
    "slurm_extra",
    "mpi",
)


def slots_per_node(partition: dict) -> int:
    """Workers that fit on one node: its GPUs, or workers_per_node on CPU partitions."""
    return (
        partition["gpus_per_node"] if is_gpu_partition(partition) else partition["workers_per_node"]
    )


def nodes_for(workers: int, partition: dict) -> int:
    """Sequential distribution: fill every slot of a node before using the next one."""
    return math.ceil(workers / slots_per_node(partition))


def workers_per_node_for(workers: int, partition: dict) -> int:
    """Ranks on each node (the last node may hold fewer)."""
    return min(workers, slots_per_node(partition))


def cpus_per_task_for(partition: dict) -> int:
    """Cores per node shared evenly by the slots of a node (at least one)."""
    return max(1, partition["cores_per_node"] // slots_per_node(partition))


@dataclass(frozen=True)
class JobSpec:
    """What to start: one program on ``workers`` ranks over ``nodes`` nodes.

    The first seven fields are what the launcher needs; the rest only matters for
    SLURM resources.
    """

    partition: str
    backend: str
    nodes: int
    workers: int
    workers_per_node: int
    gpus_per_node: int = 0
    cpus_per_task: int = 1  # cores per node / slots per node (the SLURM allocation's)
    mem_mb: int | None = None  # per node (whole nodes)
    runtime_min: int | None = None  # time limit of one attempt
    account: str = ""
    constraint: str = ""
    threads_per_worker: int = 1  # as planned: auto counts as 1 (slurm.threads)
    cluster: str = ""  # the partition's SLURM cluster (sbatch --clusters), "" for the default
    runtime_min_retry: int | None = None  # time limit of attempts 2, 3, ... (None: runtime_min)
    signal: str | None = None  # sbatch --signal=... before the time limit (slurm.timelimit)
    srun_mpi: str = "pmix"  # srun --mpi= type (training.srun_mpi)
    node_cores: int = 0  # the partition's cores_per_node (a local run takes them all)
    framework: str = DEFAULT_FRAMEWORK  # what the ranks run (hvdscale.matrix.backends.FRAMEWORKS)
    sbatch_flags: str = ""  # the partition's site flags (appended to slurm_extra)
    gpu_bind: str = DEFAULT_GPU_BIND  # scaling.partitions.<name>.gpu_bind (GPU partitions)

    # ----------------------------------------------------------------- construction

    @classmethod
    def for_workers(
        cls,
        cfg: dict,
        partition: str,
        backend: str,
        workers: int,
        nodes: int | None = None,
        framework: str = DEFAULT_FRAMEWORK,
    ) -> JobSpec:
        """The layout of ``workers`` ranks of ``backend`` (of ``framework``) on ``partition``
        of a validated config; ``nodes`` (allreduce sweeps only) spreads them evenly over
        that many nodes."""
        part = cfg["scaling"]["partitions"][partition]
        per_node = workers_per_node_for(workers, part)
        if nodes is not None and nodes != nodes_for(workers, part):
            if nodes > workers or workers % nodes or workers // nodes > slots_per_node(part):
                raise UserError(
                    f"{workers} workers cannot be spread evenly over {nodes} node(s) of "
                    f"partition {partition!r} ({slots_per_node(part)} slots per node)"
                )
            per_node = workers // nodes
        return cls(
            partition=partition,
            backend=backend,
            nodes=nodes or nodes_for(workers, part),
            workers=workers,
            workers_per_node=per_node,
            gpus_per_node=part["gpus_per_node"],
            cpus_per_task=cpus_per_task_for(part),
            mem_mb=part["mem_mb_per_node"],
            runtime_min=part["runtime_min"],
            account=part.get("account", ""),
            constraint=part.get("constraint", ""),
            threads_per_worker=planned_threads(cfg["training"].get("threads_per_worker", 1)),
            # only_cluster (slurm/clusters.py): this run is on the cluster's own login
            # node (its SLURM_CONF), so no sbatch --clusters
            cluster="" if cfg.get("only_cluster") else (part.get("cluster") or ""),
            runtime_min_retry=part.get("runtime_min_retry"),
            signal=signal_option(cfg["training"], workers),
            srun_mpi=cfg["training"].get("srun_mpi") or "pmix",
            node_cores=int(part["cores_per_node"]),
            framework=framework,
            sbatch_flags=part.get("sbatch_flags") or "",
            gpu_bind=part.get("gpu_bind") or DEFAULT_GPU_BIND,
        )

    @classmethod
    def for_run(cls, cfg: dict, run) -> JobSpec:
        """The layout of a run of the scaling matrix (a ``hvdscale.matrix.runtable.Run``)."""
        framework = getattr(run, "framework", DEFAULT_FRAMEWORK)
        return cls.for_workers(cfg, run.partition, run.backend, run.workers, framework=framework)

    @classmethod
    def for_allreduce_id(cls, cfg: dict, allreduce_id: str) -> JobSpec:
        """The layout of an allreduce sweep ``{partition}_{backend}_n{nodes}_w{workers}``;
        the id must name a partition of the config and at least the node count it implies
        (more nodes: the ranks spread evenly, config key allreduce.sweeps)."""
        m = re.fullmatch(allreduce_id_pattern(), allreduce_id)
        if not m:
            raise UserError(
                f"--allreduce-id {allreduce_id!r}: expected "
                "{partition}_{backend}_n{nodes}_w{workers}, "
                "e.g. local_mpi_n1_w2"
            )
        part_name, backend = m["partition"], m["backend"]
        workers, nodes = int(m["workers"]), int(m["nodes"])
        parts = cfg["scaling"]["partitions"]
        if part_name not in parts:
            raise UserError(
                f"--allreduce-id {allreduce_id!r}: partition {part_name!r} "
                "is not in scaling.partitions "
                f"({', '.join(sorted(parts))})"
            )
        if nodes < nodes_for(workers, parts[part_name]):
            raise UserError(
                f"--allreduce-id {allreduce_id!r}: {workers} workers "
                f"need {nodes_for(workers, parts[part_name])} node(s) "
                f"on partition {part_name!r}"
            )
        try:  # more nodes than the sequential fill: an allreduce.sweeps entry
            return cls.for_workers(cfg, part_name, backend, workers, nodes=nodes)
        except UserError as exc:
            raise UserError(f"--allreduce-id {allreduce_id!r}: {exc}") from None

    # ----------------------------------------------------------------- derived values

    @property
    def tasks(self) -> int:
        """One task per worker."""
        return self.workers

    @property
    def tasks_per_node(self) -> int:
        return self.workers_per_node

    @property
    def gpus(self) -> int:
        """GPUs requested per node: one per local rank, at most the node's."""
        return min(self.gpus_per_node, self.workers_per_node) if is_gpu_partition(self) else 0

    @property
    def total_gpus(self) -> int:
        """GPUs the whole job requests (every node: ``gpus``)."""
        return self.gpus * self.nodes

    @property
    def gres(self) -> str | None:
        return f"gpu:{self.gpus}" if self.gpus else None

    @property
    def mpi(self) -> str | None:
        """The plugin's ``mpi`` resource: multi-task jobs only (see module docstring)."""
        return "srun" if self.workers > 1 else None

    @property
    def in_launcher_step(self) -> bool:
        """Whether the launcher starts the rank itself, in its own job step, instead of
        with srun: a 1-worker job (a plain plugin job, see the module docstring)."""
        return self.workers == 1

    @property
    def slurm_extra(self) -> str:
        # --ntasks-per-node here: the plugin's tasks_per_node cannot be combined with tasks
        extra = [f"--ntasks-per-node={self.workers_per_node}", "--exclusive"]
        extra += [self.signal] if self.signal else []
        # the partition's site flags last (scaling.partitions.<name>.sbatch_flags): a rule's
        # slurm_extra replaces the profile's default-resources one, so they come from here
        extra += self.sbatch_flags.split()
        return " ".join(extra)

    @property
    def local_threads(self) -> int:
        """Cores the job occupies on a single machine (the local profile's --cores): the
        whole node, as the SLURM jobs take whole nodes (--exclusive). A timed run never
        shares the machine with another timed run: two 1-worker runs side by side on a
        2-core machine would slow each other and flatter every speedup against them."""
        return max(self.workers * self.threads_per_worker, self.node_cores)

    def runtime(self, attempt: int = 1) -> int | None:
        """Time limit in minutes of attempt ``attempt`` (1, 2, ...): the partition's
        runtime_min, and runtime_min_retry (when set) for the retries of a job that hit
        its limit (it resumes from its checkpoint)."""
        if attempt < 1:
            raise ValueError(f"attempt {attempt}: counts from 1")
        if attempt > 1 and self.runtime_min_retry:
            return int(self.runtime_min_retry)
        return self.runtime_min

    def slurm_resources(self, attempt: int = 1) -> dict[str, int | str | None]:
        """Snakemake resources of the job (keys RESOURCE_KEYS; None: leave unset)."""
        return {
            "slurm_partition": self.partition,
            "slurm_cluster": self.cluster or None,
            "slurm_account": self.account or None,
            "constraint": self.constraint or None,
            "nodes": self.nodes,
            "tasks": self.tasks,
            # plugin 2.8 turns `tasks` into --ntasks-per-gpu on GPU jobs unless this is 0
            "tasks_per_gpu": 0 if is_gpu_partition(self) else None,
            "cpus_per_task": self.cpus_per_task,
            "mem_mb": self.mem_mb,
            "runtime": self.runtime(attempt),
            "gres": self.gres,
            "slurm_extra": self.slurm_extra,
            "mpi": self.mpi,
        }

    def srun_args(self, srun: str = "srun", mpi: str | None = None) -> list[str]:
        """srun's argv (before the program) inside the job's allocation, for a job of 2 or
        more ranks (``in_launcher_step``: a 1-worker job starts no srun). Everything is
        explicit: the Snakemake SLURM job step strips SLURM_NTASKS and friends, so srun
        cannot take them from the allocation."""
        argv = [
            srun,
            f"--mpi={mpi or self.srun_mpi}",  # training.srun_mpi: pmix, pmi2, ...
            "-n",
            str(self.tasks),
            "-N",
            str(self.nodes),
            f"--ntasks-per-node={self.tasks_per_node}",
            f"--cpus-per-task={self.cpus_per_task}",
            "--kill-on-bad-exit=1",
            *self.gpu_bind_args,
        ]
        return argv

    @property
    def gpu_bind_args(self) -> list[str]:
        """srun's GPU binding options of the ranks (``scaling.partitions.<name>.gpu_bind``,
        ``GPU_BIND_SRUN``); none on CPU partitions, where the key is ignored."""
        if not is_gpu_partition(self):
            return []
        if self.gpu_bind not in GPU_BIND_SRUN:
            raise UserError(
                f"config key scaling.partitions.{self.partition}.gpu_bind: got "
                f"{self.gpu_bind!r}; expected one of {', '.join(GPU_BIND_SRUN)}"
            )
        return list(GPU_BIND_SRUN[self.gpu_bind])


SIGNAL_NAME = "USR1"


def signal_option(training: dict, workers: int = 2) -> str | None:
    """The sbatch option that asks for the warning, or None when it is turned off (and
    for 1-worker jobs, see hvdscale.slurm.timelimit)."""
    margin = int(training.get("time_limit_margin_s", 120) or 0)
    return f"--signal={SIGNAL_NAME}@{margin}" if margin > 0 and workers > 1 else None


# sbatch options a partition's sbatch_flags must not set: hvdscale sets them (the job
# layout, --exclusive, --signal), the executor plugin sets them (and refuses them in
# slurm_extra, plugin 2.8 validation.get_forbidden_slurm_options), or another config key
# or profile setting does. Long name -> what sets it instead.
RESERVED_SBATCH_OPTIONS = {
    "--partition": "the partition name (the key under scaling.partitions)",
    "--account": "scaling.partitions.<name>.account",
    "--constraint": "scaling.partitions.<name>.constraint",
    "--clusters": "scaling.partitions.<name>.cluster",
    "--time": "scaling.partitions.<name>.runtime_min",
    "--mem": "scaling.partitions.<name>.mem_mb_per_node",
    "--mem-per-cpu": "scaling.partitions.<name>.mem_mb_per_node",
    "--mem-per-gpu": "scaling.partitions.<name>.mem_mb_per_node",
    "--nodes": "hvdscale (the run's workers)",
    "--ntasks": "hvdscale (the run's workers)",
    "--ntasks-per-node": "hvdscale (the run's workers)",
    "--ntasks-per-gpu": "hvdscale (the run's workers)",
    "--cpus-per-task": "scaling.partitions.<name>.cores_per_node",
    "--cpus-per-gpu": "scaling.partitions.<name>.cores_per_node",
    "--gres": "scaling.partitions.<name>.gpus_per_node",
    "--gpus": "scaling.partitions.<name>.gpus_per_node",
    "--gpus-per-node": "scaling.partitions.<name>.gpus_per_node",
    "--gpus-per-task": "scaling.partitions.<name>.gpus_per_node and gpu_bind",
    "--gpu-bind": "scaling.partitions.<name>.gpu_bind",
    "--exclusive": "hvdscale (every training job takes whole nodes)",
    "--signal": "training.time_limit_margin_s",
    "--qos": "the profile (plugin setting slurm-qos, or default-resources qos)",
    "--job-name": "the executor plugin (profile: slurm-jobname-prefix)",
    "--comment": "the executor plugin",
    "--output": "the executor plugin",
    "--error": "the executor plugin",
    "--parsable": "the executor plugin",
    "--export": "the executor plugin",
    "--chdir": "the executor plugin",
    "--workdir": "the executor plugin",
    "--wrap": "the executor plugin",
}
RESERVED_SHORT_OPTIONS = {
    "-p": "--partition",
    "-A": "--account",
    "-C": "--constraint",
    "-M": "--clusters",
    "-t": "--time",
    "-N": "--nodes",
    "-n": "--ntasks",
    "-c": "--cpus-per-task",
    "-G": "--gpus",
    "-J": "--job-name",
    "-o": "--output",
    "-e": "--error",
    "-D": "--chdir",
    "-q": "--qos",
}


def sbatch_flag_problems(partition: str, flags: str) -> list[str]:
    """What is wrong with the ``sbatch_flags`` of ``partition`` (one text per flag, each
    naming the config key and the flag); the schema already limited the characters."""
    key = f"config key scaling.partitions.{partition}.sbatch_flags"
    problems = []
    tokens = flags.split()
    if tokens and not tokens[0].startswith("-"):
        problems.append(f"{key}: got {tokens[0]!r}; expected sbatch flags (starting with '-')")
    for token in tokens:
        if token.startswith("--"):
            name = token.split("=", 1)[0]
            # sbatch (getopt_long) also takes an unambiguous prefix: --part=x is --partition
            reserved = [
                opt
                for opt in RESERVED_SBATCH_OPTIONS
                if opt == name or (len(name) > 4 and opt.startswith(name))
            ]
        elif token.startswith("-") and token[:2] in RESERVED_SHORT_OPTIONS:
            reserved = [RESERVED_SHORT_OPTIONS[token[:2]]]
        else:
            continue
        if reserved:
            opt = name if token.startswith("--") and name in reserved else reserved[0]
            where = RESERVED_SBATCH_OPTIONS[opt].replace("<name>", partition)
            problems.append(f"{key}: {token!r} sets {opt}, which is set by {where}; remove it")
    return problems


def runtime_for(partition: dict, attempt: int) -> int:
    """Time limit (minutes) of attempt ``attempt`` (1 = first) of a training job."""
    retry = partition.get("runtime_min_retry")
    if attempt > 1 and retry:
        return int(retry)
    return int(partition["runtime_min"])
