"""Issue 32: the dynamic loss scale of fp16 runs reaches the run record and the runs table.

Each trainer's step program reports ``loss_scale_state()`` (final scale, updates skipped
for a non-finite gradient, all updates; None without loss scaling): Horovod-TF's
StepProgram keeps its own scale, torch-ddp's counts the updates GradScaler skipped (the
scale went down in ``update()``). ``hvdscale.trainer.rank`` hands the state to
``record.build.build_record`` (the record's top-level ``loss_scale``, null for fp32/bf16,
absent in older records), and the runs table shows ``loss_scale_final`` and
``skipped_updates`` (NaN where there is none).

The fp16 steps run on the CPU here: the matrix refuses fp16 there for real runs, but
TensorFlow computes float16 anyway and torch 2.13 autocasts to float16 on the CPU, with
``GradScaler("cpu")``. An overflow is forced by setting the scale to 2^126.
"""

from __future__ import annotations

import json
import math
import subprocess
from types import SimpleNamespace

import fixtures_runs as F
import pytest
from conftest_train import TRAIN_PY, needs_train_env, run_train_code
from required_layers import layer_skipif

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.columns import LOSS_SCALE_COLUMNS, RUNS_COLUMNS
from hvdscale.analysis.records import record_row
from hvdscale.analysis.tables import read_runs, write_csv
from hvdscale.config.load import validate_config
from hvdscale.matrix.runtable import find_run
from hvdscale.record.build import RecordError, epoch_entry, validate_record
from hvdscale.record.environment import environment_block
from hvdscale.record.timing import EpochTimer
from hvdscale.trainer.rank import loss_scale_state, run_record

RUN_ID = "local_gloo_n1_w2_b75_lrnone_r0"


def _has_torch() -> bool:
    if not TRAIN_PY.exists():
        return False
    return (
        subprocess.run([str(TRAIN_PY), "-c", "import torch"], capture_output=True).returncode == 0
    )


needs_torch = layer_skipif("torch", None if _has_torch() else "torch missing in .venv-train")

# both snippets print one line: STATE {"fp16": <state after the overflow>, "fp32": <state>}
TF_STATES = """
import json
import numpy as np
from hvdscale.config.load import validate_config
from hvdscale.trainer.horovod_tf.optim import Optimisation
from hvdscale.trainer.horovod_tf.loss_scale import LOSS_SCALE_INITIAL
from hvdscale.trainer.horovod_tf.step import build_step_program
from hvdscale.trainer.rank import loss_scale_state
from hvdscale.trainer.worker import WorkerInfo

def program(precision):
    cfg = validate_config({"seed": 3})
    cfg["training"]["precision"] = precision  # past the matrix check (fp16 wants a GPU)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, cfg["data"]["n_points"], 3)).astype(np.float32)
    y = (rng.normal(size=(64, 2)) * 0.1).astype(np.float32)
    optim = Optimisation.build(cfg, "none", 1, steps=4, seed=3)
    p = build_step_program(optim.model, optim.optimizer, WorkerInfo(), cfg["training"],
                           train=(x, y), test=(x, y), batch=16, device="/CPU:0")
    p.warm_up(4)
    return optim, p

_, fp32 = program("fp32")
optim, fp16 = program("fp16")
assert loss_scale_state(fp16) == {"final": LOSS_SCALE_INITIAL, "skipped_updates": 0, "updates": 0}
fp16.start_epoch(np.arange(64))
fp16.run_steps(0, 2, False)
w = [a.copy() for a in optim.model.get_weights()]
fp16.loss_scale.assign(2.0**126)  # the scaled gradient overflows float16
fp16.start_epoch(np.arange(64))
fp16.run_steps(0, 1, False)
assert all((a == b).all() for a, b in zip(w, optim.model.get_weights()))  # skipped
print("STATE " + json.dumps({"fp16": loss_scale_state(fp16), "fp32": loss_scale_state(fp32)}))
"""

