"""Training: unit tests of the pieces, and real 1- and 2-rank Horovod runs (no mocks).

The runs use a 6000-curve dataset made by the data pipeline's CLI (about 4500 train
samples in 4 shards, 1500 test samples in 2), 1 thread per rank, at most 2 ranks.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest_train import (
    TRAIN_PY,
    base_config,
    cached_data,
    check_plausible,
    fault_env,
    kill_group,
    launch,  # noqa: F401
    load_record,
    needs_train_env,
    run_train_code,
    start_launch,
    sub_env,
    train_data,  # noqa: F401  (pytest fixture)
    train_processes,
    wait_for,
    write_config,
)

from hvdscale.config.load import validate_config
from hvdscale.errors import DataError, UserError
from hvdscale.record.build import model_bytes
from hvdscale.record.timing import PHASES
from hvdscale.trainer.checkpoint import ResumeState
from hvdscale.trainer.data import plan_rows, steps_per_epoch
from hvdscale.trainer.horovod_tf.step import build_step_program
from hvdscale.trainer.horovod_tf.xla_cache import (
    DEVICE_TYPES_FLAG,
    FLAG,
    CacheWatch,
    cache_for_device,
    use_xla_cache,
)
from hvdscale.trainer.metrics import EpochMetrics
from hvdscale.trainer.model import check_parameter_count, parameter_count
from hvdscale.trainer.worker import WorkerInfo

# long training runs: in the stream "apart" of tests/run.sh, beside the rest
pytestmark = pytest.mark.stream("apart")

# --------------------------------------------------------------------------- unit


def test_thesis_model_has_153441_parameters():
    assert parameter_count(200, [192, 175, 24]) == 153441
    assert model_bytes(153441) == 613764  # 0.61 MB in float32


def test_expected_parameters_mismatch_is_a_clear_error():
    cfg = {
        "data": {"n_points": 200},
        "model": {"hidden_units": [100], "expected_parameters": 153441},
    }
    with pytest.raises(UserError, match="153441"):
        check_parameter_count(cfg)
    cfg["model"]["expected_parameters"] = None
    assert check_parameter_count(cfg) == 600 * 100 + 100 + 100 * 2 + 2


def test_plan_rows_whole_shards_when_divisible():
    counts = [10, 10, 11, 11]
    assert plan_rows(counts, 2, 0, "auto") == [(0, 0, 10), (1, 0, 10)]
    assert plan_rows(counts, 2, 1, "whole") == [(2, 0, 11), (3, 0, 11)]
    assert plan_rows(counts, 1, 0, "auto") == [(i, 0, c) for i, c in enumerate(counts)]


def test_plan_rows_slices_cover_every_sample_once():
    counts = [10, 11, 12]
    for workers in (2, 4, 5):
        seen = []
        for r in range(workers):
            plan = plan_rows(counts, workers, r, "auto")
            offs = [sum(counts[:i]) for i in range(len(counts))]
            seen += [offs[i] + k for i, lo, hi in plan for k in range(lo, hi)]
        assert seen == list(range(sum(counts)))


def test_plan_rows_whole_policy_refuses_uneven_division():
    with pytest.raises(DataError, match="3 shard.*2 workers"):
        plan_rows([10, 10, 10], 2, 0, "whole")


def test_steps_per_epoch_is_the_smallest_ranks_full_batches():
    assert steps_per_epoch([1109, 1110], 75, 1) == 14
    assert steps_per_epoch([1109, 1110], 75, 4) == 12
    with pytest.raises(DataError, match="fewer than one step"):
        steps_per_epoch([50, 1000], 75, 1)


def test_epoch_metrics_round_trip_and_reduction_without_horovod():
    m = EpochMetrics(0.5, 3.0, 6.0, 0.1, 0.2, 0.3, 0.4, 0.01, 1.0, 0.05, 8.0, 6.0, 4.0, 2.5)
    assert EpochMetrics.from_vector(m.to_vector()) == m
    assert m.phases == [0.1, 0.2, 0.3, 0.4] and m.val_loss == 0.5
    assert m.allreduce(WorkerInfo(), name="x") == m  # one worker: sums and means are itself
    assert m.noise_fields() == {"noise_steps": 4, "g_local_sq": 2.0, "g_global_sq": 1.5}
    with pytest.raises(ValueError, match="expected 15 values"):
        EpochMetrics.from_vector([1.0, 2.0])
    assert not EpochMetrics(float("nan"), 1, 1, 0, 0, 0, 0, 0, 0, 0).finite()
    assert not EpochMetrics(0.1, float("inf"), 1, 0, 0, 0, 0, 0, 0, 0).finite()


def test_checkpoint_interval(monkeypatch):
    """training.checkpoint_every_s: after every epoch at 0; otherwise once the interval has
    passed since the last checkpoint (or the start), and always after the last epoch."""
    import hvdscale.trainer.checkpoint as ck

    clock = [100.0]
    monkeypatch.setattr(ck.time, "monotonic", lambda: clock[0])
    c = ck.Checkpointer(Path("unused"), None, "r", "h", 1, 0, every_s=10)
    assert not c.due(last_epoch=False) and c.due(last_epoch=True)
    clock[0] = 109.9
    assert not c.due(last_epoch=False)
    clock[0] = 110.0
    assert c.due(last_epoch=False)
    monkeypatch.setattr(ck, "save_checkpoint", lambda *a: "saved")
    assert c.save(3, ResumeState(), []) == "saved"  # restarts the interval
    assert not c.due(last_epoch=False)
    c.every_s = 0
    assert c.due(last_epoch=False)
    c.enabled = False
    assert not c.due(last_epoch=True) and c.save(4, ResumeState(), []) is None


def test_resume_state_from_a_checkpoint_state():
    fresh = ResumeState.from_state(None)
    fresh.begin_attempt("t0")
    assert fresh.start_epoch == 0 and not fresh.resumed and fresh.attempts[0]["start_epoch"] == 0
    state = {"epoch": 1, "epochs": [{"epoch": 0}, {"epoch": 1}], "elapsed_s": 2.5}
    state["attempts"] = [{"started_utc": "t0", "start_epoch": 0}]
    r = ResumeState.from_state(state)
    r.begin_attempt("t1")
    assert r.start_epoch == 2 and r.resumed and r.elapsed_s == 2.5
    assert [a["start_epoch"] for a in r.attempts] == [0, 2] and r.utilisation_samples == []


def test_the_step_program_factory_takes_the_training_section_settings():
    class Recorded:  # stands in for StepProgram (whose constructor needs TensorFlow)
        def __init__(self, **kw):
            self.kw = kw

    tcfg = validate_config({})["training"]
    tcfg["horovod"].update(compression="fp16", backward_passes_per_step=2)
    tcfg["compile"] = "max"  # issue 32: XLA for the compute phase
    p = build_step_program(
        "model", "opt", WorkerInfo(), tcfg, train=(1, 2), test=(3, 4), val=(5, 6),
        batch=8, device="/cpu:0", program=Recorded,
    )  # fmt: skip
    assert p.kw == {
        **dict(model="model", optimizer="opt", worker=WorkerInfo(), batch=8, device="/cpu:0"),
        **dict(x_train=1, y_train=2, x_test=3, y_test=4, x_val=5, y_val=6),
        "in_device_memory": tcfg["data_in_device_memory"],
        "compression": "fp16",
        "backward_passes_per_step": 2,
        "xla": True,
        "loss_scaling": False,  # fp32: no loss scale
        "compile_cache": None,  # issue 32: XLA's persistent cache folder (the framework's)
        "loss": "mse",  # the workload's loss (stress-strain: mean squared error)
    }
    p = build_step_program(
        "m", "o", WorkerInfo(), tcfg, train=(1, 2), test=(3, 4), batch=8, device="d",
        in_device_memory=not tcfg["data_in_device_memory"], program=Recorded,
        compile_cache="results/cache/xla",
    )  # fmt: skip
    assert p.kw["compile_cache"] == "results/cache/xla"
    assert p.kw["in_device_memory"] is not tcfg["data_in_device_memory"]
    assert (p.kw["x_val"], p.kw["y_val"]) == (None, None)
    assert p.kw["xla"] is True
    tcfg["compile"] = "off"
    p = build_step_program("m", "o", WorkerInfo(), tcfg, train=(1, 2), test=(3, 4), batch=8,
                           device="d", program=Recorded)  # fmt: skip
    assert p.kw["xla"] is False
    tcfg["precision"] = "fp16"  # issue 32: a dynamic loss scale in the step
    p = build_step_program("m", "o", WorkerInfo(), tcfg, train=(1, 2), test=(3, 4), batch=8,
                           device="d", program=Recorded)  # fmt: skip
    assert p.kw["loss_scaling"] is True


FP16_STEP = """
import numpy as np, tensorflow as tf
from hvdscale.config.load import validate_config
from hvdscale.trainer.horovod_tf.optim import Optimisation
from hvdscale.trainer.horovod_tf.loss_scale import LOSS_SCALE_INITIAL
from hvdscale.trainer.horovod_tf.step import build_step_program
from hvdscale.trainer.worker import WorkerInfo

