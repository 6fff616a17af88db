"""SLURM time limits (issue 12): warn, checkpoint, stop, resume with a longer runtime.

- The training job asks SLURM for SIGUSR1 ``training.time_limit_margin_s`` seconds
  before its time limit (``sbatch --signal=USR1@N``, through the rule's slurm_extra;
  multi-rank jobs only). No ``B:``: SLURM signals the job's steps, i.e. the ranks
  started by srun, and not the batch shell that runs Snakemake's job step and
  ``hvdscale launch``. As SLURM sends it only to steps that exist then, and only at its
  30-second time-limit checks, ``hvdscale launch`` also sends SIGUSR1 itself at the same
  moment (:func:`watch`: to srun, which forwards it to every rank).
- Every rank catches SIGUSR1 (:func:`install`, before TensorFlow is imported). At the
  end of each epoch, after the epoch's checkpoint, the ranks agree (one allreduce of a
  flag, max) whether any of them got it (:func:`stop_requested`); if so they all stop
  with :data:`EXIT_TIME_LIMIT` instead of starting an epoch that would be killed.
- The launcher reports the exit status, Snakemake resubmits the job (``restart-times``
  of the profile) and the retry resumes from the checkpoint. Its time limit is
  ``runtime_min_retry`` of the partition (:func:`runtime_for`; per-attempt runtime).

A 1-worker run is a plain (non-MPI) plugin job whose own job step (Snakemake under
``srun -n1``) would die of SLURM's SIGUSR1, so it gets no ``--signal``; the launcher's
signal alone warns it (its child is the rank itself: no srun, see
``hvdscale.slurm.rendezvous.build_in_step``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hvdscale.io import write_json_atomic

#: exit status of a rank (and so of ``hvdscale launch``) stopped before the time limit
EXIT_TIME_LIMIT = 4

_received: list[float] = []


MARGIN_ENV = "HVDSCALE_TIME_LIMIT_MARGIN_S"
READY_ENV = "HVDSCALE_TIME_LIMIT_READY"  # "<out_dir>/.pids:<workers>": the ranks' pid files


def launch_env(training: dict, out_dir=None, workers: int = 0) -> dict[str, str]:
    """Launcher environment for :func:`watch` (inside SLURM jobs only)."""
    margin = int(training.get("time_limit_margin_s", 120) or 0)
    if margin <= 0 or not os.environ.get("SLURM_JOB_ID"):
        return {}
    env = {MARGIN_ENV: str(margin)}
    if out_dir is not None and workers:
        env[READY_ENV] = f"{Path(out_dir).resolve() / '.pids'}:{workers}"
    return env


def job_end_time(job_id: str) -> float | None:
    """The job's end time (its time limit) as a POSIX time, from squeue; None if unknown."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%e"], capture_output=True, text=True, timeout=30
        )
        return time.mktime(time.strptime(out.stdout.strip(), "%Y-%m-%dT%H:%M:%S"))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def watch(proc, env: dict[str, str], to_ranks: bool = False) -> None:
    """Send SIGUSR1 to the launcher's child (srun forwards it to every rank) at the job's
    end time minus the margin, once every rank has started (its pid file exists, so its
    handler is about to be installed). ``to_ranks``: to every rank's pid (pid files)
    instead, for a launcher that does not forward it (torchrun dies of SIGUSR1).

    SLURM's own ``--signal`` reaches only the job steps that exist at that moment and is
    sent by slurmctld's 30-second time-limit check, so a short job, or one whose ranks
    start late, would miss it; and in a 1-worker job it would also hit the plugin's own
    step (Snakemake under ``srun -n1``). The launcher knows when its ranks run.
    """
    job = os.environ.get("SLURM_JOB_ID")
    if not env.get(MARGIN_ENV) or not job:
        return
    end = job_end_time(job)
    if end is None:
        return
    fire_at = end - int(env[MARGIN_ENV])
    pids, _, workers = env.get(READY_ENV, "").rpartition(":")

    def ready() -> bool:
        if not pids:
            return True
        return len(list(Path(pids).glob("rank-*.pid"))) >= int(workers or 0)

    def run() -> None:
        while proc.poll() is None:
            now = time.time()
            if now >= fire_at and (ready() or now >= fire_at + 60):
                time.sleep(1.0)  # the last rank's handler comes right after its pid file
                if proc.poll() is None:
                    print(
                        f"hvdscale launch: {int(end - time.time())} s to the SLURM time limit: "
                        "SIGUSR1 to the ranks",
                        file=sys.stderr,
                        flush=True,
                    )
                    if to_ranks and pids:
                        _signal_ranks(Path(pids))
                    else:
                        proc.send_signal(signal.SIGUSR1)
                return
            time.sleep(0.5)

    threading.Thread(target=run, name="time-limit-watch", daemon=True).start()


def _signal_ranks(pid_dir: Path) -> None:
    """SIGUSR1 to the pid of every rank-N.pid in ``pid_dir`` (ranks that ended: skipped)."""
    for f in sorted(pid_dir.glob("rank-*.pid")):
        try:
            os.kill(int(f.read_text().strip()), signal.SIGUSR1)
        except (OSError, ValueError):
            pass


def install() -> None:
    """Catch SIGUSR1 in this rank: remember it, keep training until the epoch ends."""

    def on_signal(signum, _frame):
        _received.append(time.time())
        print(
            f"hvdscale train: SIGUSR1 (time limit in less than the margin): the run stops "
            f"after this epoch's checkpoint and exits {EXIT_TIME_LIMIT}",
            file=sys.stderr,
            flush=True,
        )

    signal.signal(signal.SIGUSR1, on_signal)
    # SA_RESTART: the MPI/Gloo/Horovod threads' system calls go on when it arrives
    signal.siginterrupt(signal.SIGUSR1, False)


def stop_requested(worker, epoch: int, epochs_total: int) -> bool:
    """True on every rank when any rank got the warning and epochs are left (collective:
    every rank calls it at the same point; only inside SLURM jobs)."""
    if epoch + 1 >= epochs_total or not os.environ.get("SLURM_JOB_ID"):
        return False
    flag = worker.allreduce([1.0 if _received else 0.0], op="max", name=f"time_limit_{epoch}")
    return bool(flag[0] > 0)


def stopped(log, run_id: str, epoch: int, out_dir=None, is_root: bool = False) -> int:
    """Say why the run stops and note it in the checkpoint's attempt list (rank 0), so
    the run record's ``resume.attempts`` shows it: ``ended: time_limit``, the time the
    warning came, the exit status. Returns the exit status for the rank."""
    if is_root and out_dir is not None:
        ck = Path(out_dir) / "checkpoint"
        latest = ck / "LATEST"
        try:
            state_path = ck / latest.read_text().strip() / "state.json"
            state = json.loads(state_path.read_text())
            if state.get("epoch") == epoch and state.get("attempts"):
                state["attempts"][-1].update(
                    {
                        "ended": "time_limit",
                        "signal_utc": time.strftime(
                            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(_received[0] if _received else None)
                        ),
                        "exit_status": EXIT_TIME_LIMIT,
                        "epochs_done": epoch + 1,
                    }
                )
                write_json_atomic(state_path, state)
        except (OSError, ValueError) as exc:
            log(f"WARNING: could not note the time-limit stop in the checkpoint: {exc}")
    log(
        f"{run_id}: stopping after epoch {epoch} before the SLURM time limit (checkpoint "
        f"written); exit {EXIT_TIME_LIMIT}, the retry resumes from epoch {epoch + 1}"
    )
    return EXIT_TIME_LIMIT
