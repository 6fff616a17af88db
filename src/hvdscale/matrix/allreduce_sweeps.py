"""The allreduce size sweeps (``measure_allreduce``): one job per (partition, backend,
nodes, workers >= 2) of the Horovod runs of the run table, plus the sweeps of config key
``allreduce.sweeps``, and the config slice each one depends on."""

from __future__ import annotations

import copy
import itertools

from hvdscale.errors import ConfigError, UserError
from hvdscale.matrix import backends
from hvdscale.matrix.runtable import partition_slice, run_table
from hvdscale.slurm.clusters import in_scope
from hvdscale.slurm.jobspec import JobSpec

# training keys an allreduce sweep depends on (launcher, OMP threads, Horovod knobs)
ALLREDUCE_TRAINING_KEYS = ("launcher", "threads_per_worker", "horovod")


def allreduce_config(cfg: dict, allreduce_id: str) -> dict:
    """The part of the config one allreduce sweep depends on.

    A valid config in itself: the sweep's partition, the train environment, the
    training keys of ALLREDUCE_TRAINING_KEYS and one sweep naming the job's backend
    and worker count (batch size and LR rule are placeholders: the sweep trains
    nothing). Editing the report, other sweeps, data or other training settings
    leaves it, and so the measured sweep, untouched.
    """
    job = JobSpec.for_allreduce_id(cfg, allreduce_id)
    return {
        "environment": copy.deepcopy(cfg["environment"]),
        "training": {k: copy.deepcopy(cfg["training"][k]) for k in ALLREDUCE_TRAINING_KEYS},
        "scaling": {
            "partitions": {job.partition: partition_slice(cfg, job.partition)},
            "sweeps": [
                {
                    "name": "allreduce",
                    "partitions": [job.partition],
                    "workers": [job.workers],
                    "backends": [job.backend],
                    "batch_sizes": [1],
                    "lr_rules": ["none"],
                }
            ],
        },
    }


def allreduce_jobs(cfg: dict) -> list[dict]:
    """One allreduce size sweep per (partition, backend, nodes, workers >= 2) of the Horovod
    runs of the run table (the sweep measures Horovod's allreduce: torch-ddp runs add none)."""
    seen = {}
    for r in run_table(cfg):
        if r.workers < 2 or r.framework != backends.DEFAULT_FRAMEWORK:
            continue
        key = f"{r.partition}_{r.backend}_n{r.nodes}_w{r.workers}"
        seen.setdefault(
            key,
            {
                "id": key,
                "partition": r.partition,
                "backend": r.backend,
                "nodes": r.nodes,
                "workers": r.workers,
                "workers_per_node": r.workers_per_node,
                "gpus_per_node": r.gpus_per_node,
            },
        )
    for job in extra_allreduce_jobs(cfg):  # allreduce.sweeps: rank/node counts of their own
        seen.setdefault(job["id"], job)
    return [seen[k] for k in sorted(seen)]


def extra_allreduce_jobs(cfg: dict) -> list[dict]:
    """The sweeps of config key allreduce.sweeps: partition x backend x workers x nodes,
    the ranks spread evenly over the nodes; combinations that do not fit are skipped."""
    jobs = []
    parts = cfg["scaling"]["partitions"]
    for i, sw in enumerate(cfg.get("allreduce", {}).get("sweeps", [])):
        for part in sw["partitions"]:
            if part not in parts:
                raise ConfigError(
                    f"config key allreduce.sweeps.{i}.partitions: got {part!r}; expected one "
                    f"of {', '.join(map(repr, sorted(parts)))} (keys of scaling.partitions)"
                )
            if not in_scope(cfg, part):  # only_cluster: another cluster's partition
                continue
            for be, w, n in itertools.product(sw["backends"], sw["workers"], sw["nodes"]):
                try:
                    job = JobSpec.for_workers(cfg, part, be, w, nodes=n)
                except UserError:
                    continue
                jobs.append(
                    {
                        "id": f"{part}_{be}_n{n}_w{w}",
                        "partition": part,
                        "backend": be,
                        "nodes": n,
                        "workers": w,
                        "workers_per_node": job.workers_per_node,
                        "gpus_per_node": job.gpus_per_node,
                    }
                )
    return jobs