TORCH_STATES = """
import json
import numpy as np
import torch
from hvdscale.config.load import validate_config
from hvdscale.trainer.rank import loss_scale_state
from hvdscale.trainer.torch_ddp.dist import TorchWorker
from hvdscale.trainer.torch_ddp.net import TorchOptimisation
from hvdscale.trainer.torch_ddp.step import TorchStepProgram

worker = TorchWorker.init("gloo")

def program(precision):
    cfg = validate_config({"seed": 3})
    cfg["training"]["precision"] = precision  # past the matrix check (fp16 wants a GPU)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, cfg["data"]["n_points"], 3)).astype(np.float32)
    y = (rng.normal(size=(64, 2)) * 0.1).astype(np.float32)
    optim = TorchOptimisation.build(cfg, "none", 1, steps=4, seed=3)
    p = TorchStepProgram(optim, worker, cfg["training"], train=(x, y), test=(x, y),
                         val=(x, y), batch=16)
    return optim, p

_, fp32 = program("fp32")
optim, fp16 = program("fp16")
start = fp16.scaler.get_scale()
assert loss_scale_state(fp16) == {"final": start, "skipped_updates": 0, "updates": 0}
fp16.start_epoch(np.arange(64))
fp16.run_steps(0, 2, False)
fp16.run_steps(2, 1, True)  # a timed step updates through the same path
assert loss_scale_state(fp16) == {"final": start, "skipped_updates": 0, "updates": 3}
w = [p.detach().clone() for p in optim.net.parameters()]
fp16.scaler.update(new_scale=2.0**126)  # the scaled gradient overflows float16
fp16.start_epoch(np.arange(64))
fp16.run_steps(0, 1, False)
assert all(torch.equal(a, b) for a, b in zip(w, optim.net.parameters()))  # skipped
print("STATE " + json.dumps({"fp16": loss_scale_state(fp16), "fp32": loss_scale_state(fp32)}))
fp16.close()
fp32.close()
worker.shutdown()
"""


def _states(code: str) -> dict:
    r = run_train_code(code, timeout=300, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("STATE ")]
    assert lines, r.stdout
    return json.loads(lines[-1][len("STATE ") :])


def record_of(loss_scale: dict | None) -> dict:
    """A run record as rank 0 makes it (``trainer.rank.run_record``, the objects of the
    run stubbed with what it reads), with ``loss_scale`` as the step program reported it."""
    cfg = validate_config({"training": {"max_epochs": 3, "warmup_epochs": 1}})
    timer = EpochTimer(30, 30, [0.01, 0.05, 0.02, 0.01], 0.001, train_wall=0.09, epoch_wall=0.1)
    epochs = [
        epoch_entry(
            epoch=i,
            warmup=i < 1,
            wall_s=0.1,
            steps=30,
            samples=4500,
            throughput=45000.0,
            timing=timer.record_fields(),
            train_loss=0.1 / (i + 1),
            val_loss=0.2 / (i + 1),
            test_loss=0.3 / (i + 1),
            elapsed_s=0.1 * (i + 1),
            utilisation_mean=None,
            learning_rate=1e-3,
            attempt=1,
        )  # fmt: skip
        for i in range(3)
    ]
    attempts = [{"started_utc": "2026-01-01T00:00:00Z", "start_epoch": 0}]
    environment = environment_block(
        config_hash="0" * 12, hostnames=["h"] * 2, devices=["CPU"] * 2, tensorflow="2.15.1",
        horovod="0.28.1", started_utc=attempts[0]["started_utc"],
    )  # fmt: skip
    progress = SimpleNamespace(
        attempts=attempts, history=epochs, utilisation_samples=[],
        epochs_this_attempt=lambda: 3, initial_weights_sha256="0" * 64,
    )  # fmt: skip
    result = SimpleNamespace(status="completed", error=None, test_values=3000,
                             rank_sync_s=[], stop_reason="max_epochs")  # fmt: skip
    framework = SimpleNamespace(
        name="horovod-tf", record_config={}, timeline_file=lambda: None,
        launcher=lambda: "horovodrun",
    )  # fmt: skip
    return run_record(
        find_run(cfg, RUN_ID), cfg, SimpleNamespace(size=2, controller="gloo"),
        SimpleNamespace(lr_base=1e-3, lr=1e-3, n_params=153441),
        SimpleNamespace(steps=30, info={"counts": {"train": 4500, "test": 1500}}),
        progress, result, SimpleNamespace(kind="cpu", interval_s=0.25, samples=[]),
        environment, seed=12345, framework=framework, loss_scale=loss_scale,
    )  # fmt: skip


