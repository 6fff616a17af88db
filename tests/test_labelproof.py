"""Every run proves its label (hvdscale.record.labelproof, issue 12): world size, hosts, ranks
per host, devices, controller and the collective in Horovod's timeline against the
run_id. Records and timelines in the format training writes (no processes)."""

from __future__ import annotations

import json

import pytest

from hvdscale.launch.launchspec import horovod_env
from hvdscale.record.labelproof import EXPECTED, gpu_id, main, parse_cores, prove
from hvdscale.trainer.horovod_tf.step import host_reduction


def record(backend="gloo", workers=2, nodes=1, per_node=2, hosts=None, controller=None):
    return {
        "run_id": f"p_{backend}_n{nodes}_w{workers}_b75_lrnone_r0",
        "config": {
            "backend": backend,
            "workers": workers,
            "nodes": nodes,
            "workers_per_node": per_node,
            "controller": controller or ("mpi" if backend == "nccl" else backend),
        },
        "environment": {
            "hostnames": hosts or ["h1"] * workers,
            "devices": ["CPU (1 thread)"] * workers,
        },
    }


def timeline(path, activity: str, tensors=("grads_0", "grads_1")):
    """A Horovod timeline: one trace process per tensor, ALLREDUCE with the backend's
    activity nested inside (as Horovod 0.28 writes it)."""
    ev = []
    for pid, name in enumerate(tensors, 1):
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        for step in range(3):
            t = 1000 * step
            ev += [
                {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": pid, "tid": 0, "ts": t},
                {"ph": "E", "pid": pid, "tid": 0, "ts": t + 10},
                {"name": "ALLREDUCE", "ph": "B", "pid": pid, "tid": 0, "ts": t + 10},
                {"name": activity, "ph": "B", "pid": pid, "tid": 0, "ts": t + 11},
                {"ph": "E", "pid": pid, "tid": 0, "ts": t + 20},
                {"ph": "E", "pid": pid, "tid": 0, "ts": t + 21},
            ]
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in ev) + ",\n")  # left open
    return path


def test_gloo_run_proves_gloo_and_mpi_run_proves_mpi(tmp_path):
    p = prove(record("gloo"), timeline(tmp_path / "g.json", "GLOO_ALLREDUCE"))
    assert p["ok"] and p["collective"] == "GLOO_ALLREDUCE", p
    assert p["collective_counts"] == {"GLOO_ALLREDUCE": 6}
    p = prove(record("mpi"), timeline(tmp_path / "m.json", "MPI_ALLREDUCE"))
    assert p["ok"] and p["collective"] == "MPI_ALLREDUCE" and p["devices"] == {"CPU": 2}


def test_a_mislabelled_run_is_caught(tmp_path):
    # labelled gloo, but MPI carried the gradients and the controller was MPI
    p = prove(record("gloo", controller="mpi"), timeline(tmp_path / "t.json", "MPI_ALLREDUCE"))
    assert not p["ok"]
    assert any("MPI_ALLREDUCE" in m and "GLOO_ALLREDUCE" in m for m in p["problems"])
    assert any("controller was mpi" in m for m in p["problems"])
    # labelled nccl, ran on the CPU with MPI
    p = prove(record("nccl"), timeline(tmp_path / "n.json", "MPI_ALLREDUCE"))
    assert not p["ok"] and any("ran on the CPU" in m for m in p["problems"])


def test_hosts_and_sequential_fill():
    hosts = ["node1"] * 8 + ["node2"] * 8
    p = prove(record("mpi", 16, 2, 8, hosts=hosts))
    assert p["ok"] and p["ranks_per_host"] == {"node1": 8, "node2": 8}
    assert p["collective"] is None and not p["timeline_checked"]  # no timeline: not claimed
    p = prove(record("mpi", 16, 2, 8, hosts=["node1", "node2"] * 8))  # round robin
    assert not p["ok"] and any("sequential fill" in m for m in p["problems"])
    p = prove(record("mpi", 16, 2, 8, hosts=["node1"] * 16))
    assert not p["ok"] and any("1 distinct host" in m for m in p["problems"])
    p = prove(record("mpi", 4, 1, 8, hosts=["node1"] * 3))
    assert not p["ok"] and any("world size 3" in m for m in p["problems"])


def test_cli_exit_status(tmp_path, capsys):
    good, bad = tmp_path / "good", tmp_path / "bad"
    for d, rec, act in ((good, record("gloo"), "GLOO_ALLREDUCE"), (bad, record("gloo"), "MPI")):
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps(rec))
        timeline(d / "timeline.json", act if act != "MPI" else "MPI_ALLREDUCE")
    assert main([str(good)]) == 0
    assert main([str(good), str(bad)]) == 1
    assert "MISLABELLED" in capsys.readouterr().out