cfg = validate_config({"seed": 3})
cfg["training"]["precision"] = "fp16"  # past the matrix check, which wants a GPU for it
rng = np.random.default_rng(3)
x = rng.normal(size=(64, cfg["data"]["n_points"], 3)).astype(np.float32)
y = (rng.normal(size=(64, 2)) * 0.1).astype(np.float32)
optim = Optimisation.build(cfg, "none", 1, steps=4, seed=3)
assert optim.model.layers[-1].compute_dtype == "float16", optim.model.layers[-1].compute_dtype
assert all(v.dtype == tf.float32 for v in optim.model.trainable_variables)
program = build_step_program(optim.model, optim.optimizer, WorkerInfo(), cfg["training"],
                             train=(x, y), test=(x, y), batch=16, device="/CPU:0")
program.warm_up(4)
start = {"final": LOSS_SCALE_INITIAL, "skipped_updates": 0}
assert program.loss_scale_state() == {**start, "updates": 0}
w0 = [w.copy() for w in optim.model.get_weights()]
program.start_epoch(np.arange(64))
program.run_steps(0, 4, False)
loss, _ = program.epoch_results()
assert np.isfinite(loss) and loss > 0, loss
w1 = optim.model.get_weights()
assert all(np.all(np.isfinite(w)) for w in w1) and any((a != b).any() for a, b in zip(w0, w1))
assert program.loss_scale_state() == {**start, "updates": 4}
assert int(optim.optimizer.iterations.numpy()) == 4
# an overflowing scale: the update is skipped (weights and Adam untouched), the scale halves
program.loss_scale.assign(2.0**126)
program.start_epoch(np.arange(64))
program.run_steps(0, 1, False)
assert all((a == b).all() for a, b in zip(w1, optim.model.get_weights()))
assert int(optim.optimizer.iterations.numpy()) == 4
assert program.loss_scale_state() == {"final": 2.0**125, "skipped_updates": 1, "updates": 5}
print("ok")
"""


@pytest.mark.slow  # TensorFlow in train-env subprocesses
@pytest.mark.horovod
@needs_train_env
def test_the_fp16_step_scales_the_loss_and_skips_an_overflowing_update():
    """Issue 32: Horovod-TF's fp16 step (a mixed_float16 model, float32 weights) trains
    with a dynamic loss scale; a non-finite gradient skips the update (weights and the
    optimizer untouched) and halves the scale, as Keras' LossScaleOptimizer does. On the
    CPU (the matrix refuses fp16 there for real runs; TensorFlow computes float16 anyway)."""
    r = run_train_code(FP16_STEP, timeout=300, TF_CPP_MIN_LOG_LEVEL="2")
    assert r.stdout.strip().endswith("ok"), r.stdout


# --------------------------------------------------------------------------- runs


def _run_ok(cfg, rid, data, out, *extra, env=None):
    r = launch(cfg, rid, data, out, *extra, env=env)
    assert r.returncode == 0, (
        f"launch failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    )
    return load_record(out), r


FP32_EPOCHS = 3


@pytest.fixture(scope="module")
def fp32_one_rank_run(tmp_path_factory, train_data) -> dict:
    """The plain fp32 1-worker gloo run (graph step, compile off) of base_config, trained
    once for the tests that need it: its own checks, and the baseline of the bf16/XLA
    and the XLA-at-fp32 comparisons (the same seed, data and epochs). An hour between
    checkpoints: the one after the last epoch is written all the same. TensorFlow logs
    at level 0, so its output shows whether XLA compiled anything. Keys: rec, out, log,
    job_s (the launch's wall time, which the start-up must fit in)."""
    d = tmp_path_factory.mktemp("fp32_one_rank")
    cfg = write_config(
        d / "config.json",
        base_config(epochs=FP32_EPOCHS, compile="off", checkpoint_every_s=3600),
    )
    rid = "local_gloo_n1_w1_b75_lrnone_r0"
    out = d / "results" / "runs" / rid
    t0 = time.time()
    rec, r = _run_ok(cfg, rid, train_data, out, env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    job_s = time.time() - t0
    return {"rec": rec, "out": out, "log": r.stdout + r.stderr, "job_s": job_s}


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_one_rank_run_writes_a_valid_plausible_record(fp32_one_rank_run):
    rec, out, job_s = (fp32_one_rank_run[k] for k in ("rec", "out", "job_s"))
    check_plausible(rec, workers=1, epochs=FP32_EPOCHS)
    # issue 30 item 7: start-up from hvdscale launch's stamp to the epoch loop, inside the
    # job's wall time and outside its training time
    startup = rec["timing"]["startup_s"]
    assert 0 < startup < job_s and rec["resume"]["attempts"][0]["startup_s"] == startup
    assert startup + rec["epochs"][-1]["elapsed_s"] < job_s
    assert rec["config"]["launcher"] == "horovodrun" and rec["config"]["controller"] == "gloo"
    assert rec["config"]["data_in_device_memory"] is True
    rows = list(csv.DictReader((out / "history.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert float(rows[-1]["test_loss"]) == pytest.approx(rec["epochs"][-1]["test_loss"])
    assert float(rows[0]["val_loss"]) == pytest.approx(rec["epochs"][0]["val_loss"])
    assert rows[0]["test_loss"] == ""  # evaluated once, at the end
    assert (out / "checkpoint" / "LATEST").read_text().strip() == "epoch-0002"
    assert not (out / "failure.json").exists()
    # issue 13: rank 0's system description (the probes worked on this CPU machine)
    system = rec["system"]
    assert system["errors"] == {} and system["nodes"] == sorted(
        set(rec["environment"]["hostnames"])
    )
    assert system["cpu_model"] and system["horovod_gloo"] is True and system["gpus"] == []
    assert system["cuda_build"] == "" and system["mpi"] == rec["environment"]["mpi"]
    # issue 32: TensorFlow's oneDNN switch (on by default on x86), no torch in a Horovod rank
    assert system["cpu_kernels"].startswith("TensorFlow: oneDNN on (TF_ENABLE_ONEDNN_OPTS=")
    assert "PyTorch" not in system["cpu_kernels"]
    sync = rec["timing"]["sync"]  # issue 19: one worker, nothing to synchronise
    assert sync["allreduce_s"] == 0 == sync["exposed_s"] and sync["comm_hook_s"] is None


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
@pytest.mark.parametrize(
    "backend,launcher", [("gloo", "horovodrun"), ("mpi", "mpirun"), ("mpi", "horovodrun")]
)
def test_two_rank_run_writes_a_valid_plausible_record(tmp_path, train_data, backend, launcher):
    cfg = write_config(tmp_path / "config.json", base_config(epochs=4))
    out = tmp_path / "run"
    rec, _ = _run_ok(
        cfg, f"local_{backend}_n1_w2_b75_lrnone_r0", train_data, out, "--launcher", launcher
    )
    check_plausible(rec, workers=2, epochs=4)
    assert rec["config"]["launcher"] == launcher
    assert rec["timing"]["startup_s"] > 0  # the launcher's stamp reached rank 0 (issue 30)
    assert rec["config"]["controller"] == ("gloo" if backend == "gloo" else "mpi")
    assert rec["config"]["horovod_env"]["HOROVOD_CPU_OPERATIONS"] == backend
    assert rec["config"]["global_batch"] == 150
    cores = rec["environment"]["cores"]  # issue 29: each rank's affinity after binding
    assert len(cores) == 2 and all(cores) and rec["label_proof"]["cores"] == cores
    assert rec["label_proof"]["gpu_ids"] == [None, None]
    # issue 29: each rank's CUDA_VISIBLE_DEVICES as its launcher passed it (unset here)
    assert rec["environment"]["visible_gpus"] == [os.environ.get("CUDA_VISIBLE_DEVICES")] * 2
    # each rank read only its own two whole shards
    assert [row[0] for row in rec["data"]["rank0_train_rows"]] == [
        "train/shard-0000.h5",
        "train/shard-0001.h5",
    ]
    counts = rec["data"]["counts"]
    assert sum(rec["data"]["train_samples_per_rank"]) == counts["train"]
    assert (
        rec["data"]["test_values"] == 2 * counts["test"]
    )  # the full test split, sharded across the ranks
    sync = rec["timing"]["sync"]  # issue 19: Horovod does not overlap: exposed = allreduce
    per_step = sorted(e["time_sync_s"] / e["steps"] for e in rec["epochs"] if not e["warmup"])
    # the record rounds to 9 decimals (timing._round): a sync of 0.4 ms keeps 6 digits
    assert sync["allreduce_s"] == pytest.approx(per_step[1], abs=5e-10) and per_step[1] > 0
    assert sync["exposed_s"] == sync["allreduce_s"]
    assert sync["comm_hook_s"] is None and sync["no_comm_step_s"] is None
    assert "Horovod" in sync["definition"]


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_a_bf16_xla_run_records_its_settings_and_learns(tmp_path, train_data, fp32_one_rank_run):
    """Issue 32 for Horovod-TF: precision bf16 (Keras' mixed_bfloat16 policy on the Dense
    layers, float32 weights) and compile default (XLA for the compute phase, compiled in
    the warm-up): the record states both and its warm-up time, and the run learns as the
    fp32 graph run does: its validation loss falls and ends within a factor 2.5 of the
    fp32 run's after the same 3 epochs (early training at this learning rate amplifies
    the arithmetic's difference: measured 0.0071 against 0.0116)."""
    extra = {"precision": "bf16", "compile": "default"}
    cfg = write_config(tmp_path / "bf16.json", base_config(epochs=FP32_EPOCHS, **extra))
    # the run id names a step setting other than fp32/off
    bf16, _ = _run_ok(cfg, "local_gloo_n1_w1_b75_lrnone_bf16_cdefault_r0", train_data,
                      tmp_path / "bf16")  # fmt: skip
    fp32 = fp32_one_rank_run["rec"]
    check_plausible(bf16, workers=1, epochs=FP32_EPOCHS)
    assert (bf16["config"]["precision"], bf16["config"]["compile"]) == ("bf16", "default")
    assert (fp32["config"]["precision"], fp32["config"]["compile"]) == ("fp32", "off")
    # the compilation is in the warm-up (its time is recorded; comparing the two runs'
    # warm-ups would be a timing assertion: CI measured 1.12 s with XLA against 1.39 s)
    assert bf16["timing"]["warm_up_s"] > 0 and fp32["timing"]["warm_up_s"] > 0
    assert bf16["initial_weights_sha256"] == fp32["initial_weights_sha256"]  # float32 weights
    v32, v16 = fp32["epochs"][-1]["val_loss"], bf16["epochs"][-1]["val_loss"]
    assert bf16["epochs"][-1]["val_loss"] < bf16["epochs"][0]["val_loss"]
    assert 0.4 < v16 / v32 < 2.5 and v16 != v32  # measured: 0.0071 against 0.0116


# --------------------------------------------------------------------------- XLA's cache


def test_xla_cache_goes_into_the_results_folder_for_gpu_ranks(tmp_path):
    """use_xla_cache: results/runs/RUN -> results/cache/xla for XLA's GPU device, added to
    TF_XLA_FLAGS after the flags already there; a folder the flags name already is kept;
    no cache for a run folder outside a ``runs`` folder. cache_for_device: a GPU rank uses
    it, a CPU rank not (TF 2.15 cannot store CPU executables), and flags that would make a
    CPU rank use it are refused."""
    env = {"TF_XLA_FLAGS": "--tf_xla_auto_jit=0"}
    got = use_xla_cache(tmp_path / "results" / "runs" / "r_r0", env)
    assert got == str((tmp_path / "results" / "cache" / "xla").resolve())
    ours = f"{FLAG}={got} {DEVICE_TYPES_FLAG}=XLA_GPU_JIT"
    assert env["TF_XLA_FLAGS"] == f"--tf_xla_auto_jit=0 {ours}"
    assert cache_for_device(got, "/GPU:0", env) == got
    assert cache_for_device(got, "/CPU:0", env) is None
    assert cache_for_device(None, "/GPU:0", env) is None
    mine = {"TF_XLA_FLAGS": f"{FLAG}={tmp_path / 'mine'}"}
    assert use_xla_cache(tmp_path / "results" / "runs" / "r_r0", mine) == str(tmp_path / "mine")
    assert mine["TF_XLA_FLAGS"] == f"{FLAG}={tmp_path / 'mine'}"
    assert cache_for_device(str(tmp_path / "mine"), "/GPU:0", mine) == str(tmp_path / "mine")
    with pytest.raises(UserError, match=f"TF_XLA_FLAGS.*{DEVICE_TYPES_FLAG}=XLA_GPU_JIT"):
        cache_for_device(str(tmp_path / "mine"), "/CPU:0", mine)
    env = {}
    assert use_xla_cache(tmp_path / "elsewhere", env) is None and env == {}
    assert use_xla_cache(None, env) is None and env == {}


def test_xla_cache_watch_counts_entries_stored_and_loaded(tmp_path):
    """CacheWatch: an entry written (new or rewritten) during the watch is a miss; one that
    was there before and was opened (read) is a hit; one left alone is neither."""
    folder = tmp_path / "xla"
    folder.mkdir()
    for name in ("loaded.pb", "rewritten.pb", "untouched.pb"):
        (folder / name).write_bytes(b"entry")
    watch = CacheWatch(folder)
    assert (folder / "loaded.pb").read_bytes() == b"entry"
    (folder / "rewritten.pb").write_bytes(b"another entry")
    (folder / "new.pb.tmp").write_bytes(b"x")  # XLA writes a .tmp file, then renames it
    (folder / "new.pb.tmp").rename(folder / "new.pb")
    assert watch.record() == {"compile_cache_dir": str(folder), "compile_cache_hits": 1,
                              "compile_cache_misses": 2}  # fmt: skip


XLA_CPU_CACHE = """
import os, sys
os.environ["TF_XLA_FLAGS"] = sys.argv[1]
import tensorflow as tf
tf.config.set_visible_devices([], "GPU")
w = tf.Variable(tf.ones([8, 4]))

@tf.function(jit_compile=True)
def grads(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, w) ** 2)
    return loss, tape.gradient(loss, [w])

step = tf.function(lambda x: grads(x)[0], autograph=False)  # as in StepProgram
try:
    print("loss", float(step(tf.ones([3, 8]))))
except tf.errors.InternalError as e:
    print("failed:", " ".join(e.message.split()))
"""


@pytest.mark.slow  # TensorFlow in train-env subprocesses
@pytest.mark.horovod
@needs_train_env
def test_tf_xla_cannot_cache_cpu_executables_and_the_cache_flags_skip_the_cpu(tmp_path):
    """Why XLA's persistent cache is for GPU ranks only (xla_cache): with the pinned
    TensorFlow 2.15.1 a cache folder that applies to XLA's CPU device makes the CPU
    compilation fail (TF issue 57649; should a newer TF store CPU executables, this test
    fails and the CPU can have the cache too); the flags use_xla_cache sets leave the CPU
    compiling as without a cache, and store nothing."""
    plain = tmp_path / "plain"
    plain.mkdir()
    r = run_train_code(XLA_CPU_CACHE.replace("sys.argv[1]", repr(f"{FLAG}={plain}")),
                       TF_CPP_MIN_LOG_LEVEL="2")  # fmt: skip
    assert r.stdout.startswith("failed:"), r.stdout
    assert "TargetRegistry::lookupTarget failed" in r.stdout, r.stdout
    env = {}
    folder = use_xla_cache(tmp_path / "results" / "runs" / "r_r0", env)
    r = run_train_code(XLA_CPU_CACHE.replace("sys.argv[1]", repr(env["TF_XLA_FLAGS"])),
                       TF_CPP_MIN_LOG_LEVEL="2")  # fmt: skip
    assert r.stdout.split() == ["loss", "768.0"], r.stdout  # 3 rows x 4 columns x 8^2
    assert not Path(folder).exists() or not any(Path(folder).iterdir())


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_xla_step_gives_the_graph_steps_losses_at_fp32(tmp_path, train_data, fp32_one_rank_run):
    """Issue 32: at fp32 the XLA-compiled compute phase trains as the plain graph step does:
    the same initial weights and shuffle, every epoch's train and validation loss within
    rtol 1e-4 (XLA fuses and orders the float32 sums its own way). That XLA really ran:
    compile default, a warm-up, and TensorFlow's log line of the first XLA compilation.
    A study's CPU run keeps no XLA cache (compile_cache_* null; xla_cache says why)."""
    cfg = write_config(tmp_path / "xla.json", base_config(epochs=FP32_EPOCHS, compile="default"))
    rid = "local_gloo_n1_w1_b75_lrnone_cdefault_r0"
    out = tmp_path / "results" / "runs" / rid
    r = launch(cfg, rid, train_data, out, env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert r.returncode == 0, f"launch failed ({r.returncode}):\n{r.stderr[-5000:]}"
    graph, xla = fp32_one_rank_run["rec"], load_record(out)
    logs = {"graph": fp32_one_rank_run["log"], "xla": r.stdout + r.stderr}
    check_plausible(xla, workers=1, epochs=FP32_EPOCHS)
    assert (graph["config"]["compile"], xla["config"]["compile"]) == ("off", "default")
    assert xla["timing"]["warm_up_s"] > 0
    assert "Compiled cluster using XLA" in logs["xla"]
    assert "Compiled cluster using XLA" not in logs["graph"]
    for rec in (graph, xla):
        assert [rec["config"][f"compile_cache_{k}"] for k in ("dir", "hits", "misses")] == [
            None, None, None]  # fmt: skip
    assert not (tmp_path / "results" / "cache" / "xla").exists()
    assert graph["initial_weights_sha256"] == xla["initial_weights_sha256"]
    for key in ("train_loss", "val_loss"):
        g, x = [e[key] for e in graph["epochs"]], [e[key] for e in xla["epochs"]]
        assert x == pytest.approx(g, rel=1e-4), key


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_host_input_path_and_instrument_every(tmp_path, train_data):
    cfg = write_config(
        tmp_path / "config.json",
        base_config(
            epochs=3, data_in_device_memory=False, steps_per_execution=8, instrument_every=2
        ),
    )
    rec, _ = _run_ok(cfg, "local_gloo_n1_w1_b75_lrnone_r0", train_data, tmp_path / "run")
    check_plausible(rec, workers=1, epochs=3)  # 8 steps per call: launch overhead not amortised
    assert rec["config"]["data_in_device_memory"] is False
    assert all(0 < e["timed_steps"] < e["steps"] for e in rec["epochs"])


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_a_two_rank_xla_run_keeps_horovods_allreduce_outside_the_compiled_part(
    tmp_path, train_data
):
    """Issue 32: compile default on 2 Gloo ranks. XLA compiles each rank's forward and
    backward pass in the warm-up; Horovod's allreduce stays outside it, so the record's
    sync phase and separate allreduce are measured as in a graph run, the label proof
    holds and the run learns. The run id names the setting (_cdefault)."""
    cfg = write_config(tmp_path / "config.json", base_config(epochs=3, compile="default"))
    rid = "local_gloo_n1_w2_b75_lrnone_cdefault_r0"
    r = launch(cfg, rid, train_data, tmp_path / rid, env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert r.returncode == 0, f"launch failed ({r.returncode}):\n{r.stderr[-5000:]}"
    rec = load_record(tmp_path / rid)
    check_plausible(rec, workers=2, epochs=3)
    assert rec["run_id"] == rid and rec["config"]["compile"] == "default"
    assert rec["config"]["workers"] == 2 and rec["label_proof"]["ok"]
    assert rec["timing"]["warm_up_s"] > 0
    assert "Compiled cluster using XLA" in r.stdout + r.stderr
    timed = [e for e in rec["epochs"] if not e["warmup"]]
    assert all(e["time_sync_s"] > 0 for e in timed)  # the allreduce ran, outside XLA
    assert rec["timing"]["sync"]["allreduce_s"] > 0
    assert rec["epochs"][-1]["val_loss"] < rec["epochs"][0]["val_loss"]


# Tolerance for the same global batch on 1 and 2 ranks (also stated in docs/timing.md):
# after the same number of samples (6 epochs x 27 steps x 150 samples) the validation
# loss and the mean train loss, each smoothed over the last three epochs, agree within 30 %
# and 15 % (relative). The runs differ only in the order the samples are visited (each
# rank shuffles its own shards). Measured with the val split and the derived seed (issue
# 16): about 7 % and 4 % smoothed; a single epoch's train loss differed by 34 % (a bump
# in one run's epoch 5), which is why the train loss is smoothed too.
SAME_GLOBAL_BATCH_TEST_RTOL = 0.30
SAME_GLOBAL_BATCH_TRAIN_RTOL = 0.15


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_one_and_two_ranks_with_the_same_global_batch_agree(tmp_path, train_data):
    cfg = write_config(tmp_path / "config.json", base_config(epochs=6))
    one, _ = _run_ok(cfg, "local_gloo_n1_w1_b150_lrnone_r0", train_data, tmp_path / "w1")
    two, _ = _run_ok(cfg, "local_gloo_n1_w2_b75_lrnone_r0", train_data, tmp_path / "w2")
    assert one["config"]["global_batch"] == two["config"]["global_batch"] == 150
    assert one["config"]["gloo_epoll_yield"] and two["config"]["gloo_epoll_yield"]  # Gloo ranks
    assert [e["samples"] for e in one["epochs"]] == [e["samples"] for e in two["epochs"]]

    def smoothed_test(rec):  # the validation loss: the test split is evaluated once
        return sum(e["val_loss"] for e in rec["epochs"][-3:]) / 3

    t1, t2 = smoothed_test(one), smoothed_test(two)
    assert abs(t1 - t2) <= SAME_GLOBAL_BATCH_TEST_RTOL * max(t1, t2), (t1, t2)
    r1, r2 = (sum(e["train_loss"] for e in rec["epochs"][-3:]) / 3 for rec in (one, two))
    assert abs(r1 - r2) <= SAME_GLOBAL_BATCH_TRAIN_RTOL * max(r1, r2), (r1, r2)
    for rec in (one, two):
        assert rec["summary"]["final_test_loss"] < 0.3 * rec["epochs"][0]["val_loss"]


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
@pytest.mark.parametrize("workers,batch", [(1, 8), (2, 8)])
def test_resume_after_the_launcher_group_is_killed(tmp_path, train_data, workers, batch):
    cfg = write_config(tmp_path / "config.json", base_config(epochs=4))
    rid = f"local_gloo_n1_w{workers}_b{batch}_lrnone_r0"
    out = tmp_path / "run"
    proc = start_launch(cfg, rid, train_data, out)
    try:
        wait_for(
            lambda: (out / "checkpoint" / "epoch-0001" / "state.json").exists(),
            240,
            "the checkpoint of epoch 1",
            proc,
        )
    finally:
        kill_group(proc)  # SIGKILL to launch, horovodrun and everything in their group
        proc.wait()
    # ranks in other process groups notice that their launcher is gone and exit
    wait_for(lambda: not train_processes(out), 30, "the orphaned ranks to exit", interval=0.2)
    assert not (out / "metrics.json").exists()
    rec, r = _run_ok(cfg, rid, train_data, out)  # the same command again
    assert "resuming from" in r.stdout
    attempts = rec["resume"]["attempts"]
    assert rec["resume"]["resumed"] is True
    assert [a["start_epoch"] for a in attempts] == [
        0,
        2,
    ]  # epochs 0 and 1 were done: resume at 2, not 0
    assert [e["epoch"] for e in rec["epochs"]] == [0, 1, 2, 3]
    assert [e["attempt"] for e in rec["epochs"]] == [1, 1, 2, 2]
    check_plausible(rec, workers=workers, epochs=4)
    tr = [e["train_loss"] for e in rec["epochs"]]
    assert tr[2] < 1.25 * tr[1], f"restart spike: {tr}"  # continues, does not start over
    # the same as an uninterrupted run, bit for bit (weights, optimizer state and shuffling
    # restored): a rank's steps repeat exactly (1 thread, a seeded shuffle), and with two
    # ranks every allreduced value is one sum of two numbers, whichever order the fused
    # tensors take; measured: equal in every epoch with 1 and 2 ranks
    ref, _ = _run_ok(cfg, rid, train_data, tmp_path / "reference")
    for key in ("train_loss", "val_loss"):
        assert [e[key] for e in rec["epochs"]] == [e[key] for e in ref["epochs"]], key
    assert rec["summary"]["final_test_loss"] == ref["summary"]["final_test_loss"]
    assert rec["initial_weights_sha256"] == ref["initial_weights_sha256"]  # kept over resumes
    assert rec["epochs"][3]["elapsed_s"] > rec["epochs"][1]["elapsed_s"]
    # each attempt's own start-up (its own launcher's stamp); the record's is their sum
    startups = [a["startup_s"] for a in attempts]
    assert all(s > 0 for s in startups)
    assert rec["timing"]["startup_s"] == pytest.approx(sum(startups))


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
@pytest.mark.parametrize("backend,launcher", [("gloo", "horovodrun"), ("mpi", "mpirun")])
def test_a_dead_rank_does_not_hang_the_job(tmp_path, train_data, backend, launcher):
    cfg = write_config(tmp_path / "config.json", base_config(epochs=50))
    rid = f"local_{backend}_n1_w2_b8_lrnone_r0"
    out = tmp_path / "run"
    proc = start_launch(cfg, rid, train_data, out, "--launcher", launcher)
    try:
        wait_for(
            lambda: (out / "checkpoint" / "LATEST").exists(), 240, "training to be under way", proc
        )
        pid = int((out / ".pids" / "rank-1.pid").read_text())
        time.sleep(0.3)  # mid-epoch
        os.kill(pid, signal.SIGKILL)
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the job hung for 60 s after rank 1 was killed")
    finally:
        kill_group(proc)
    assert proc.returncode != 0
    assert "rank 1" in output, output[-3000:]
    failure = json.loads((out / "failure.json").read_text())
    assert (
        failure["run_id"] == rid and failure["status"] == "failed" and failure["exit_status"] != 0
    )
    assert "rank 1 failed first" in failure["message"]
    assert failure["error_tail"] and failure["time_utc"]
    assert not (out / "metrics.json").exists()
    wait_for(lambda: not train_processes(out), 30, "every rank to exit", interval=0.2)


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_nan_loss_stops_the_run_with_a_nan_loss_record(tmp_path, train_data):
    cfg = write_config(tmp_path / "config.json", base_config(epochs=4, learning_rate=1e8))
    out = tmp_path / "run"
    r = launch(cfg, "local_gloo_n1_w2_b75_lrnone_r0", train_data, out)
    assert r.returncode == 0, r.stderr[-3000:]  # a diverged configuration is a result
    assert "ERROR" in r.stderr and "nan_loss" in r.stderr
    rec = load_record(out)
    assert rec["status"] == "nan_loss" and rec["exit_status"] == 3
    assert "not finite" in rec["error"]
    assert len(rec["epochs"]) == 1 and rec["epochs"][0]["train_loss"] is None
    assert rec["summary"]["final_test_loss"] is None and rec["summary"]["time_to_target_s"] is None
    assert not (out / "failure.json").exists()


def _copy_data(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def _train_direct(cfg, rid, data, out, env=None):
    return subprocess.run(
        [
            str(TRAIN_PY),
            "-m",
            "hvdscale.cli",
            "train",
            "--config",
            str(cfg),
            "--run-id",
            rid,
            "--data-dir",
            str(data),
            "--out-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env or sub_env(),
    )


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
@pytest.mark.parametrize(
    "problem", ["missing_shard", "corrupt_shard", "manifest_checksum", "truncated_shard"]
)
def test_bad_data_is_a_clear_error_before_training(tmp_path, train_data, problem):
    data = _copy_data(train_data, tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    if problem == "missing_shard":
        (data / "train" / "shard-0002.h5").unlink()
        expect = "shard-0002.h5: listed in"
    elif problem == "corrupt_shard":
        _flip_byte(data / "train" / "shard-0001.h5", 60000)
        expect = "shard-0001.h5: sha256 differs from the manifest"
    elif problem == "manifest_checksum":
        manifest["shards"]["test"][1]["sha256"] = "0" * 64
        (data / "manifest.json").write_text(json.dumps(manifest))
        expect = "test/shard-0001.h5: sha256 differs from the manifest"
    else:
        p = data / "train" / "shard-0003.h5"
        p.write_bytes(p.read_bytes()[:5000])
        expect = "shard-0003.h5"
    cfg = write_config(tmp_path / "config.json", base_config())
    out = tmp_path / "run"
    r = _train_direct(cfg, "local_gloo_n1_w1_b75_lrnone_r0", data, out)
    assert r.returncode == 2, r.stderr[-3000:]
    assert expect in r.stderr
    assert (
        len([ln for ln in r.stderr.splitlines() if "error:" in ln]) == 1
    )  # one clear line, no traceback
    assert "Traceback" not in r.stderr
    assert not (out / "checkpoint").exists() and not (out / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_bad_shard_of_another_rank_stops_every_rank_before_training(tmp_path, train_data):
    data = _copy_data(train_data, tmp_path / "data")
    _flip_byte(data / "train" / "shard-0003.h5", 60000)  # rank 1's shard
    cfg = write_config(tmp_path / "config.json", base_config())
    out = tmp_path / "run"
    r = launch(cfg, "local_gloo_n1_w2_b75_lrnone_r0", data, out, timeout=120)
    assert r.returncode != 0
    assert "shard-0003.h5: sha256 differs from the manifest" in r.stderr
    failure = json.loads((out / "failure.json").read_text())
    assert "shard-0003.h5" in failure["error_tail"]
    assert not (out / "checkpoint").exists()


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_shard_count_that_cannot_be_split_across_ranks(tmp_path_factory, tmp_path):
    data = cached_data(tmp_path_factory, train_shards=3, test_shards=1)
    out = tmp_path / "whole"
    cfg = write_config(
        tmp_path / "whole.json", base_config(train_shards=3, test_shards=1, shard_policy="whole")
    )
    r = launch(cfg, "local_gloo_n1_w2_b75_lrnone_r0", data, out, timeout=120)
    assert r.returncode != 0
    assert "3 shard(s) cannot be divided among 2 workers" in r.stderr
    assert not (out / "checkpoint").exists()
    # the default policy reads contiguous slices instead
    cfg = write_config(tmp_path / "auto.json", base_config(train_shards=3, test_shards=1, epochs=2))
    rec, _ = _run_ok(cfg, "local_gloo_n1_w2_b75_lrnone_r0", data, tmp_path / "auto")
    counts = rec["data"]["train_samples_per_rank"]
    assert abs(counts[0] - counts[1]) <= 1 and sum(counts) == rec["data"]["counts"]["train"]
    assert (
        rec["data"]["rank0_train_rows"][-1][0] == "train/shard-0001.h5"
    )  # a slice of the middle shard


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_timeline_and_sync_time_cross_check(tmp_path, train_data):
    cfg = write_config(tmp_path / "config.json", base_config(epochs=3, timeline=True))
    out = tmp_path / "run"
    rec, _ = _run_ok(cfg, "local_gloo_n1_w2_b75_lrnone_r0", train_data, out)
    assert rec["timeline"] == "timeline.json" and (out / "timeline.json").is_file()
    assert rec["config"]["horovod_env"]["HOROVOD_TIMELINE"].endswith("timeline.json")
    tc = rec["timeline_check"]
    steps = sum(e["steps"] for e in rec["epochs"])
    assert tc["timeline_allreduce_ops"] == 8 * steps  # 8 gradient tensors per step
    # structural facts, no timing tolerance: the allreduces are part of the span, and every
    # allreduce of a step runs between rank 0's sync boundaries of that step, so the
    # measured sync phase contains them (docs/timing.md: what "sync" includes)
    assert 0 < tc["timeline_allreduce_s"] <= tc["timeline_span_s"]
    assert tc["allreduce_to_sync_ratio"] == pytest.approx(
        tc["timeline_allreduce_s"] / tc["measured_sync_s_rank0"], rel=1e-3
    )
    assert 0 < tc["allreduce_to_sync_ratio"] <= 1


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_gradient_accumulation_and_fp16_compression(tmp_path, train_data):
    cfg = write_config(
        tmp_path / "config.json",
        base_config(epochs=3, horovod={"compression": "fp16", "backward_passes_per_step": 2}),
    )
    rec, _ = _run_ok(cfg, "local_gloo_n1_w2_b75_lrnone_r0", train_data, tmp_path / "run")
    check_plausible(rec, workers=2, epochs=3)
    assert rec["config"]["compression"] == "fp16" and rec["config"]["backward_passes_per_step"] == 2
    assert all(e["steps"] % 2 == 0 for e in rec["epochs"])


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_linear_lr_rule_with_warmup(tmp_path, train_data):
    c = base_config(epochs=3, warmup_epochs=2, lr_warmup=True, learning_rate=5e-4)
    c["scaling"]["sweeps"][0]["lr_rules"] = ["linear"]
    cfg = write_config(tmp_path / "config.json", c)
    rec, _ = _run_ok(cfg, "local_gloo_n1_w2_b75_lrlinear_r0", train_data, tmp_path / "run")
    assert rec["config"]["learning_rate"] == pytest.approx(1e-3)
    lrs = [e["learning_rate"] for e in rec["epochs"]]
    assert 5e-4 < lrs[0] < lrs[1] <= 1e-3 + 1e-9 and lrs[2] == pytest.approx(1e-3)
    assert [e["warmup"] for e in rec["epochs"]] == [True, True, False]


# Phase attribution, shown by fault injection (fault_env, docs/timing.md): a
# known delay added to every step inside one phase must show up in exactly that phase.
FAULT_DELAY_S = 0.1
FAULT_TOLERANCE = 0.2  # of the delay: the faulted phase's growth, and any other phase's


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_an_injected_delay_lands_in_exactly_its_phase(tmp_path, train_data):
    """One 1-rank run per phase (30 steps of batch 150, started directly, as a launcher's
    rank would be); the reference for a phase is its time in the runs that delayed
    another phase, so no extra undelayed run is needed. Not a timing tolerance on normal
    runs: the check is that an injected 100 ms lands in the right phase (the sync phase
    exists with one rank too: its boundaries are there, the allreduce is skipped)."""
    cfg = write_config(tmp_path / "config.json", base_config(epochs=1, warmup_epochs=0))
    per_step = {}
    for phase in PHASES:
        out = tmp_path / phase
        fault = fault_env(f"{phase}:{FAULT_DELAY_S}")
        r = _train_direct(cfg, "local_gloo_n1_w1_b150_lrnone_r0", train_data, out, env=fault)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"fault injection {phase}:{FAULT_DELAY_S:g} s per step" in r.stderr
        ep = load_record(out)["epochs"][0]
        per_step[phase] = {p: ep[f"time_{p}_s"] / ep["steps"] for p in PHASES}
    growth = {}
    for faulted in PHASES:
        for p in PHASES:
            ref = [per_step[r][p] for r in PHASES if r not in (p, faulted)]
            growth[faulted, p] = per_step[faulted][p] - sum(ref) / len(ref)
    shown = {k: round(v * 1e3, 2) for k, v in growth.items()}  # ms per step, for a failure
    for faulted in PHASES:
        assert abs(growth[faulted, faulted] - FAULT_DELAY_S) <= FAULT_TOLERANCE * FAULT_DELAY_S, (
            shown
        )
        for p in PHASES:
            if p != faulted:
                assert growth[faulted, p] <= FAULT_TOLERANCE * FAULT_DELAY_S, shown


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_the_noise_scale_sums_are_in_no_phase(tmp_path, train_data):
    """The sums of squared gradients of a timed 2-worker update (gradient noise scale)
    run after the sync phase and before the update phase, in neither: uninstrumented
    steps do not compute them. With a 100 ms delay in them (every call timed), no phase
    grows by it, nor the calls' launch overhead; the epoch's other time holds it, and the
    sums are still recorded."""
    cfg = write_config(
        tmp_path / "config.json", base_config(epochs=1, warmup_epochs=0, instrument_every=1)
    )
    out = tmp_path / "run"
    fault = fault_env(f"noise:{FAULT_DELAY_S}")
    r = launch(cfg, "local_gloo_n1_w2_b75_lrnone_r0", train_data, out, env=fault)
    assert r.returncode == 0 and "fault injection" in r.stderr, r.stderr[-3000:]
    rec = load_record(out)
    ep = rec["epochs"][0]
    per_step = {p: ep[f"time_{p}_s"] / ep["steps"] for p in PHASES}
    shown = {k: round(v * 1e3, 2) for k, v in per_step.items()}  # ms per step, for a failure
    assert all(v < 0.5 * FAULT_DELAY_S for v in per_step.values()), shown
    # the timed updates (the timeline window's steps are not timed) computed the sums
    assert ep["noise_steps"] == ep["timed_steps"] > 0 and ep["g_local_sq"] > 0, ep
    # each of them slept in the sums: the epoch's other time, not the launch overhead
    slept = FAULT_DELAY_S * ep["noise_steps"]
    assert ep["time_other_s"] >= 0.8 * slept, (ep["time_other_s"], slept, shown)
    assert ep["time_dispatch_s"] < 0.5 * slept, (ep["time_dispatch_s"], slept)
