"""tests/run.sh's streams (tests/streams.py): each test runs in exactly one, the tests of
one cluster together, a bad stream name stops the session."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = [
    "tests/test_slurm_multinode.py",
    "tests/test_lmod_user.py",
    "tests/test_streams.py",
    "tests/test_pipeline.py",
    "tests/test_gpu_env.py",
    "tests/test_workload.py",
]


def collected(stream: str | None) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "HVDSCALE_TEST_STREAM"}
    if stream is not None:
        env["HVDSCALE_TEST_STREAM"] = stream
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + MODULES,
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return set(re.findall(r"^(tests/\S+::\S+)$", r.stdout, re.M))


def test_every_test_runs_in_exactly_one_stream():
    every = collected(None)
    streams = {name: collected(name) for name in ("cluster", "two-node", "apart", "rest")}
    assert set().union(*streams.values()) == every
    assert sum(map(len, streams.values())) == len(every)  # disjoint
    # the two-node tests share their cluster; the Lmod user brings up a cluster of its own
    assert streams["two-node"] == {t for t in every if "test_slurm_multinode" in t}
    assert streams["cluster"] == {t for t in every if "test_pipeline.py::test_slurm" in t}
    # marked stream("apart"): the GPU env's build and long training modules, beside the rest
    apart = ("test_lmod_user", "test_gpu_env", "test_workload")
    assert streams["apart"] == {t for t in every if any(m in t for m in apart)}
    assert streams["rest"] == {t for t in every if "test_streams" in t or "local_pipeline" in t}


def test_an_unknown_stream_stops_the_session():
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/test_streams.py"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "HVDSCALE_TEST_STREAM": "fast"},
    )  # fmt: skip
    assert r.returncode != 0
    want = "HVDSCALE_TEST_STREAM='fast': use one of cluster, two-node, apart, rest"
    assert want in r.stdout + r.stderr


def test_a_snakemake_call_that_lost_its_lock_folder_runs_once_more():
    """Only Snakemake's lost-lock-folder failure is run again, and only once."""
    import subprocess

    from streams import again_after_lock_race

    lost = (
        "FileNotFoundError: [Errno 2] No such file or directory: '/x/.snakemake/locks/0.input.lock'"
    )
    calls = []

    def run(results):
        def once():
            calls.append(1)
            return subprocess.CompletedProcess([], *results[len(calls) - 1])

        return once

    assert again_after_lock_race(run([(1, "", lost), (0, "done", "")])).returncode == 0
    assert len(calls) == 2
    calls.clear()
    assert again_after_lock_race(run([(1, "", lost), (1, "", lost)])).returncode == 1
    assert len(calls) == 2
    calls.clear()
    assert (
        again_after_lock_race(run([(1, "", "MissingInputException"), (0, "", "")])).returncode == 1
    )
    assert len(calls) == 1