def test_nccl_under_label_mpi_is_mislabelled(tmp_path):
    """Issue 20: on a GPU node Horovod built with NCCL reduces GPU tensors with NCCL
    whatever the controller; a record labelled mpi whose timeline shows NCCL_ALLREDUCE
    is mislabelled (the expected collective per backend: nccl/mpi/gloo -> *_ALLREDUCE)."""
    assert EXPECTED == {
        "nccl": "NCCL_ALLREDUCE",
        "mpi": "MPI_ALLREDUCE",
        "gloo": "GLOO_ALLREDUCE",
    }
    rec = record("mpi")
    rec["environment"]["devices"] = ["GPU:0 (A100)", "GPU:1 (A100)"]
    p = prove(rec, timeline(tmp_path / "t.json", "NCCL_ALLREDUCE"))
    assert not p["ok"] and p["collective"] == "NCCL_ALLREDUCE", p
    assert p["expected_collective"] == "MPI_ALLREDUCE" and p["devices"] == {"GPU": 2}
    assert any("NCCL_ALLREDUCE" in m and "MPI_ALLREDUCE" in m for m in p["problems"])
    # the same label with the host-side reduction's timeline proves mpi
    assert prove(rec, timeline(tmp_path / "h.json", "MPI_ALLREDUCE"))["ok"]


@pytest.mark.parametrize(
    "device,env,host",
    [
        ("/GPU:0", {"HOROVOD_CPU_OPERATIONS": "mpi"}, True),
        ("/GPU:0", {"HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_CONTROLLER": "gloo"}, True),
        ("/GPU:0", {"HOROVOD_GPU_OPERATIONS": "NCCL"}, False),  # nccl: stays on the GPU
        ("/CPU:0", {"HOROVOD_CPU_OPERATIONS": "gloo"}, False),  # already on the host
        ("/CPU:0", {}, False),
    ],
)
def test_mpi_and_gloo_reduce_on_the_host_on_a_gpu(device, env, host):
    """The launcher's Horovod variables per backend (launchspec.horovod_env) decide it."""
    assert host_reduction(device, env) is host


@pytest.mark.parametrize("backend,host", [("mpi", True), ("gloo", True), ("nccl", False)])
def test_the_launchers_variables_say_which_backend_reduces_on_the_host(backend, host):
    assert host_reduction("/GPU:0", horovod_env({}, backend)) is host


# ------------------------------------------------- issue 29: GPUs and cores per rank


def with_devices(devices, hosts=None, cores=None, backend="nccl"):
    n = len(devices)
    rec = record(backend, n, len(set(hosts or ["h1"])), n, hosts=hosts)
    rec["environment"]["devices"] = list(devices)
    if cores is not None:
        rec["environment"]["cores"] = list(cores)
    return rec


def test_gpu_ids_come_from_the_device_labels():
    assert gpu_id("GPU:3 (CUDA_VISIBLE_DEVICES=3; NVIDIA A100-SXM4-40GB)") == "3"
    assert gpu_id("GPU:1 (CUDA_VISIBLE_DEVICES=0,1; NVIDIA A100)") == "1"  # the physical id
    assert gpu_id("GPU:0 (NVIDIA H100)") == "0" and gpu_id("GPU:2") == "2"
    assert gpu_id("GPU:GPU-5a1c (CUDA_VISIBLE_DEVICES=GPU-5a1c; A100)") == "GPU-5a1c"
    assert gpu_id("CPU (1 thread)") is None and gpu_id("CPU:0") is None


def test_two_ranks_on_one_host_with_the_same_gpu_are_a_problem():
    p = prove(with_devices(["GPU:0 (A100)", "GPU:0 (A100)"], hosts=["n1", "n1"]))
    assert not p["ok"] and "ranks 0 and 1 on host n1 share GPU 0" in p["problems"], p
    assert p["gpu_ids"] == ["0", "0"]
    # each task bound to its own GPU by SLURM: local index 0 each, physical ids differ
    labels = ["GPU:2 (CUDA_VISIBLE_DEVICES=2; A100)", "GPU:3 (CUDA_VISIBLE_DEVICES=3; A100)"]
    p = prove(with_devices(labels, hosts=["n1", "n1"]))
    assert p["ok"] and p["gpu_ids"] == ["2", "3"], p
    same = ["GPU:3 (CUDA_VISIBLE_DEVICES=3; A100)"] * 2
    p = prove(with_devices(same, hosts=["n1", "n1"]))
    assert p["problems"] == ["ranks 0 and 1 on host n1 share GPU 3"], p


