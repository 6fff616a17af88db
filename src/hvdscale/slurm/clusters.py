"""Several clusters, one study (issue 29): one Snakemake run per cluster.

A site with several SLURM instances (each with its own slurmctld and login nodes, no
shared slurmdbd, so no ``sbatch --clusters``) runs one study as one Snakemake run per
cluster: on that cluster's login node (or with its ``SLURM_CONF``), with the config key
``only_cluster`` naming it (``snakemake --config only_cluster=NAME``). The partitions of
that cluster are those whose ``scaling.partitions.<p>.cluster`` is NAME; the run table
(training runs, tuning candidates, calibration runs), the allreduce sweeps, the
``sinfo`` check and the plan keep only them. The config itself is not cut: every
cluster's run records the same config, and ``hvdscale merge`` joins their results
directories (or archives) into one report (hvdscale.study.merge).

Such a run never passes ``--clusters`` to sbatch (the plugin's ``slurm_cluster``
resource stays empty): its jobs go to the Slurm the login node's ``SLURM_CONF`` names,
which is the cluster itself. Without ``only_cluster`` a partition's ``cluster`` is still
passed as ``--clusters`` (a federation through slurmdbd, as before).
"""

from __future__ import annotations


def only_cluster(cfg: dict) -> str:
    """The cluster this run is restricted to ("" for none)."""
    return str(cfg.get("only_cluster") or "")


def in_scope(cfg: dict, partition: str) -> bool:
    """Whether ``partition``'s jobs belong to this run (always without only_cluster)."""
    name = only_cluster(cfg)
    if not name:
        return True
    part = cfg["scaling"]["partitions"].get(partition) or {}
    return (part.get("cluster") or "") == name


def scoped_partitions(cfg: dict) -> list[str]:
    """The partitions of scaling.partitions this run submits to, in config order."""
    return [p for p in cfg["scaling"]["partitions"] if in_scope(cfg, p)]


def only_cluster_problems(cfg: dict) -> list[str]:
    """Config problems of only_cluster: a cluster no partition names, a study with no
    sweep on it, calibration runs on another cluster (with ``select``, the config check
    also asks the run table whether a run is left: hvdscale.config.load)."""
    name = only_cluster(cfg)
    if not name:
        return []
    parts = cfg["scaling"]["partitions"]
    mine = scoped_partitions(cfg)
    if not mine:
        known = sorted({p.get("cluster") or "" for p in parts.values()} - {""})
        return [
            f"config key only_cluster: got {name!r}; no partition of scaling.partitions has "
            f"cluster {name!r} (clusters named there: "
            f"{', '.join(map(repr, known)) or 'none; set scaling.partitions.<p>.cluster'})"
        ]
    swept = {p for sw in cfg["scaling"]["sweeps"] for p in sw["partitions"]}
    problems = []
    if not swept & set(mine):
        problems.append(
            f"config key only_cluster: cluster {name!r} has partition(s) "
            f"{', '.join(map(repr, mine))}, which no sweep of scaling.sweeps uses"
        )
    tgt = cfg["training"].get("target") or {}
    cal = tgt.get("calibration") or {}
    if tgt.get("mode") == "calibrated" and cal.get("partition") not in mine:
        problems.append(
            f"config key training.target.calibration.partition: the calibration runs are on "
            f"{cal.get('partition')!r}, not on cluster {name!r} (only_cluster); every cluster "
            "of one study needs the same target: use training.target {mode: absolute, value: "
            "<the value of the first cluster's results/scaling/target.json>}"
        )
    return problems
