"""The GPU (NCCL) path of the torch-ddp trainer (issue 19 item 5), as far as a CPU can
check it: the device choice and its error, the trainer refusing nccl without a GPU with
that error, no TensorFlow/Horovod in the trainer's import chain (the GPU machine has
neither), and benchmarks/gpu_batch_sweep.py stopping clearly without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest_train import (
    PROJECT_ROOT,
    TRAIN_PY,
    base_config,
    run_train_code,
    train_code_env,
    write_config,
)

from hvdscale.errors import UserError
from hvdscale.trainer.torch_ddp.device import CudaFacts, choose_device

SWEEP = PROJECT_ROOT / "benchmarks" / "gpu_batch_sweep.py"
CPU_TORCH = CudaFacts("2.13.0+cpu", available=False, count=0)
NCCL_ID = "gpu_torch-ddp_nccl_n1_w1_b8_lrnone_r0"


def has_cpu_torch() -> bool:
    """torch in the train env, without a usable GPU (the CPU-only checks below)."""
    if not TRAIN_PY.exists():
        return False
    code = "import torch, sys; sys.exit(1 if torch.cuda.is_available() else 0)"
    return subprocess.run([str(TRAIN_PY), "-c", code], capture_output=True).returncode == 0


needs_cpu_torch = pytest.mark.skipif(
    not has_cpu_torch(), reason="needs torch without a GPU in .venv-train"
)


def train_env() -> dict:
    return train_code_env()


# --------------------------------------------------------------------------- device choice


def test_gloo_runs_on_the_cpu_whatever_gpus_there_are():
    assert choose_device("gloo", 0, "r", CPU_TORCH) == "cpu"
    assert choose_device("gloo", 1, "r", CudaFacts("2.11.0+cu128", True, 8)) == "cpu"


def test_nccl_takes_the_gpu_of_its_local_rank():
    cuda = CudaFacts("2.11.0+cu128", True, 2)
    assert choose_device("nccl", 0, "r", cuda) == "cuda:0"
    assert choose_device("nccl", 1, "r", cuda) == "cuda:1"


def test_nccl_without_a_cuda_build_names_the_run_backend_and_what_was_found():
    with pytest.raises(UserError) as exc:
        choose_device("nccl", 0, NCCL_ID, CPU_TORCH)
    msg = str(exc.value)
    assert NCCL_ID in msg and "backend nccl needs a CUDA build of torch" in msg
    assert "found torch 2.13.0+cpu, 0 GPUs" in msg and "is_available() is False" in msg


def test_nccl_with_fewer_gpus_than_local_ranks_is_refused():
    refused = r"run r: backend nccl: this rank \(local rank 2 on its node\) sees 2 GPUs"
    with pytest.raises(UserError, match=refused):
        choose_device("nccl", 2, "r", CudaFacts("2.11.0", True, 2))
    # one GPU that nothing bound to this task (CUDA_VISIBLE_DEVICES unset): not shared
    with pytest.raises(UserError, match=r"local rank 1 on its node\) sees 1 GPU .*share"):
        choose_device("nccl", 1, "r", CudaFacts("2.11.0", True, 1))


def test_nccl_uses_the_one_gpu_slurm_bound_to_the_task():
    # srun --gpus-per-task=1: CUDA_VISIBLE_DEVICES holds this task's one GPU
    assert choose_device("nccl", 1, "r", CudaFacts("2.11.0", True, 1, visible="1")) == "cuda:0"


def test_an_unknown_backend_is_refused():
    with pytest.raises(UserError, match="backend 'mpi'; expected gloo or nccl"):
        choose_device("mpi", 0, "r", CPU_TORCH)


@needs_cpu_torch
def test_cpu_helpers_sync_nothing_and_name_the_cpu_as_the_horovod_trainer():
    code = (
        "import torch\n"
        "from hvdscale.trainer.torch_ddp.device import CudaFacts, synchronizer, device_label\n"
        "f = CudaFacts.probe(); assert not f.available and f.count == 0, f\n"
        "assert f.torch_version == torch.__version__\n"
        "assert synchronizer(torch.device('cpu'))() is None\n"
        "print(device_label(torch.device('cpu')))\n"
    )
    r = run_train_code(code)
    assert r.stdout.strip() == "CPU:0"


# --------------------------------------------------------------------------- the trainer


@needs_cpu_torch
def test_the_torch_trainer_imports_neither_tensorflow_nor_horovod():
    """The train env has both installed: an import anywhere in the chain would load them."""
    code = (
        "import sys\n"
        "import hvdscale.cli, hvdscale.trainer.rank, hvdscale.trainer.torch_ddp.framework\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'horovod', "
        "'keras'))\n"
        "assert not bad, bad\n"
    )
    run_train_code(code)


def nccl_config(path: Path) -> Path:
    """The tests' config plus a GPU partition with a torch-ddp sweep over nccl."""
    cfg = base_config(n_samples=400, train_shards=2, test_shards=1, epochs=2)
    cfg["scaling"]["partitions"]["gpu"] = {
        "gpus_per_node": 1, "cores_per_node": 4, "mem_mb_per_node": 8000, "runtime_min": 30,
    }  # fmt: skip
    cfg["scaling"]["sweeps"].append({
        "name": "gpu", "frameworks": ["torch-ddp"], "partitions": ["gpu"], "workers": [1],
        "backends": ["nccl"], "batch_sizes": [8], "lr_rules": ["none"],
    })  # fmt: skip
    return write_config(path, cfg)


