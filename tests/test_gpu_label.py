"""A GPU label means a GPU: a run of a partition with GPUs whose ranks find none stops
before its first step, whatever the backend; a partition whose GPUs are emulated (the local
test cluster's, ``scaling.partitions.<name>.emulated_gpus``) trains on the CPU and its record
and the report say so. Real runs through `hvdscale launch` in the train env (a CPU-only
build: TensorFlow lists no GPU here)."""

from __future__ import annotations

import copy

import pytest
from conftest_train import (
    PARTITIONS,
    base_config,
    cached_data,
    launch,
    load_record,
    needs_train_env,
    write_config,
)

from hvdscale.config.load import validate_config
from hvdscale.report.provenance import collect

pytestmark = needs_train_env

ALPHA = {  # the emulated partition of the local cluster, shrunk to this machine
    "gpus_per_node": 2,
    "gpu_model": "A100",
    "cores_per_node": 2,
    "mem_mb_per_node": 8000,
    "runtime_min": 30,
}


def alpha_config(emulated: bool) -> dict:
    cfg = base_config(n_samples=400, train_shards=2, test_shards=1, epochs=2)
    cfg["scaling"]["partitions"] = {
        **copy.deepcopy(PARTITIONS),
        "alpha": {**ALPHA, "emulated_gpus": emulated},
    }
    cfg["scaling"]["sweeps"] = [
        {
            "name": "alpha",
            "partitions": ["alpha"],
            "workers": [1],
            "backends": ["mpi", "gloo", "nccl"],
            "batch_sizes": [8],
            "lr_rules": ["none"],
        }
    ]
    return cfg


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return cached_data(tmp_path_factory, n_samples=400, train_shards=2, test_shards=1)


@pytest.mark.parametrize("backend", ["mpi", "gloo", "nccl"])
def test_a_cpu_rank_of_a_gpu_partition_stops_before_its_first_step(tmp_path, small_data, backend):
    config = write_config(tmp_path / "config.json", alpha_config(emulated=False))
    run_id = f"alpha_{backend}_n1_w1_b8_lrnone_r0"
    out = tmp_path / run_id
    r = launch(config, run_id, small_data, out)
    text = r.stdout + r.stderr
    assert r.returncode != 0, text
    assert (
        f"run {run_id}: rank 0 on host " in text
        and "would train on the CPU, but partition 'alpha' has 2 GPUs per node; "
        "stopped before the first step."
        in text
    ), text
    assert "TensorFlow 2.15.1 lists no GPU: a CPU-only build" in text
    assert "tf.test.is_built_with_cuda() is False" in text and "CUDA_VISIBLE_DEVICES" in text
    assert "make setup-gpu" in text and "CUDA module" in text
    assert "epoch 1" not in text.lower()  # no step ran: no epoch line
    assert not (out / "metrics.json").exists()
    assert not (out / "checkpoint").exists()


def test_emulated_gpus_train_on_the_cpu_and_the_record_and_report_say_so(tmp_path, small_data):
    raw = alpha_config(emulated=True)
    config = write_config(tmp_path / "config.json", raw)
    run_id = "alpha_mpi_n1_w1_b8_lrnone_r0"
    out = tmp_path / run_id
    r = launch(config, run_id, small_data, out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    rec = load_record(out)
    assert rec["status"] == "completed"
    assert rec["config"]["gpus_per_node"] == 2 and rec["config"]["emulated_gpus"] is True
    assert rec["environment"]["devices"][0].startswith("CPU")
    assert rec["label_proof"]["ok"] and rec["label_proof"]["emulated_gpus"] is True
    # the report's system section (provenance: partitions of the config)
    info = collect(config_file=config, cfg=validate_config(raw), runs=None, provenance=None)
    assert "alpha: 2 x A100 (emulated GPUs (CPU)), 2 cores, 8 GB per node" in info["hardware"]
    raw["scaling"]["partitions"]["alpha"]["emulated_gpus"] = False
    info = collect(config_file=config, cfg=validate_config(raw), runs=None, provenance=None)
    assert "alpha: 2 x A100, 2 cores, 8 GB per node" in info["hardware"]
