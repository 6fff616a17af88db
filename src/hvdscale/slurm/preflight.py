"""The preflight of a partition, planned: what one short job per partition checks before
any training job of that partition runs, and how it sits on the partition.

A partition's preflight starts 2 ranks with the study's own launcher and train env (the
same ``JobSpec`` machinery as the training runs: ``layout``), on 2 nodes when a run or
allreduce sweep of the partition uses more than one node (or a node holds a single
rank), and checks every (framework, backend) pair its runs and allreduce sweeps use.
The running is ``hvdscale preflight`` (hvdscale.launch.preflight).

Pure Python (no Snakemake, no TensorFlow): used by the workflow, the plan and the command.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from dataclasses import dataclass

from hvdscale.matrix.allreduce_sweeps import allreduce_jobs
from hvdscale.matrix.backends import DEFAULT_FRAMEWORK
from hvdscale.matrix.runtable import run_table
from hvdscale.slurm.jobspec import JobSpec, slots_per_node

#: the gradient of the default model: what each backend's allreduce must move
GRADIENT_ELEMENTS = 153_441
#: the time limit of a preflight job (minutes; the partition's runtime_min when shorter)
PREFLIGHT_MINUTES = 10
PREFLIGHT_WORKERS = 2


@dataclass(frozen=True)
class Preflight:
    """The preflight job of one partition."""

    partition: str
    nodes: int  # 1, or 2 when the partition's runs span nodes
    checks: tuple[tuple[str, str], ...]  # (framework, backend) pairs, sorted
    job: JobSpec  # the layout of the first pair (the rule's SLURM resources)
    #: what else it checks against: the partition's keys, the train env, the launcher
    settings: dict = dataclasses.field(default_factory=dict, compare=False)

    def layout(self, framework: str, backend: str) -> JobSpec:
        """The 2-rank job of one (framework, backend) pair: the same nodes and resources."""
        return dataclasses.replace(self.job, framework=framework, backend=backend)

    @property
    def node_hours(self) -> float:
        """Worst case: the job runs to its time limit on its nodes."""
        return self.nodes * (self.job.runtime_min or 0) / 60

    @property
    def gpu_hours(self) -> float:
        return self.job.total_gpus * (self.job.runtime_min or 0) / 60

    def slice(self) -> dict:
        """What the preflight depends on (a rule's params: editing it repeats the
        preflight, which retrains nothing; editing anything else keeps it)."""
        return {
            "partition": self.partition,
            "nodes": self.nodes,
            "checks": [list(c) for c in self.checks],
            "resources": self.job.slurm_resources(1),
            **self.settings,
        }


def preflights(cfg: dict) -> dict[str, Preflight]:
    """One preflight per partition of the (selected) run table and allreduce sweeps of a
    validated config, in partition order."""
    pairs: dict[str, set] = {}
    span: dict[str, int] = {}
    widest: dict[str, int] = {}  # the most ranks of one run or sweep
    for r in run_table(cfg):
        pairs.setdefault(r.partition, set()).add((r.framework, r.backend))
        span[r.partition] = max(span.get(r.partition, 1), r.nodes)
        widest[r.partition] = max(widest.get(r.partition, 1), r.workers)
    for j in allreduce_jobs(cfg):
        pairs.setdefault(j["partition"], set()).add((DEFAULT_FRAMEWORK, j["backend"]))
        span[j["partition"]] = max(span.get(j["partition"], 1), j["nodes"])
        widest[j["partition"]] = max(widest.get(j["partition"], 1), j["workers"])
    out = {}
    for part in sorted(pairs):
        checks = tuple(sorted(pairs[part]))
        pcfg = cfg["scaling"]["partitions"][part]
        # 2 ranks, on 2 nodes where the partition's runs span nodes; 1 rank where no run
        # of the partition has more than one worker (a 2-rank job might not fit there)
        ranks = min(PREFLIGHT_WORKERS, widest[part])
        nodes = 2 if span[part] > 1 or slots_per_node(pcfg) < ranks else 1
        framework, backend = checks[0]
        job = JobSpec.for_workers(cfg, part, backend, ranks, nodes=nodes, framework=framework)
        minutes = min(job.runtime_min or PREFLIGHT_MINUTES, PREFLIGHT_MINUTES)
        job = dataclasses.replace(job, runtime_min=minutes, runtime_min_retry=None, signal=None)
        settings = {
            "partition_config": pcfg,
            "environment": cfg.get("environment", {}),
            "launcher": cfg["training"]["launcher"],
        }
        out[part] = Preflight(part, nodes, checks, job, settings)
    return out


def node_gpus(node: str, environ: dict | None = None) -> tuple[int, str] | None:
    """(GPU count, GPU type or "") that SLURM's node record declares (``Gres=gpu:TYPE:N``),
    or None without a working ``scontrol`` (not under SLURM)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", node, "-o"],
            capture_output=True,
            text=True,
            timeout=30,
            env=environ,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return parse_gres(out.stdout)


def parse_gres(node_record: str) -> tuple[int, str]:
    """(count, type) of the gpu entries of an ``scontrol show node`` record: Gres=gpu:8,
    Gres=gpu:a100:8(S:0-1), Gres=(null) -> (0, "")."""
    m = re.search(r"(?:^|\s)Gres=(\S+)", node_record)
    count, kind = 0, ""
    for entry in (m.group(1) if m else "").split(","):
        parts = re.sub(r"\(.*?\)", "", entry).split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        if parts[-1].isdigit():
            count += int(parts[-1])
        if len(parts) == 3:
            kind = parts[1]
    return count, kind
