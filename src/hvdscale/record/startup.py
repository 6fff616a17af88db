"""Start-up and the launch-to-target time (issue 30, item 7: honest clocks).

Time to target (``target.time_to_target_s``) is training time only: the epochs'
``elapsed_s``. Before the first epoch of every attempt a job spends its start-up: the
interpreter and framework import, the framework's initialisation, reading the rank's
rows, building the model, the restore or broadcast and the first compilation. This
module measures it from one stamp:

* ``hvdscale launch`` puts its own start (``time.time()``, seconds since the epoch) into
  ``HVDSCALE_LAUNCH_START`` (:data:`LAUNCH_START_ENV`), which every launcher passes on to
  the ranks with the rest of the launcher's environment (``launch.launchspec``).
* Rank 0 of each attempt records ``startup_s`` = the wall time from that stamp to the
  start of its epoch loop in the attempt's entry of ``resume.attempts``
  (``trainer.rank.train_rank``); a rank started without the stamp (by hand) records null.
* The record's ``timing.startup_s`` is the sum over the attempts, and
  ``target.launch_to_target_s`` adds the start-up of the attempts up to the target
  epoch to the time to target: from the launcher's start to the end of the target epoch,
  less what lies between epochs (checkpoint writes), as in the time to target. Neither
  counts the queue wait or the SLURM allocation, nor an attempt that ended without a
  checkpoint (its entry is lost with it); both are null where any of their attempts has
  no start-up figure.

Pure Python: the trainer, the record and the tests use it.
"""

from __future__ import annotations

import math
import os

#: the launcher's start (time.time() of ``hvdscale launch``), for every rank
LAUNCH_START_ENV = "HVDSCALE_LAUNCH_START"


def stamp_env(started_at: float | None) -> dict[str, str]:
    """The ranks' variable for a launcher that started at ``started_at`` (none: {})."""
    if started_at is None:
        return {}
    return {LAUNCH_START_ENV: repr(float(started_at))}


def launch_stamp(environ=None) -> float | None:
    """The launcher's start from the environment; None where it is absent or not a
    finite number (a rank started by hand)."""
    raw = (os.environ if environ is None else environ).get(LAUNCH_START_ENV)
    try:
        value = float(raw) if raw not in (None, "") else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def startup_since(stamp: float | None, now: float) -> float | None:
    """Seconds from the launcher's ``stamp`` to ``now`` (both time.time()); None without a
    stamp, or where the clocks disagree (a negative span: rank 0 on a host whose clock is
    behind the launcher's)."""
    if stamp is None:
        return None
    span = float(now) - float(stamp)
    return round(span, 6) if span >= 0 else None


def total_startup(attempts: list[dict]) -> float | None:
    """The sum of the attempts' ``startup_s``; None where there is no attempt or any of
    them has no figure (older records, a rank started without the stamp)."""
    values = [a.get("startup_s") for a in attempts]
    if not values or any(v is None for v in values):
        return None
    return round(sum(float(v) for v in values), 6)


def launch_to_target(
    attempts: list[dict], target_epoch: int | None, time_to_target_s: float | None
) -> float | None:
    """Start-up of the attempts that began at or before the target epoch plus the time to
    target (training time); None where the target was not reached or a start-up figure
    is missing."""
    if target_epoch is None or time_to_target_s is None:
        return None
    startup = total_startup([a for a in attempts if int(a["start_epoch"]) <= int(target_epoch)])
    if startup is None:
        return None
    return round(startup + float(time_to_target_s), 6)