@needs_cpu_torch
def test_an_nccl_run_on_a_cpu_build_of_a_gpu_partition_stops_with_the_clear_error(tmp_path):
    config = nccl_config(tmp_path / "config.json")
    out = tmp_path / "run"
    cmd = [str(TRAIN_PY), "-m", "hvdscale.cli", "train", "--config", str(config), "--run-id",
           NCCL_ID, "--data-dir", str(tmp_path / "no-data"), "--out-dir", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=train_env(), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    # a rank of a GPU partition without a GPU: the partition's error, before any step
    assert f"run {NCCL_ID}: rank 0 on host " in r.stderr
    assert "would train on the CPU, but partition 'gpu' has 1 GPU per node" in r.stderr
    assert "a CPU-only build (torch.version.cuda is None)" in r.stderr
    assert "make setup-gpu" in r.stderr and "Traceback" not in r.stderr
    assert not (out / "metrics.json").exists()


# --------------------------------------------------------------------------- the sweep


@needs_cpu_torch
def test_the_gpu_sweep_stops_clearly_without_cuda(tmp_path):
    csv = tmp_path / "sweep.csv"
    cmd = [str(TRAIN_PY), str(SWEEP), "--work", str(tmp_path / "w"), "--out", str(csv)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=train_env(), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs a CUDA build of torch and a GPU (backend nccl); found torch" in r.stderr
    assert "0 GPUs" in r.stderr and "Traceback" not in r.stderr
    assert not csv.exists() and not (tmp_path / "w").exists()  # nothing ran


def sweep_module():
    sys.path.insert(0, str(SWEEP.parent))
    try:
        import gpu_batch_sweep
    finally:
        sys.path.remove(str(SWEEP.parent))
    return gpu_batch_sweep


def test_the_sweep_config_has_every_run_id_and_the_ratio_is_75_over_1000(tmp_path):
    from hvdscale.config.load import validate_config
    from hvdscale.matrix.runtable import find_run

    sweep = sweep_module()
    a = sweep.parse_args(["--batches", "75,1000", "--work", str(tmp_path)])
    cfg = validate_config(sweep.sweep_config(a))
    runs = [find_run(cfg, sweep.run_id(b)) for b in a.batches]
    assert [(r.framework, r.backend, r.workers, r.batch) for r in runs] == [
        ("torch-ddp", "nccl", 1, 75), ("torch-ddp", "nccl", 1, 1000)
    ]  # fmt: skip
    rows = [{"variant": "off/fp32", "batch": 75, "epoch_s": 7.0},
            {"variant": "off/fp32", "batch": 1000, "epoch_s": 2.0},
            {"variant": "max/bf16", "batch": 75, "epoch_s": 3.0},
            {"variant": "max/bf16", "batch": 1000, "epoch_s": 1.5}]  # fmt: skip
    assert sweep.add_ratio(rows) == {"off/fp32": 3.5, "max/bf16": 2.0}
    assert [r["epoch_ratio_75_to_1000"] for r in rows] == [3.5, 3.5, 2.0, 2.0]
    assert sweep.add_ratio([{"variant": "off/fp32", "batch": 75, "epoch_s": 1.0}]) == {
        "off/fp32": None
    }
    json.dumps(cfg)  # the snapshot the runs read


def test_the_sweep_plan_runs_the_first_variant_at_every_batch_then_the_others(tmp_path):
    from hvdscale.config.load import validate_config
    from hvdscale.errors import ConfigError

    sweep = sweep_module()
    a = sweep.parse_args(["--batches", "75,300,1000", "--variants", "off/fp32,max/bf16,off/tf32"])
    assert sweep.plan(a) == [("off/fp32", 75), ("off/fp32", 300), ("off/fp32", 1000),
                             ("max/bf16", 75), ("max/bf16", 1000),
                             ("off/tf32", 75), ("off/tf32", 1000)]  # fmt: skip
    cfg = validate_config(sweep.sweep_config(a, "max/bf16"))
    assert (cfg["training"]["compile"], cfg["training"]["precision"]) == ("max", "bf16")
    with pytest.raises(SystemExit):
        sweep.parse_variant("fast/fp8")
    # tf32 needs a GPU: the gloo (CPU partition) config of that variant is refused
    a = sweep.parse_args(["--backend", "gloo", "--variants", "off/fp32,off/tf32"])
    with pytest.raises(ConfigError, match="training.precision.*'tf32'.*gpus_per_node 0"):
        validate_config(sweep.sweep_config(a, "off/tf32"))


@pytest.mark.slow
@needs_cpu_torch
def test_the_sweep_runs_end_to_end_with_gloo_on_the_cpu(tmp_path):
    """The script's plumbing (prepare in the workflow env, the runs in the train env, the
    record's figures, the CSV) with the gloo backend; on a GPU it is the same with nccl."""
    work, csv = tmp_path / "w", tmp_path / "sweep.csv"
    common = ["--backend", "gloo", "--work", str(work), "--samples", "2000", "--epochs", "2",
              "--batches", "75,1000", "--commit", "abc123", "--variants", "off/fp32,default/bf16",
              "--variant-batches", "75", "--records", str(tmp_path / "rec")]  # fmt: skip
    r = subprocess.run([sys.executable, str(SWEEP), "--prepare-only", *common],
                       capture_output=True, text=True, env=train_env(), timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    cmd = [str(TRAIN_PY), str(SWEEP), *common, "--out", str(csv), "--max-load", "100"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=train_env(), timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    import csv as csvmod

    rows = list(csvmod.DictReader(csv.open()))
    assert [(x["variant"], int(x["batch"])) for x in rows] == [
        ("off/fp32", 75), ("off/fp32", 1000), ("default/bf16", 75)
    ]  # fmt: skip
    for x in rows:
        assert x["status"] == "completed" and x["device"] == "CPU:0" and x["commit"] == "abc123"
        assert float(x["epoch_s"]) > 0 and float(x["throughput"]) > 0 and x["load_before"]
    ratio = float(rows[0]["epoch_s"]) / float(rows[1]["epoch_s"])
    assert float(rows[0]["epoch_ratio_75_to_1000"]) == pytest.approx(ratio, rel=1e-4)
    eager, comp = rows[0], rows[2]
    assert eager["compile_mode"] == "" and comp["compile_mode"] == "default"
    assert comp["epoch_ratio_75_to_1000"] == ""  # no batch 1000 run of that variant
    rec = json.loads(
        (
            tmp_path / "rec" / "default-bf16" / sweep_rid(75, "_bf16_cdefault") / "metrics.json"
        ).read_text()
    )
    eager_rec = json.loads(
        (tmp_path / "rec" / "off-fp32" / sweep_rid(75) / "metrics.json").read_text()
    )
    # what was compiled, by torch's compile-cache counters rather than a clock: the
    # compiled variant went through Inductor's graph caches (built its graphs, or loaded
    # them: the sweep's run folders use Inductor's default cache, which an earlier sweep
    # on this machine may have filled), the eager one compiled nothing (null)
    looked_up = rec["config"]["compile_cache_hits"] + rec["config"]["compile_cache_misses"]
    assert looked_up > 0 and rec["config"]["compile_cache_dir"], rec["config"]
    assert [eager_rec["config"][k] for k in ("compile_cache_hits", "compile_cache_misses")] == [
        None,
        None,
    ]
    assert (rec["config"]["precision"], rec["config"]["compile"]) == ("bf16", "default")
    assert rec["summary"]["final_val_loss"] is not None
    assert rec["timing"]["warm_up_s"] == pytest.approx(float(comp["warm_up_s"]))
    # the report of the carried-back records, on the CPU machine (workflow env)
    out = tmp_path / "study"
    report = [sys.executable, str(SWEEP.parent / "gpu_report.py"), str(tmp_path / "rec"),
              str(out), "--config", str(work / "config-off-fp32.json")]  # fmt: skip
    r = subprocess.run(report, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "report.pdf").stat().st_size > 10_000
    systems = list(csvmod.DictReader((out / "scaling" / "systems.csv").open()))
    assert [(x["partition"], x["runs"], x["described"]) for x in systems] == [("cpu", "2", "2")]
    assert "cuda_build" in systems[0]  # empty here: a CPU build of torch
    assert (out / "plots" / "epoch_time_batch.png").is_file()
    bad = subprocess.run(report[:2] + [str(tmp_path / "nothing"), str(out)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "no run records" in bad.stderr


def sweep_rid(batch: int, tag: str = "") -> str:
    return f"cpu_torch-ddp_gloo_n1_w1_b{batch}_lrnone{tag}_r0"


@needs_cpu_torch
def test_the_cuda_comm_hook_timer_reads_its_events_only_at_flush():
    """On a GPU the hook's times are CUDA event pairs (NCCL futures complete at enqueue);
    they are summed per step and read after the block's synchronize. Fake events here."""
    code = (
        "from hvdscale.trainer.torch_ddp.step import CommHookTimer\n"
        "class E:\n"
        "    def __init__(self, ms): self.ms = ms\n"
        "    def elapsed_time(self, other): return other.ms - self.ms\n"
        "t = CommHookTimer(None, cuda=True)\n"
        "t._events += [(E(0), E(2)), (E(1), E(4))]\n"
        "t.end_step(); t.end_step()\n"
        "assert t.samples == [], t.samples\n"
        "t.flush()\n"
        "assert t.samples == [0.005], t.samples\n"
        "t.flush(); assert t.samples == [0.005]\n"
    )
    run_train_code(code)
