"""The local SLURM cluster of scripts/slurm-cluster.sh: it comes up, runs batch jobs
and Horovod ranks under `srun --mpi=pmix`, spans two nodes in two-node mode, and
`down` leaves nothing of it running.

Needs root and Debian's slurm-wlm + munge (skipped otherwise); the Horovod tests need
Horovod in .venv-train (skipped otherwise).
"""

from __future__ import annotations

import re
import subprocess
import warnings
from pathlib import Path

import pytest
from required_layers import require_layer
from slurm_support import (  # noqa: F401  (fixtures are used by name)
    HOROVOD_ALLREDUCE,
    PARTITION,
    TRAIN_PYTHON,
    TWO_NODE_DIR,
    TWO_NODE_SUBNET,
    cluster_dir,
    cluster_mode,
    horovod_skip_reason,
    mode_args,
    our_processes,
    restore,
    run,
    run_cluster_script,
    slurm_cluster,
    slurm_cluster_two_nodes,
)

pytestmark = pytest.mark.slurm


def _hvd_lines(text: str) -> list[dict[str, str]]:
    return [
        dict(kv.split("=", 1) for kv in line.split()[1:])
        for line in text.splitlines()
        if line.startswith("HVD ")
    ]


@pytest.fixture
def needs_horovod():
    require_layer("horovod", horovod_skip_reason())


def test_cluster_is_up(slurm_cluster):
    status = run_cluster_script("status")
    assert status.returncode == 0, status.stdout + status.stderr
    sinfo = run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %T"], slurm_cluster)
    states = [line.split()[1] for line in sinfo.stdout.splitlines()]
    assert states and all(s == "idle" for s in states), sinfo.stdout
    assert slurm_cluster["SLURM_CONF"].startswith(str(cluster_dir()))
    config = run(["scontrol", "show", "config"], slurm_cluster).stdout
    assert re.search(r"^MinJobAge\s*=\s*600", config, re.MULTILINE), (
        "squeue status checks need MinJobAge >= 600"
    )


def test_up_twice_is_fine(slurm_cluster):
    again = run_cluster_script("up")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already up" in again.stdout