def test_the_same_gpu_id_on_different_hosts_is_fine():
    rec = with_devices(["GPU:0 (A100)", "GPU:0 (A100)"], hosts=["n1", "n2"])
    rec["config"]["workers_per_node"] = 1
    p = prove(rec)
    assert p["ok"], p["problems"]


def test_cpu_ranks_have_no_gpu_and_no_gpu_problem():
    p = prove(record("gloo"))
    assert p["ok"] and p["gpu_ids"] == [None, None]
    assert p["cores"] is None and p["core_overlaps"] == []  # records before issue 29


def test_cores_and_their_overlaps_are_information_not_problems():
    p = prove(with_devices(["CPU:0"] * 3, cores=["0-3", "4-7", "8-11"], backend="gloo"))
    assert p["ok"] and p["cores"] == ["0-3", "4-7", "8-11"] and p["core_overlaps"] == []
    p = prove(with_devices(["CPU:0"] * 2, cores=["0-7", "0-7"], backend="gloo"))
    assert p["ok"], p["problems"]  # the OS placed them: allowed
    assert p["core_overlaps"] == ["ranks 0 and 1 on host h1 share cores 0,1,2,3,4,5,6,7"]
    rec = with_devices(["CPU:0"] * 2, hosts=["a", "b"], cores=["0-3", "0-3"], backend="gloo")
    rec["config"]["workers_per_node"] = 1
    assert prove(rec)["core_overlaps"] == []  # different hosts
    assert parse_cores("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11} and parse_cores("") == set()


# --------------------------------------------------------------------------- bound GPU ids


def bound(visible, hosts, backend="mpi", devices=None):
    """A record of a GPU job whose ranks trained on the CPU (no usable GPU: the emulated
    partition) with each rank's CUDA_VISIBLE_DEVICES as its launcher set it."""
    per_host = max(hosts.count(h) for h in hosts)
    rec = record(backend, len(hosts), len(set(hosts)), per_host, hosts=hosts)
    if devices is not None:
        rec["environment"]["devices"] = list(devices)
    rec["environment"]["visible_gpus"] = list(visible)
    return rec


def test_distinct_bound_gpus_per_host_prove_and_are_the_ranks_gpu_ids():
    # srun --gpus-per-task=1 on two nodes: 0, 1 on each; the same id on another host is fine
    p = prove(bound(["0", "1", "0", "1"], ["n1", "n1", "n2", "n2"]))
    assert p["ok"], p["problems"]
    assert p["gpu_ids"] == ["0", "1", "0", "1"]
    assert p["visible_gpus"] == ["0", "1", "0", "1"]


def test_two_ranks_of_one_host_bound_to_the_same_gpu_are_a_problem():
    p = prove(bound(["3", "3"], ["n1", "n1"]))
    assert not p["ok"]
    assert p["problems"] == ["ranks 0 and 1 on host n1 were bound GPU 3 (CUDA_VISIBLE_DEVICES)"]
    # a UUID binds as well as an ordinal
    p = prove(bound(["GPU-5a1c", "GPU-5a1c"], ["n1", "n1"]))
    assert p["problems"] == [
        "ranks 0 and 1 on host n1 were bound GPU GPU-5a1c (CUDA_VISIBLE_DEVICES)"
    ]


def test_several_or_no_visible_ids_bind_no_gpu():
    # gpu_bind none: every rank sees the node's GPUs (it takes its local rank's): no bound id
    p = prove(bound(["0,1", "0,1"], ["n1", "n1"]))
    assert p["ok"] and p["gpu_ids"] == [None, None], p
    p = prove(bound([None, None], ["n1", "n1"], backend="gloo"))  # CUDA_VISIBLE_DEVICES unset
    assert p["ok"] and p["gpu_ids"] == [None, None] and p["visible_gpus"] == [None, None]
    p = prove(bound(["", ""], ["n1", "n1"], backend="gloo"))  # CUDA_VISIBLE_DEVICES=""
    assert p["ok"] and p["gpu_ids"] == [None, None]


def test_a_gpu_rank_and_a_cpu_rank_bound_to_its_gpu_share_it():
    devices = ["GPU:3 (CUDA_VISIBLE_DEVICES=3; A100)", "CPU (1 thread)"]
    p = prove(bound(["3", "3"], ["n1", "n1"], backend="gloo", devices=devices))
    assert p["problems"] == ["ranks 0 and 1 on host n1 were bound GPU 3 (CUDA_VISIBLE_DEVICES)"]
    # two GPU ranks with the same id: the device labels say it (one problem, not two)
    p = prove(bound(["3", "3"], ["n1", "n1"], devices=[devices[0]] * 2))
    assert p["problems"] == ["ranks 0 and 1 on host n1 share GPU 3"]


def test_cli_prints_every_ranks_gpu_id_per_host(tmp_path, capsys):
    good, bad = tmp_path / "good", tmp_path / "bad"
    hosts = ["n1", "n1", "n2", "n2"]
    for d, visible in ((good, ["0", "1", "0", "1"]), (bad, ["0", "0", "0", "1"])):
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps(bound(visible, hosts)))
    assert main([str(good)]) == 0
    out = capsys.readouterr().out
    assert "  GPU ids on n1 (rank:id): 0:0 1:1\n  GPU ids on n2 (rank:id): 2:0 3:1\n" in out
    assert main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "MISLABELLED" in out and "GPU ids on n1 (rank:id): 0:0 1:0" in out
    assert "  - ranks 0 and 1 on host n1 were bound GPU 0 (CUDA_VISIBLE_DEVICES)" in out
    # a record without GPU ids (CPU partition, older records): no GPU line
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "metrics.json").write_text(json.dumps(record("gloo")))
    main([str(tmp_path / "cpu")])
    assert "GPU ids" not in capsys.readouterr().out


