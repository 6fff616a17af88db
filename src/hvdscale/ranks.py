"""Where the ranks of a job run and how they ended: host lists for horovodrun/mpirun
(``host:slots`` per node, from ``--hosts`` or the SLURM allocation) and the exit
markers each rank leaves in ``OUT_DIR/.pids/``. Pure Python, no TensorFlow."""

from __future__ import annotations

from pathlib import Path

from hvdscale.errors import UserError
from hvdscale.jobspec import JobSpec


def slurm_hostnames() -> list[str]:
    """Hosts of the current SLURM allocation ([] outside one): SLURM_JOB_NODELIST,
    SLURM_NODELIST or squeue, since the plugin's job step strips SLURM_JOB_NODELIST
    (hvdscale.gloo_slurm)."""
    from hvdscale.gloo_slurm import slurm_hostnames as allocation_hostnames

    return allocation_hostnames()


def hosts_argument(job: JobSpec, hosts: list[str] | None) -> str:
    """horovodrun -H / mpirun -H value: host:slots for each node of the job."""
    if hosts:
        names = hosts
    elif job.nodes == 1:
        names = ["localhost"]
    else:
        names = slurm_hostnames()
        if not names:
            raise UserError(
                f"{job.nodes} nodes but no host list: run inside a SLURM allocation "
                "(SLURM_JOB_NODELIST) "
                "or pass --hosts host1,host2,..."
            )
    if len(names) < job.nodes:
        raise UserError(
            f"{job.nodes} nodes needed but only {len(names)} host(s) given: {', '.join(names)}"
        )
    out, left = [], job.workers
    for h in names[: job.nodes]:
        h, _, slots = h.partition(":")
        n = min(left, int(slots) if slots else job.workers_per_node)
        out.append(f"{h}:{n}")
        left -= n
    if left > 0:
        raise UserError(
            f"{job.workers} workers do not fit on {job.nodes} node(s) "
            f"with {job.workers_per_node} each"
        )
    return ",".join(out)


def rank_exit_codes(out_dir: Path, workers: int) -> dict[int, str]:
    """Exit status each rank recorded in OUT_DIR/.pids/rank-N.exit (absent: killed/crashed hard)."""
    codes = {}
    for r in range(workers):
        f = out_dir / ".pids" / f"rank-{r}.exit"
        if f.is_file():
            codes[r] = f.read_text().strip()
    return codes
