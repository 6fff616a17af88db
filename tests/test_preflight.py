"""The preflight of a partition (hvdscale preflight, rule preflight_partition): planned
per partition like the runs' jobs, and run for real with the train env and the launcher:
a healthy partition passes; a train env without Horovod, a wrong gpu_model and an
unreadable data directory each fail with one message naming the check and its fix."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest_train import (
    PARTITIONS,
    base_config,
    cached_data,
    needs_train_env,
    python_without_horovod,
    write_config,
)
from required_layers import require_layer
from slurm_support import horovod_skip_reason

from hvdscale.config.load import validate_config
from hvdscale.launch.preflight import check_gpus
from hvdscale.slurm.preflight import GRADIENT_ELEMENTS, parse_gres, preflights

ALPHA = {
    "gpus_per_node": 8,
    "gpu_model": "A100",
    "emulated_gpus": True,
    "cores_per_node": 48,
    "mem_mb_per_node": 990000,
    "runtime_min": 30,
}


def config(backends=("mpi",), alpha_workers=None, **alpha) -> dict:
    cfg = base_config(n_samples=400, train_shards=2, test_shards=1, epochs=2, launcher="mpirun")
    cfg["scaling"]["sweeps"] = [
        {
            "name": "local",
            "partitions": ["local"],
            "workers": [1, 2],
            "backends": list(backends),
            "batch_sizes": [8],
            "lr_rules": ["none"],
        }
    ]
    if alpha_workers:
        cfg["scaling"]["partitions"] = {**copy.deepcopy(PARTITIONS), "alpha": {**ALPHA, **alpha}}
        cfg["scaling"]["sweeps"].append(
            {
                "name": "alpha",
                "partitions": ["alpha"],
                "workers": alpha_workers,
                "backends": ["mpi"],
                "batch_sizes": [8],
                "lr_rules": ["none"],
            }
        )
    return cfg


def test_one_preflight_per_partition_laid_out_like_its_runs():
    pfs = preflights(validate_config(config(backends=("mpi", "gloo"), alpha_workers=[1, 16])))
    assert list(pfs) == ["alpha", "local"]
    local = pfs["local"]
    assert local.nodes == 1 and local.checks == (("horovod-tf", "gloo"), ("horovod-tf", "mpi"))
    res = local.job.slurm_resources(1)
    assert res["nodes"] == 1 and res["tasks"] == 2 and res["slurm_partition"] == "local"
    alpha = pfs["alpha"]  # 16 workers span 2 nodes: the preflight's 2 ranks do too
    res = alpha.job.slurm_resources(1)
    assert alpha.nodes == 2 and res["nodes"] == 2 and res["tasks"] == 2
    assert res["gres"] == "gpu:1" and res["runtime"] == 10 and res["cpus_per_task"] == 6
    assert alpha.layout("horovod-tf", "gloo").backend == "gloo"
    assert alpha.node_hours == pytest.approx(2 * 10 / 60)
    # 1-node runs only: a 1-node preflight
    assert preflights(validate_config(config(alpha_workers=[1, 8])))["alpha"].nodes == 1
    # what it checks against is in its params: an edited gpu_model repeats it
    h100 = config(backends=("mpi", "gloo"), alpha_workers=[1, 16], gpu_model="H100")
    other = preflights(validate_config(h100))
    assert other["alpha"].slice() != alpha.slice() and other["local"].slice() == local.slice()
    assert alpha.slice()["partition_config"]["gpu_model"] == "A100"


def test_a_partition_of_1_worker_runs_gets_a_1_rank_preflight_that_fits_one_node():
    """A partition with one slot per node whose runs all have 1 worker (e.g. a 1-node
    partition) gets a 1-rank, 1-node preflight: a 2-rank job would need 2 nodes it may not
    have, and SLURM would leave it pending (PartitionConfig) for ever."""
    cfg = config(alpha_workers=[1], workers_per_node=1)
    pf = preflights(validate_config(cfg))["alpha"]
    res = pf.job.slurm_resources(1)
    assert pf.nodes == 1 and pf.job.workers == 1 and res["nodes"] == 1 and res["tasks"] == 1


def test_a_node_declares_its_gpus_in_its_gres():
    assert parse_gres("NodeName=node1 Arch=x86_64 Gres=gpu:a100:8(S:0-1) State=IDLE") == (
        8,
        "a100",
    )
    assert parse_gres("NodeName=node1 Gres=gpu:8 State=IDLE") == (8, "")
    assert parse_gres("NodeName=n Gres=(null) State=IDLE") == (0, "")


def _ranks(cvd=("0", "0")):
    return [
        {"rank": r, "node": f"node{r + 1}", "cuda_visible_devices": c, "gpus_listed": []}
        for r, c in enumerate(cvd)
    ]


def test_gpu_check_of_an_emulated_partition_compares_the_nodes_declaration():
    cfg = validate_config(config(alpha_workers=[16]))
    pf, part = preflights(cfg)["alpha"], cfg["scaling"]["partitions"]["alpha"]
    ok = check_gpus(pf, part, _ranks(), declared=lambda node: (8, "a100"))
    assert ok.ok and "emulated GPUs (CPU)" in ok.detail and "node2 declares gpu:a100:8" in ok.detail
    wrong = check_gpus(pf, {**part, "gpu_model": "H100"}, _ranks(), lambda n: (8, "a100"))
    assert not wrong.ok
    assert "declares GPUs of type a100" in wrong.detail and "gpu_model says H100" in wrong.detail
    assert "set scaling.partitions.alpha.gpu_model to the nodes' GPU (A100)" in wrong.fix
    count = check_gpus(pf, part, _ranks(), lambda n: (4, "a100"))
    assert not count.ok and "gpus_per_node to 4" in count.fix
    unbound = check_gpus(pf, part, _ranks(("0", None)), lambda n: (8, "a100"))
    assert not unbound.ok and "rank 1 on node2: CUDA_VISIBLE_DEVICES=None" in unbound.detail
    real = check_gpus(pf, {**part, "emulated_gpus": False}, _ranks(), lambda n: (8, "a100"))
    assert not real.ok and "the framework lists 0 GPU(s)" in real.detail
    assert "make setup-gpu" in real.fix


# --------------------------------------------------------------------------- real runs


def preflight(tmp_path, cfg: dict, data, *extra) -> tuple[subprocess.CompletedProcess, dict]:
    cfg_path = write_config(tmp_path / "config.json", cfg)
    out = tmp_path / "preflight" / "local.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    r = subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", "preflight", "--config", str(cfg_path)]
        + ["--partition", "local", "--data-dir", str(data), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return r, (json.loads(out.read_text()) if out.exists() else {})


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return cached_data(tmp_path_factory, n_samples=400, train_shards=2, test_shards=1)


@needs_train_env
def test_a_healthy_partition_passes(tmp_path, small_data):
    r, rec = preflight(tmp_path, config(), small_data)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert rec["ok"] and rec["partition"] == "local" and rec["nodes"] == 1
    names = [c["name"] for c in rec["checks"]]
    assert names == ["modules", "data", "train-env", "gpus", "allreduce horovod-tf mpi"]
    assert all(c["ok"] and c["seconds"] >= 0 for c in rec["checks"])
    checks = {c["name"]: c for c in rec["checks"]}
    assert "tensorflow 2.15.1, horovod 0.28.1" in checks["train-env"]["detail"]
    assert (
        f"2 ranks on 1 node(s): {GRADIENT_ELEMENTS:,} float32"
        in (checks["allreduce horovod-tf mpi"]["detail"])
    )
    assert not (tmp_path / "preflight" / ".local.ranks").exists()


@needs_train_env
def test_a_train_env_without_horovod_fails_naming_the_check_and_the_fix(tmp_path, small_data):
    wrapper = python_without_horovod(tmp_path)
    r, rec = preflight(tmp_path, config(), small_data, "--train-python", str(wrapper))
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    err = [line for line in r.stderr.splitlines() if line.startswith("ERROR: ")]
    assert len(err) == 1, r.stderr
    assert "preflight of partition local failed at check 'train-env'" in err[0]
    assert "cannot import horovod.tensorflow" in err[0] and "make setup" in err[0]
    assert not rec["ok"]


@needs_train_env
def test_an_unreadable_data_directory_fails_before_any_rank_starts(tmp_path, small_data):
    data = tmp_path / "data"
    shutil.copytree(small_data, data)
    manifest = json.loads((data / "manifest.json").read_text())
    shard = data / manifest["shards"]["train"][0]["file"]
    shard.write_bytes(b"")  # what a node reads from a file system that failed it
    r, rec = preflight(tmp_path, config(), data)
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert "failed at check 'data'" in r.stderr and str(shard) in r.stderr
    assert "readable from the partition's compute nodes" in r.stderr
    assert [c["name"] for c in rec["checks"]] == ["modules", "data"]  # no rank started
    r, rec = preflight(tmp_path, config(), tmp_path / "not-mounted")
    assert r.returncode == 1 and "not-mounted/manifest.json is not readable" in r.stderr


# --------------------------------------------------------------------------- workflow

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "results-test-preflight"
# one real training run (absolute target: no calibration; one worker: no allreduce sweep)
STUDY = {
    "training": {"max_epochs": 1, "warmup_epochs": 0, "target": {"mode": "absolute", "value": 10}},
    "scaling": {
        "sweeps": [
            {
                "name": "preflight",
                "partitions": ["local"],
                "workers": [1],
                "backends": ["mpi"],
                "batch_sizes": [75],
                "lr_rules": ["none"],
            }
        ]
    },
}
RUN = "local_mpi_n1_w1_b75_lrnone_r0"


def snakemake(*args, study: dict = STUDY) -> subprocess.CompletedProcess:
    (ROOT / RESULTS / "study.yaml").write_text(yaml.safe_dump(study))
    env = {k: v for k, v in os.environ.items() if k != "SNAKEMAKE_PROFILE"}
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/local", "--configfile"]
        + [".test/config/config.yaml", f"{RESULTS}/study.yaml"]
        + ["--config", f"results_dir={RESULTS}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,  # a hang guard for a loaded machine, not a tolerance
    )


def planned(text: str, rule: str) -> int:
    """How many jobs of ``rule`` a dry run's job table lists (0 when none)."""
    m = re.search(rf"^{rule}\s+(\d+)$", text, re.M)
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="module")
def finished_study():
    """A finished study (real Snakemake, real training, the local partition's preflight)."""
    require_layer("horovod", horovod_skip_reason())
    res = ROOT / RESULTS
    shutil.rmtree(res, ignore_errors=True)
    res.mkdir()
    out = snakemake()
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    yield res
    shutil.rmtree(res, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.horovod
def test_the_preflight_gates_runs_to_train_and_never_retrains_a_finished_one(finished_study):
    res = finished_study
    rec = json.loads((res / "preflight" / "local.json").read_text())
    assert rec["ok"] and [c["name"] for c in rec["checks"]][-1] == "allreduce horovod-tf mpi"
    print(f"local preflight: {rec['seconds']:.1f} s inside the job")  # the README's figure
    # the report's system section shows it
    text = subprocess.run(
        ["pdftotext", str(res / "report.pdf"), "-"], capture_output=True, text=True
    ).stdout
    assert "Preflight of partition local: passed" in text, text[-3000:]
    assert "allreduce horovod-tf mpi" in text and "153,441 float32 in" in text
    # the preflight is no input of the finished run: deleting it, or repeating it,
    # trains nothing again (a study from before the preflight is in the same state)
    (res / "preflight" / "local.json").unlink()
    dry = snakemake("-n")
    text = dry.stdout + dry.stderr
    assert dry.returncode == 0, text[-4000:]
    assert planned(text, "train_run") == 0 and planned(text, "preflight_partition") == 0, text
    # a new run on the partition: the preflight runs first, and only the new run trains
    more = copy.deepcopy(STUDY)
    more["scaling"]["sweeps"][0]["batch_sizes"] = [75, 150]
    dry = snakemake("-n", study=more)
    text = dry.stdout + dry.stderr
    assert dry.returncode == 0, text[-4000:]
    assert planned(text, "preflight_partition") == 1 and planned(text, "train_run") == 1, text
    assert f"run_id={RUN}" not in text, text  # the finished run: no job at all
    forced = snakemake("-n", "--forcerun", "preflight_partition", study=more)
    text = forced.stdout + forced.stderr
    assert planned(text, "train_run") == 1, text
