"""Threads per rank (training.threads_per_worker, issue 29): one place that turns the
setting into the number a rank uses for its thread pools (TensorFlow's intra/inter-op
pools, torch.set_num_threads, OMP_NUM_THREADS) and its run record states.

A positive integer is used as it is. ``auto`` is what SLURM gives the task, as in the
reference study (each rank got the node's cores divided by its ranks):
``SLURM_CPUS_PER_TASK`` of the environment the setting is resolved in (the launcher's for
OMP_NUM_THREADS, the rank's for the pools and the record; the ranks inherit the
launcher's), and 1 where it is unset or empty (outside SLURM, or a job without
--cpus-per-task), so a run outside SLURM is what it was with 1. A value of
SLURM_CPUS_PER_TASK that is not a positive integer is an error naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

from hvdscale.errors import UserError

AUTO = "auto"
SLURM_VAR = "SLURM_CPUS_PER_TASK"


def threads_for_rank(setting, environ: Mapping[str, str]) -> int:
    """Threads of one rank for training.threads_per_worker ``setting`` (a positive integer
    or ``auto``) in ``environ`` (``auto``: its SLURM_CPUS_PER_TASK, else 1)."""
    if setting != AUTO:
        return int(setting)
    raw = (environ.get(SLURM_VAR) or "").strip()
    if not raw:
        return 1
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(
            f"training.threads_per_worker auto: {SLURM_VAR}={raw!r} is not a positive "
            "integer; set threads_per_worker to a number or fix the job's --cpus-per-task"
        )
    return value


def planned_threads(setting) -> int:
    """Threads per rank as the workflow plans a job before it runs (no SLURM environment
    yet): the integer setting, and 1 for ``auto`` (what it is outside SLURM)."""
    return 1 if setting == AUTO else int(setting)