# --------------------------------------------------------------------------- device vs partition


def on_partition(rec: dict, gpus_per_node: int, emulated: bool | None = None) -> dict:
    """``rec`` as a run of partition ``alpha`` with ``gpus_per_node`` GPUs per node (the
    record's config says so since the label proof checks it); ``emulated``: the record's
    config.emulated_gpus (None: absent)."""
    rec["config"].update(partition="alpha", gpus_per_node=gpus_per_node)
    if emulated is not None:
        rec["config"]["emulated_gpus"] = emulated
    return rec


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_cpu_ranks_on_a_gpu_partition_are_mislabelled_whatever_the_backend(tmp_path, backend):
    """A crafted record: an mpi (or gloo) run of a partition with 8 GPUs per node whose
    ranks report CPU devices is rejected, even though its collective and hosts are right."""
    act = "MPI_ALLREDUCE" if backend == "mpi" else "GLOO_ALLREDUCE"
    for emulated in (None, False):
        p = prove(on_partition(record(backend), 8, emulated), timeline(tmp_path / "t.json", act))
        assert not p["ok"] and p["collective"] == act, p
        assert p["problems"] == [
            "partition alpha has 8 GPUs per node, but 2 rank(s) ran on the CPU (rank 0, 1)"
        ]
        assert p["gpus_per_node"] == 8 and p["emulated_gpus"] is False
    # the CLI says so too
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps(on_partition(record(backend), 8)))
    assert main([str(d)]) == 1


def test_one_cpu_rank_among_gpu_ranks_is_named():
    rec = on_partition(record("mpi", 4, 1, 4), 4)
    rec["environment"]["devices"] = [f"GPU:{i} (A100)" for i in range(3)] + ["CPU (1 thread)"]
    p = prove(rec)
    assert not p["ok"] and p["problems"] == [
        "partition alpha has 4 GPUs per node, but 1 rank(s) ran on the CPU (rank 3)"
    ]
    rec["environment"]["devices"][3] = "GPU:3 (A100)"
    assert prove(rec)["ok"]


def test_a_partition_with_emulated_gpus_may_train_on_the_cpu_but_nccl_may_not():
    p = prove(on_partition(record("mpi"), 8, emulated=True))
    assert p["ok"] and p["emulated_gpus"] is True and p["devices"] == {"CPU": 2}, p
    p = prove(on_partition(record("nccl"), 8, emulated=True))
    assert not p["ok"] and p["problems"] == [
        "backend nccl needs GPUs, but 2 rank(s) ran on the CPU (rank 0, 1)"
    ]
    p = prove(on_partition(record("nccl"), 8, emulated=False))
    assert p["problems"] == [
        "partition alpha has 8 GPUs per node and backend nccl needs GPUs, but 2 rank(s) "
        "ran on the CPU (rank 0, 1)"
    ]


def test_cpu_ranks_on_a_cpu_partition_are_fine():
    p = prove(on_partition(record("mpi"), 0, emulated=False))
    assert p["ok"] and p["gpus_per_node"] == 0, p
