"""The allocation's hosts and the slot plan of a run's ranks under srun (used by
``hvdscale.slurm.rendezvous``).

The host list comes from ``scontrol show hostnames`` of SLURM_JOB_NODELIST, else
SLURM_NODELIST, else ``squeue -j $SLURM_JOB_ID -h -o %N`` (the Snakemake SLURM plugin's
job step removes every SLURM_* variable but the job id). The slot plan is Horovod's
sequential fill (``get_host_assignments``): ``workers_per_node`` ranks on the first node,
then the next. Pure Python, standard library only.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from hvdscale.errors import UserError

#: environment of the launcher -> ranks: the plan, read by ``exec`` and ``serve``
PLAN_HOSTS = "HVDSCALE_GLOO_HOSTS"
PLAN_PER_NODE = "HVDSCALE_GLOO_PER_NODE"
PLAN_WORKERS = "HVDSCALE_GLOO_WORKERS"
NODELIST = "HVDSCALE_SLURM_NODELIST"


# =========================================================================== host list


def _run(argv: list[str], timeout: float = 30) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def slurm_nodelist(env: dict[str, str] | None = None) -> str | None:
    """The allocation's node list in SLURM's compressed form (``node[1-2]``), or None
    outside SLURM: SLURM_JOB_NODELIST, SLURM_NODELIST, ``squeue -j JOBID -h -o %N``."""
    env = os.environ if env is None else env
    for key in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", NODELIST):
        if env.get(key):
            return env[key]
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        return None
    out = _run(["squeue", "-j", job, "-h", "-o", "%N"])
    return out.splitlines()[0].strip() if out else None


def slurm_hostnames(env: dict[str, str] | None = None) -> list[str]:
    """The allocation's host names, in SLURM's order ([] outside SLURM)."""
    nodelist = slurm_nodelist(env)
    if not nodelist:
        return []
    out = _run(["scontrol", "show", "hostnames", nodelist])
    return out.split() if out else []


def rank_env_from_slurm(env: dict[str, str] | None = None) -> dict[str, str]:
    """Variables the launcher adds for every rank inside SLURM (record: slurm_nodelist)."""
    env = os.environ if env is None else env
    if not (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")):
        return {}
    nodelist = slurm_nodelist(env)
    return {NODELIST: nodelist} if nodelist else {}


# =========================================================================== slot plan


@dataclass(frozen=True)
class Slot:
    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int

    def torch_env(self) -> dict[str, str]:
        """What torch.distributed's env:// rendezvous and torchrun's workers read
        (MASTER_ADDR/PORT come with srun's environment from the launcher)."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_size),
            "GROUP_RANK": str(self.cross_rank),
        }

    def env(self) -> dict[str, str]:
        """What Horovod's Gloo controller reads (horovod.runner.gloo_run.create_slot_env_vars)."""
        return {
            "HOROVOD_HOSTNAME": self.hostname,
            "HOROVOD_RANK": str(self.rank),
            "HOROVOD_SIZE": str(self.size),
            "HOROVOD_LOCAL_RANK": str(self.local_rank),
            "HOROVOD_LOCAL_SIZE": str(self.local_size),
            "HOROVOD_CROSS_RANK": str(self.cross_rank),
            "HOROVOD_CROSS_SIZE": str(self.cross_size),
        }


def slot_plan(workers: int, per_node: int, hosts: list[str]) -> list[Slot]:
    """Sequential fill: ranks 0..per_node-1 on hosts[0], the next per_node on hosts[1], ...
    (Horovod's get_host_assignments for ``h1:per_node,h2:per_node,...``)."""
    if workers < 1 or per_node < 1:
        raise UserError(f"gloo plan: {workers} workers, {per_node} per node")
    nodes = -(-workers // per_node)
    if len(hosts) < nodes:
        raise UserError(
            f"{workers} workers at {per_node} per node need {nodes} node(s) but the host list "
            f"has {len(hosts)}: {', '.join(hosts) or '(empty)'}"
        )
    local_sizes = [min(per_node, workers - n * per_node) for n in range(nodes)]
    slots = []
    for rank in range(workers):
        node, local = divmod(rank, per_node)
        slots.append(
            Slot(
                hostname=hosts[node],
                rank=rank,
                local_rank=local,
                cross_rank=node,
                size=workers,
                local_size=local_sizes[node],
                cross_size=sum(1 for s in local_sizes if s > local),
            )
        )
    return slots


def plan_from_env(env: dict[str, str] | None = None) -> list[Slot]:
    env = os.environ if env is None else env
    try:
        hosts = [h for h in env[PLAN_HOSTS].split(",") if h]
        return slot_plan(int(env[PLAN_WORKERS]), int(env[PLAN_PER_NODE]), hosts)
    except KeyError as exc:
        raise UserError(
            f"gloo plan: {exc.args[0]} is not set (start ranks with hvdscale launch)"
        ) from None