def test_sbatch_wait_job_is_visible(slurm_cluster, tmp_path):
    out = tmp_path / "job.out"
    submitted = run(
        [
            "sbatch",
            "--wait",
            "--parsable",
            "-p",
            PARTITION,
            "-o",
            str(out),
            "--wrap",
            'echo "job=$SLURM_JOB_ID host=$(hostname)"',
        ],
        slurm_cluster,
        timeout=120,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    assert job_id.isdigit(), submitted.stdout
    assert f"job={job_id}" in out.read_text()
    shown = run(["scontrol", "show", "job", job_id], slurm_cluster).stdout
    assert f"JobId={job_id}" in shown and "JobState=COMPLETED" in shown, shown
    # finished jobs stay visible to squeue (the Snakemake plugin's status command)
    queued = run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i|%T"], slurm_cluster).stdout
    assert queued.strip() == f"{job_id}|COMPLETED", queued


@pytest.mark.horovod
def test_srun_pmix_starts_two_horovod_ranks(slurm_cluster, needs_horovod, tmp_path):
    prog = tmp_path / "hvd_allreduce.py"
    prog.write_text(HOROVOD_ALLREDUCE)
    proc = run(
        ["srun", "--mpi=pmix", "-p", PARTITION, "-n", "2", str(TRAIN_PYTHON), str(prog)],
        slurm_cluster,
        timeout=300,
    )
    ranks = _hvd_lines(proc.stdout)
    assert sorted(r["rank"] for r in ranks) == ["0", "1"], proc.stdout + proc.stderr
    assert all(r["size"] == "2" and r["sum"] == "3" for r in ranks), proc.stdout


CRASH = re.compile(r"Segmentation fault|Address not mapped|signal 11")


def _sbatch_two_nodes(env: dict, script: Path, out: Path) -> str:
    out.unlink(missing_ok=True)
    cmd = ["sbatch", "--wait", "-p", PARTITION, "-N", "2", "-n", "2", "--ntasks-per-node=1"]
    proc = subprocess.run(
        [*cmd, "-o", str(out), str(script)], env=env, timeout=300, capture_output=True, text=True
    )
    text = out.read_text() if out.exists() else ""
    return text + (f"\nsbatch exit {proc.returncode}: {proc.stderr}" if proc.returncode else "")


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.multinode
def test_two_node_job_spans_both_nodes(slurm_cluster_two_nodes, needs_horovod, tmp_path):
    env = slurm_cluster_two_nodes
    sinfo = run(["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %T"], env).stdout.split("\n")
    assert sorted(line.split()[0] for line in sinfo if line) == ["node1", "node2"], sinfo
    prog = tmp_path / "hvd_allreduce.py"
    prog.write_text(HOROVOD_ALLREDUCE)
    script = tmp_path / "two_nodes.sh"
    # the MPI byte transfer layer is restricted to TCP on the veth subnet, so the
    # allreduce can only succeed if the ranks reach each other over the veths
    script.write_text(
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        "srun -l hostname | sort\n"
        "export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp "
        f"OMPI_MCA_btl_tcp_if_include={TWO_NODE_SUBNET}.0/24\n"
        # -K: a rank that dies ends the step at once (its peer would wait in the allreduce)
        f"srun --mpi=pmix -K1 -n 2 --ntasks-per-node=1 {TRAIN_PYTHON} {prog}\n"
    )
    out = tmp_path / "two_nodes.out"
    text = _sbatch_two_nodes(env, script, out)
    if len(_hvd_lines(text)) < 2 and CRASH.search(text):
        # seen once in a CI run (the other rank then waited 300 s), never in 35 runs of
        # this job here: a rank segfaults in OpenMPI's start-up (address nil). Said, then
        # tried once more; a second crash or any other failure fails the test.
        warnings.warn(f"two-node job: a rank crashed, trying again:\n{text[-2000:]}", stacklevel=1)
        text = _sbatch_two_nodes(env, script, out)
    hosts = dict(re.findall(r"^(\d+): (\S+)$", text, re.MULTILINE))
    assert set(hosts) == {"0", "1"} and hosts["0"] != hosts["1"], text
    ranks = _hvd_lines(text)
    assert len(ranks) == 2, text
    assert {r["host"] for r in ranks} == {"node1", "node2"}, text
    assert all(r["size"] == "2" and r["local_size"] == "1" and r["sum"] == "3" for r in ranks), text


def _other_cluster(root: Path) -> Path:
    """A directory shaped like another cluster of the script (its etc/slurm.conf)."""
    (root / "etc").mkdir(parents=True)
    (root / "run").mkdir()
    (root / "etc" / "slurm.conf").write_text("ClusterName=hvdlocal\n")
    return root


def test_up_replaces_the_config_link_a_killed_cluster_left(slurm_cluster, tmp_path):
    """A test run killed with its cluster up leaves /run/slurm/conf pointing at its
    directory; the next cluster's plugin jobs would run `srun` against that config (it
    failed a CI run this way). `up` takes the link back when that cluster is down and
    leaves it to that cluster, naming it, when it is still up (issue 29: several clusters
    side by side; each slurmd's jobs read their cluster's config from its own
    /etc/slurm, tests/test_multicluster.py)."""
    link = Path("/run/slurm/conf")
    mode = cluster_mode()
    other = _other_cluster(tmp_path / "other")
    (other / "run" / "slurmctld.pid").write_text("999999999\n")  # no such process
    live = None
    try:
        link.unlink()
        link.symlink_to(other / "etc")
        up = run_cluster_script(*mode_args(mode))
        assert up.returncode == 0, up.stdout + up.stderr
        assert "stale" in up.stdout, up.stdout
        assert link.readlink() == cluster_dir() / "etc"

        # the other cluster is up: its slurmctld pid carries its mark
        live = subprocess.Popen(
            ["sleep", "300"], env={"PATH": "/usr/bin:/bin", "HVD_SLURM_MARK": str(other)}
        )
        (other / "run" / "slurmctld.pid").write_text(f"{live.pid}\n")
        link.unlink()
        link.symlink_to(other / "etc")
        up = run_cluster_script(*mode_args(mode))
        assert up.returncode == 0, up.stdout + up.stderr
        assert str(other) in up.stdout and "left to it" in up.stdout, up.stdout
        assert link.readlink() == other / "etc", "a live cluster's link must be left alone"
    finally:
        if live is not None:
            live.kill()
            live.wait()
        if link.is_symlink() and link.readlink() != cluster_dir() / "etc":
            link.unlink()
        restore(mode)
    assert link.readlink() == cluster_dir() / "etc"


def test_down_stops_everything(slurm_cluster):
    before = cluster_mode()
    assert our_processes(), "the cluster should be running before down"
    try:
        down = run_cluster_script("down")
        assert down.returncode == 0, down.stdout + down.stderr
        left = our_processes()
        assert not left, f"processes of the cluster still alive after down: {left}"
        status = run_cluster_script("status")
        assert status.returncode == 3, status.stdout
        if not TWO_NODE_DIR.exists():  # no two-node cluster beside it (from up to down)
            assert not Path("/run/netns/hvd-node1").exists()
            assert "hvdscale-slurm-local" not in Path("/etc/hosts").read_text()
        link = Path("/run/slurm/conf")
        assert not (link.is_symlink() and str(link.readlink()).startswith(str(cluster_dir())))
        again = run_cluster_script("down")
        assert again.returncode == 0 and "already down" in again.stdout, again.stdout + again.stderr
    finally:
        restore(before)
