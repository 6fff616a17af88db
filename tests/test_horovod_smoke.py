"""Horovod itself works: a 2-rank allreduce under horovodrun --gloo and under mpirun
(started with the same launcher code as the training runs) returns the right sum."""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from conftest_train import TRAIN_PY, needs_train_env, sub_env

from hvdscale.launch.launchspec import build_launch
from hvdscale.launch.runner import companion
from hvdscale.slurm.jobspec import JobSpec

SCRIPT = textwrap.dedent("""
    import sys
    import horovod.tensorflow as hvd
    hvd.init()
    import tensorflow as tf
    x = tf.constant([float(hvd.rank() + 1), 10.0 * (hvd.rank() + 1)])
    s = hvd.allreduce(x, op=hvd.Sum, name="smoke").numpy()
    ctl = "gloo" if hvd.gloo_enabled() else ("mpi" if hvd.mpi_enabled() else "none")
    line = f"RANK {hvd.rank()} SIZE {hvd.size()} SUM {s[0]:g} {s[1]:g} CONTROLLER {ctl}"
    with open(f"{sys.argv[1]}/rank-{hvd.rank()}.txt", "w") as fh:  # MPI may interleave stdout lines
        fh.write(line)
    print(line, flush=True)
""")


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
@pytest.mark.parametrize(
    "launcher,backend", [("horovodrun", "gloo"), ("mpirun", "mpi"), ("horovodrun", "mpi")]
)
def test_two_rank_allreduce_sum(tmp_path, launcher, backend):
    script = tmp_path / "smoke.py"
    script.write_text(SCRIPT)
    spec = build_launch(
        launcher=launcher,
        job=JobSpec("local", backend, 1, 2, 2),
        program_argv=[str(TRAIN_PY), str(script), str(tmp_path)],
        training={"threads_per_worker": 1},
        horovodrun=companion(str(TRAIN_PY), "horovodrun"),
    )
    env = sub_env()
    env.update(spec.env)
    r = subprocess.run(spec.argv, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for rank in (0, 1):
        line = (tmp_path / f"rank-{rank}.txt").read_text()
        assert (
            line == f"RANK {rank} SIZE 2 SUM 3 30 CONTROLLER {spec.controller}"
        )  # 1 + 2 and 10 + 20
        assert f"RANK {rank} SIZE 2 SUM 3 30" in r.stdout
    assert spec.controller == ("gloo" if backend == "gloo" else "mpi")