def check_in_record(states: dict) -> None:
    """The fp16 state is the record's loss_scale (valid, in the runs row); fp32's is null."""
    rec = record_of(states["fp16"])
    validate_record(rec)
    assert rec["loss_scale"] == states["fp16"]
    row, _ = record_row(rec, "metrics.json")
    assert row["loss_scale_final"] == states["fp16"]["final"]
    assert row["skipped_updates"] == states["fp16"]["skipped_updates"]
    assert states["fp32"] is None
    rec = record_of(states["fp32"])
    validate_record(rec)
    assert rec["loss_scale"] is None
    row, _ = record_row(rec, "metrics.json")
    assert math.isnan(row["loss_scale_final"]) and math.isnan(row["skipped_updates"])


@pytest.mark.slow  # TensorFlow in train-env subprocesses
@pytest.mark.horovod
@needs_train_env
def test_the_tf_step_s_overflow_reaches_the_record():
    """Horovod-TF: two finite updates, then an overflow: the update is skipped, the scale
    halves (2^126 -> 2^125) and is counted; the record carries it."""
    states = _states(TF_STATES)
    assert states["fp16"] == {"final": 2.0**125, "skipped_updates": 1, "updates": 3}
    check_in_record(states)


@pytest.mark.slow  # torch in train-env subprocesses
@needs_torch
def test_the_torch_step_counts_the_update_gradscaler_skipped():
    """torch-ddp: three finite updates (plain and timed) keep the scale; an overflow skips
    the update (the weights stay), GradScaler halves the scale, the step counts it."""
    states = _states(TORCH_STATES)
    assert states["fp16"] == {"final": 2.0**125, "skipped_updates": 1, "updates": 4}
    check_in_record(states)


def test_the_schema_takes_a_loss_scale_and_records_without_one():
    assert loss_scale_state(SimpleNamespace()) is None  # a program without loss scaling
    state = {"final": 1024.0, "skipped_updates": 2, "updates": 40}
    rec = record_of(state)
    validate_record(rec)
    assert rec["loss_scale"] == state
    del rec["loss_scale"]  # a record from before issue 32
    validate_record(rec)
    for bad, field in (
        ({**state, "skipped_updates": -1}, "skipped_updates"),
        ({**state, "final": 0.0}, "final"),
        ({"final": 1024.0, "updates": 40}, "skipped_updates"),
        ({**state, "scale": 3.0}, "scale"),
    ):
        rec["loss_scale"] = bad
        with pytest.raises(RecordError, match=field):
            validate_record(rec)


def test_the_runs_table_shows_the_loss_scale_and_old_tables_read_nan(tmp_path):
    """runs.csv has loss_scale_final and skipped_updates after the step settings: the
    record's values for an fp16 run, NaN for a run without loss scaling (null or absent);
    a runs.csv written before them reads them as NaN."""
    assert RUNS_COLUMNS[-len(LOSS_SCALE_COLUMNS) :] == ["loss_scale_final", "skipped_updates"]
    ids = [f"local_gloo_n1_w{w}_b75_lrnone_r0" for w in (1, 2)]
    for rid in ids:
        F.write_record(tmp_path, F.record_from_epochs(rid, [1.3, 1.0, 1.0, 1.0]))
    fp16 = tmp_path / ids[1] / "metrics.json"
    rec = json.loads(fp16.read_text())
    rec["loss_scale"] = {"final": 16384.0, "skipped_updates": 3, "updates": 120}
    fp16.write_text(json.dumps(rec))
    runs = aggregate(tmp_path).runs
    write_csv(runs, tmp_path / "runs.csv")
    table = read_runs(tmp_path / "runs.csv").set_index("run_id")
    assert tuple(table.loc[ids[1], LOSS_SCALE_COLUMNS]) == (16384.0, 3.0)
    assert table.loc[ids[0], LOSS_SCALE_COLUMNS].isna().all()
    write_csv(runs.drop(columns=LOSS_SCALE_COLUMNS), tmp_path / "runs.csv")
    old = read_runs(tmp_path / "runs.csv")
    assert old[LOSS_SCALE_COLUMNS].isna().all().all()
