"""Gloo under srun without ssh (hvdscale.slurm.rendezvous, issue 12): the slot plan equals
Horovod's own, the srun command line and environment, the per-rank exec wrapper, and
Horovod's rendezvous server started from the train env. Real processes, no SLURM
(the two-node runs are in tests/test_slurm_multinode.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest_train import TRAIN_PY
from required_layers import layer_skipif
from slurm_support import horovod_skip_reason

from hvdscale.errors import UserError
from hvdscale.launch.launchspec import build_launch
from hvdscale.slurm import rendezvous
from hvdscale.slurm.jobspec import JobSpec

needs_horovod = layer_skipif("horovod", horovod_skip_reason())
PROG = [str(TRAIN_PY), "-m", "hvdscale.cli", "train", "--run-id", "X"]
T = {"threads_per_worker": 1, "timeline": False, "horovod": {}}


def test_slot_plan_sequential_fill():
    plan = rendezvous.slot_plan(12, 8, ["n1", "n2"])
    assert [s.hostname for s in plan] == ["n1"] * 8 + ["n2"] * 4
    assert [s.local_rank for s in plan] == list(range(8)) + list(range(4))
    assert plan[9].local_size == 4 and plan[0].local_size == 8
    assert plan[9].cross_rank == 1 and plan[9].cross_size == 2  # local rank 1 on both
    assert plan[6].cross_size == 1  # local rank 6 exists on n1 only
    with pytest.raises(UserError, match="need 2 node"):
        rendezvous.slot_plan(12, 8, ["n1"])


@needs_horovod
@pytest.mark.parametrize("workers,per_node", [(1, 8), (8, 8), (12, 8), (16, 8), (5, 2)])
def test_slot_plan_is_horovods_plan(workers, per_node):
    hosts = ["a", "b", "c"]
    code = (
        "import json, sys; from horovod.runner.common.util.hosts import "
        "get_host_assignments, parse_hosts; "
        "print(json.dumps([s.__dict__ for s in get_host_assignments(parse_hosts(sys.argv[1]), "
        "int(sys.argv[2]))]))"
    )
    n = -(-workers // per_node)
    spec = ",".join(f"{h}:{min(per_node, workers - i * per_node)}" for i, h in enumerate(hosts[:n]))
    out = subprocess.run(
        [str(TRAIN_PY), "-c", code, spec, str(workers)], capture_output=True, text=True, check=True
    )
    theirs = json.loads(out.stdout)
    ours = [s.__dict__ for s in rendezvous.slot_plan(workers, per_node, hosts)]
    assert ours == theirs


def test_srun_gloo_spec_has_no_horovodrun_and_no_ssh():
    s = build_launch(
        launcher="srun",
        job=JobSpec("p", "gloo", 2, 16, 8, 8, 2),
        program_argv=PROG,
        training=T,
        hosts=["node1", "node2"],
    )
    assert s.launcher == "srun" and s.controller == "gloo"
    assert s.argv[:2] == ["srun", "--mpi=none"] and "horovodrun" not in " ".join(s.argv)
    assert "--distribution=block" in s.argv and "--ntasks-per-node=8" in s.argv
    assert s.argv[s.argv.index("-n") + 1] == "16" and s.argv[s.argv.index("-N") + 1] == "2"
    i = s.argv.index(rendezvous.MODULE)
    assert s.argv[i + 1 : i + 3] == ["exec", "--"] and s.argv[i + 3 :] == PROG
    assert s.env["HOROVOD_CONTROLLER"] == "gloo" and s.env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert s.env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == rendezvous.PORT_PLACEHOLDER
    assert s.env[rendezvous.PLAN_HOSTS] == "node1,node2"
    assert s.env["HVDSCALE_LAUNCHER"] == "srun"


def test_srun_gloo_needs_a_host_list_for_two_nodes(monkeypatch):
    for k in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(UserError, match="no host list"):
        job = JobSpec("p", "gloo", 2, 4, 2)
        build_launch(launcher="srun", job=job, program_argv=PROG, training=T)


def _exec(env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HOROVOD_"))}
    env.update(
        {rendezvous.PLAN_HOSTS: "n1,n2", rendezvous.PLAN_PER_NODE: "8"},
        **{rendezvous.PLAN_WORKERS: "16"},
    )
    env.update(env_extra)
    show = "import json, os; print(json.dumps({k: v for k, v in os.environ.items()}))"
    cmd = [sys.executable, "-m", rendezvous.MODULE, "exec", "--", sys.executable, "-c", show]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


def test_exec_sets_horovod_gloo_env_from_slurm_procid():
    out = _exec({"SLURM_PROCID": "10", "SLURM_NODEID": "1", "SLURM_LOCALID": "2"})
    assert out.returncode == 0, out.stderr
    env = json.loads(out.stdout)
    assert {k: env[k] for k in env if k.startswith("HOROVOD_")} == {
        "HOROVOD_HOSTNAME": "n2",
        "HOROVOD_RANK": "10",
        "HOROVOD_SIZE": "16",
        "HOROVOD_LOCAL_RANK": "2",
        "HOROVOD_LOCAL_SIZE": "8",
        "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2",
    }


def test_exec_refuses_a_placement_that_differs_from_the_plan():
    out = _exec({"SLURM_PROCID": "10", "SLURM_NODEID": "0", "SLURM_LOCALID": "10"})
    assert out.returncode == 2 and "distribution=block" in out.stderr


@needs_horovod
def test_rendezvous_server_starts_and_stops():
    s = build_launch(
        launcher="srun",
        job=JobSpec("p", "gloo", 1, 2, 2),
        program_argv=PROG,
        training=T,
        hosts=["localhost"],
    )
    with rendezvous.rendezvous_for(s, str(TRAIN_PY)):
        port = int(s.env["HOROVOD_GLOO_RENDEZVOUS_PORT"])
        import urllib.request

        # Horovod's KV store: an unknown key of a scope answers 404, i.e. the server is up
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/global/nothing", timeout=10)
        assert err.value.code == 404
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/global/nothing", timeout=5)
