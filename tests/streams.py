"""The suite as streams that run at the same time (tests/run.sh, what ``make test`` runs).

Much of the suite waits rather than computes: the SLURM tests wait for the scheduler's
polls, for job start-up and for Snakemake, and one stream of tests keeps a 2-core machine
about one core busy. So ``make test`` runs four pytest sessions at once, each on the
tests of one stream:

- ``cluster``: every test on the one-node local cluster (``slurm_support.slurm_cluster``),
  in one session because they share its daemons;
- ``two-node``: every test on the two-node cluster with the emulated alpha partition
  (``slurm_support.slurm_cluster_two_nodes``, an instance of its own beside the
  one-node one), in one session for the same reason;
- ``apart``: the other SLURM tests (on clusters of their own: ``slurm_support.own_cluster``)
  and the tests marked ``stream("apart")``: the GPU env's build and the long training
  tests of test_train, test_train_target and test_workload, so that no stream waits for
  the others at the end;
- ``rest``: everything else.

``HVDSCALE_TEST_STREAM=<name>`` makes a session run only that stream's tests (the others
are deselected); unset, a session runs them all, in one stream, as before.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable

import pytest

ENV_VAR = "HVDSCALE_TEST_STREAM"
STREAMS = ("cluster", "two-node", "apart", "rest")


def stream_of(item: pytest.Item) -> str:
    """The stream a test runs in (see the module's docstring)."""
    fixtures = set(getattr(item, "fixturenames", ()))  # with the fixtures' own fixtures
    if "slurm_cluster_two_nodes" in fixtures:
        return "two-node"
    if "slurm_cluster" in fixtures:
        return "cluster"
    marker = item.get_closest_marker("stream")
    if marker is not None:
        name = marker.args[0]
        if name not in STREAMS:
            raise pytest.UsageError(f"{item.nodeid}: stream {name!r}; streams: {STREAMS}")
        return name
    return "apart" if item.get_closest_marker("slurm") else "rest"


def wanted_stream() -> str | None:
    name = os.environ.get(ENV_VAR, "").strip()
    if name and name not in STREAMS:
        raise pytest.UsageError(f"{ENV_VAR}={name!r}: use one of {', '.join(STREAMS)}")
    return name or None


def select_stream(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only the tests of the stream ``HVDSCALE_TEST_STREAM`` names (deselect the
    rest, as ``-m`` does)."""
    want = wanted_stream()
    if want is None:
        return
    keep, drop = [], []
    for item in items:
        (keep if stream_of(item) == want else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


#: Snakemake's failure when the folder of its lock files vanished while it wrote them
LOCK_RACE = re.compile(r"FileNotFoundError: .*\.snakemake/locks/\d+\.(input|output)\.lock")


def again_after_lock_race(
    run: Callable[[], subprocess.CompletedProcess],
) -> subprocess.CompletedProcess:
    """``run()`` (a Snakemake call in the checkout), once more when it failed only because
    another stream's Snakemake, ending in the same working directory, removed
    ``.snakemake/locks`` while this one wrote its lock file: Snakemake removes the whole
    folder when it ends, and the streams run several Snakemakes in the checkout at once.
    Such a call failed before it started any job."""
    out = run()
    if out.returncode != 0 and LOCK_RACE.search(f"{out.stdout or ''}{out.stderr or ''}"):
        print("snakemake lost its lock folder to another stream's Snakemake; running it again")
        out = run()
    return out
