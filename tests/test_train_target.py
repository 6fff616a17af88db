"""Training to a validation target (issue 16) and uninstrumented headline times (issue 17):
real 1- and 2-rank runs on the tiny dataset of tests/conftest_train.py (no mocks).

Losses and epochs are compared exactly where the runs are deterministic (1 rank, same
seed, 1 thread: the same run twice gives the same losses bit for bit); times never.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest_train import (
    base_config,
    fault_env,
    launch,
    load_record,
    needs_train_env,
    train_data,  # noqa: F401  (pytest fixture)
    write_config,
)

# long training runs: in the stream "apart" of tests/run.sh, beside the rest
pytestmark = pytest.mark.stream("apart")

# --------------------------------------------------------------------------- unit


def test_run_seed_is_paired_over_worker_counts_and_differs_between_repeats():
    import numpy as np

    from hvdscale.matrix.runtable import run_seed

    assert run_seed(11, 0) == int(np.random.SeedSequence([11, 0, 0]).generate_state(1)[0])
    assert run_seed(11, 3, "rerun") == int(np.random.SeedSequence([11, 3, 2]).generate_state(1)[0])
    seeds = {run_seed(11, r, k) for r in range(5) for k in ("", "cal", "rerun")}
    assert len(seeds) == 15  # repeats and kinds differ


def test_loop_plan_stop_decision():
    from hvdscale.trainer.loop import LoopPlan

    plan = LoopPlan("r", 5, 1, 10, 100, 4, 10, True, 1, target=0.1, max_train_s=60.0)
    assert plan.stop_reason(1, 0.1, 1.0) == "target"  # <= target
    assert plan.stop_reason(1, 0.2, 1.0) is None
    # never inside the warm-up (1 epoch): the record needs a timed epoch
    assert plan.stop_reason(0, 0.05, 1.0) is None
    assert plan.stop_reason(4, 0.2, 1.0) == "max_epochs"
    assert plan.stop_reason(1, 0.2, 60.0) == "max_train_s"
    plan.stop_at_target = False  # calibration runs train the budget
    assert plan.stop_reason(1, 0.01, 1.0) is None
    plan.stop_at_target, plan.target = True, None  # no target: the budget
    assert plan.stop_reason(3, 0.0, 1.0) is None


def test_a_calibration_run_with_until_flat_stops_once_flat_and_no_other_run_does():
    from hvdscale.target import has_flattened, last_quarter_gain
    from hvdscale.trainer.loop import LoopPlan

    cfg = {
        "training": {
            "max_epochs": 200, "warmup_epochs": 1, "steps_per_execution": 4,
            "instrument_every": 10, "shuffle": True, "stop_at_target": False,
            "max_train_s": None,
            "target": {"calibration": {"until_flat": True, "min_epochs": 8}},
        }
    }  # fmt: skip
    cal = LoopPlan.from_config(cfg, "local_mpi_n1_w1_b75_lrlinear_cal_r0", 10, 75, 1)
    scaling = LoopPlan.from_config(cfg, "local_mpi_n1_w1_b75_lrlinear_r0", 10, 75, 1)
    assert cal.flat_min_epochs == 8 and scaling.flat_min_epochs is None
    falling = [1.0 / (k + 1) for k in range(8)]  # still halving: not flat
    plateau = [1.0, 0.5, 0.4, 0.35, 0.34, 0.34, 0.341, 0.3405]  # last quarter: 0 % gain
    assert not has_flattened(falling, 8) and has_flattened(plateau, 8)
    assert not has_flattened(plateau[:6], 8)  # before min_epochs a plateau is no convergence
    assert cal.stop_reason(7, plateau[-1], 3.0, plateau) == "flat"
    assert cal.stop_reason(7, falling[-1], 3.0, falling) is None
    assert scaling.stop_reason(7, plateau[-1], 3.0, plateau) is None
    # the stop rule is the report's "had flattened" rule (target.last_quarter_gain < 2 %)
    rec = {"epochs": [{"val_loss": v} for v in plateau]}
    assert last_quarter_gain(rec) < 0.02
    cfg["training"]["target"]["calibration"]["until_flat"] = False
    off = LoopPlan.from_config(cfg, "local_mpi_n1_w1_b75_lrlinear_cal_r0", 10, 75, 1)
    assert off.stop_reason(7, plateau[-1], 3.0, plateau) is None


def test_a_resumed_run_whose_checkpoint_already_ends_it_stops_at_once():
    from hvdscale.trainer.checkpoint import ResumeState
    from hvdscale.trainer.loop import LoopPlan, _resumed_stop

    plan = LoopPlan("r", 5, 1, 10, 100, 4, 10, True, 1, target=0.1)
    hist = [{"epoch": 0, "val_loss": 0.3, "elapsed_s": 1.0}]
    state = {"epoch": 0, "epochs": hist, "elapsed_s": 1.0, "attempts": []}
    assert _resumed_stop(plan, ResumeState.from_state(state)) is None  # goes on to the target
    hist.append({"epoch": 1, "val_loss": 0.05, "elapsed_s": 2.0})
    assert _resumed_stop(plan, ResumeState.from_state({**state, "epoch": 1})) == "target"
    assert _resumed_stop(plan, ResumeState()) is None


def test_headline_train_time_counts_timed_calls_at_the_plain_rate():
    from hvdscale.record.timing import EpochTimer

    t = EpochTimer(steps=30)
    t.add_call("timed", 10, 3.0)  # 0.3 s/step instrumented
    t.timed_steps = 10
    t.add_call("plain", 10, 1.0)
    t.add_call("plain", 5, 0.5)  # 0.1 s/step uninstrumented
    t.add_call("timeline", 5, 2.0)
    assert t.headline_train_s(6.5) == pytest.approx(6.5 - 5.0 + 15 * 0.1)
    f = t.instrumentation_fields()
    assert f == {"plain_steps": 15, "step_s_plain": 0.1, "step_s_timed": 0.3}
    assert EpochTimer(steps=3, timed_steps=3).headline_train_s(2.0) == 2.0  # no plain call


# --------------------------------------------------------------------------- runs

RUN_1W = "local_gloo_n1_w1_b150_lrnone_r0"


def _run_ok(cfg, rid, data, out, *extra, env=None):
    r = launch(cfg, rid, data, out, *extra, env=env)
    assert r.returncode == 0, (
        f"launch failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    )
    return load_record(out)


def _target_file(path: Path, value: float) -> Path:
    spec = {"mode": "absolute", "value": value, "percent": None, "calibration_runs": []}
    spec.update(best_val_losses=[], median_best_val_loss=None)  # calibrate-target's keys
    path.write_text(json.dumps(spec))
    return path


def _corrupt_test_labels(src: Path, dst: Path) -> Path:
    """A copy of the data directory whose test shards carry random labels (manifest
    checksums updated, so the data check passes and only the labels differ)."""
    import h5py
    import numpy as np

    from hvdscale.data.check import sha256_file

    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    rng = np.random.default_rng(0)
    for e in manifest["shards"]["test"]:
        path = dst / e["file"]
        with h5py.File(path, "r+") as fh:
            lab = fh["labels"]
            lab[...] = rng.uniform(-5, 5, lab.shape).astype(np.float32)
        e["sha256"], e["bytes"] = sha256_file(path), path.stat().st_size
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_train_to_target_stops_there_and_test_labels_never_decide(tmp_path, train_data):
    """The budget run gives the validation curve; a target from it stops a second run at
    the first epoch at or below it; a third run with the test labels corrupted stops at
    the same epoch with the same validation losses: only its final test loss differs."""
    cfg = write_config(tmp_path / "config.json", base_config(epochs=4, warmup_epochs=1))
    full = _run_ok(cfg, RUN_1W, train_data, tmp_path / "budget")
    vals = [e["val_loss"] for e in full["epochs"]]
    assert full["target"]["stop_reason"] == "max_epochs" and full["target"]["value"] is None
    target = sorted(vals)[1]  # reached, but not in every epoch
    stop = next(i for i, v in enumerate(vals) if v <= target)
    tfile = _target_file(tmp_path / "target.json", target)

    clean = _run_ok(cfg, RUN_1W, train_data, tmp_path / "clean", "--target", tfile)
    bad_data = _corrupt_test_labels(train_data, tmp_path / "corrupt")
    bad = _run_ok(cfg, RUN_1W, bad_data, tmp_path / "bad", "--target", tfile)
    for rec in (clean, bad):
        t = rec["target"]
        assert [e["val_loss"] for e in rec["epochs"]] == vals[: stop + 1]
        assert t["stop_reason"] == "target" and t["reached"] and not t["censored"]
        assert t["epoch"] == stop and len(rec["epochs"]) == stop + 1
        assert t["value"] == target and t["mode"] == "absolute"
        assert t["time_to_target_s"] == rec["epochs"][stop]["elapsed_s"]
        assert rec["summary"]["time_to_target_s"] == t["time_to_target_s"]
        assert t["best_val_loss"] == min(vals[: stop + 1])
        assert [e["test_loss"] is None for e in rec["epochs"]][:-1] == [True] * stop
    assert clean["initial_weights_sha256"] == bad["initial_weights_sha256"]
    t_clean, t_bad = clean["summary"]["final_test_loss"], bad["summary"]["final_test_loss"]
    assert t_clean is not None and t_bad is not None and t_bad > 10 * t_clean


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_budgets_censor_a_run_that_misses_the_target(tmp_path, train_data):
    cfg = write_config(tmp_path / "config.json", base_config(epochs=2, warmup_epochs=1))
    tfile = _target_file(tmp_path / "target.json", 1e-9)  # out of reach
    rec = _run_ok(cfg, RUN_1W, train_data, tmp_path / "epochs", "--target", tfile)
    t = rec["target"]
    assert (t["stop_reason"], t["reached"], t["censored"]) == ("max_epochs", False, True)
    assert t["time_to_target_s"] is None and t["epoch"] is None and len(rec["epochs"]) == 2
    assert t["best_val_loss"] == min(e["val_loss"] for e in rec["epochs"])
    assert t["budget"] == {"max_epochs": 2, "max_train_s": None}
    # a wall-clock budget shorter than one epoch: stop after the first epoch
    cfg = write_config(
        tmp_path / "short.json", base_config(epochs=3, warmup_epochs=1, max_train_s=1e-6)
    )
    rec = _run_ok(cfg, RUN_1W, train_data, tmp_path / "seconds", "--target", tfile)
    t = rec["target"]
    assert (t["stop_reason"], t["censored"], len(rec["epochs"])) == ("max_train_s", True, 1)
    assert rec["epochs"][-1]["test_loss"] is not None  # the one test evaluation


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_a_real_calibration_run_stops_once_flat_and_a_scaling_run_does_not(tmp_path, train_data):
    """A learning rate of 1e-12 leaves the validation loss where it starts: the calibration
    run (until_flat, min_epochs 4) stops after exactly 4 epochs with stop reason flat; the
    same config's scaling run (no target file) trains its whole budget."""
    cal = {"batch": 150, "until_flat": True, "min_epochs": 4, "max_epochs": 12}
    cfg = write_config(
        tmp_path / "config.json",
        base_config(epochs=6, learning_rate=1e-12, target={"calibration": cal}),
    )
    rec = _run_ok(cfg, "local_gloo_n1_w1_b150_lrnone_cal_r0", train_data, tmp_path / "cal")
    vals = [e["val_loss"] for e in rec["epochs"]]
    assert rec["target"]["stop_reason"] == "flat" and len(vals) == 4
    assert max(vals) - min(vals) <= 1e-6 * min(vals)  # nothing learnt: flat from the start
    rec = _run_ok(cfg, RUN_1W, train_data, tmp_path / "scaling")
    assert rec["target"]["stop_reason"] == "max_epochs" and len(rec["epochs"]) == 6


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_a_bad_target_file_is_a_clear_error(tmp_path, train_data):
    cfg = write_config(tmp_path / "config.json", base_config(epochs=1, warmup_epochs=0))
    tfile = tmp_path / "target.json"
    good = json.loads(_target_file(tfile, 0.1).read_text())
    tfile.write_text(json.dumps({**good, "value": "low"}))
    r = launch(cfg, RUN_1W, train_data, tmp_path / "run", "--target", tfile)
    assert r.returncode != 0
    assert f"target file {tfile}: value must be a positive number" in r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_data_without_a_val_split_is_a_clear_error(tmp_path, train_data):
    data = tmp_path / "data"
    shutil.copytree(train_data, data)
    shutil.rmtree(data / "val")
    cfg = write_config(tmp_path / "config.json", base_config(epochs=1, warmup_epochs=0))
    r = launch(cfg, RUN_1W, data, tmp_path / "run")
    assert r.returncode != 0
    assert f"{data}: no validation split" in r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_seeds_differ_between_repeats_and_are_paired_over_worker_counts(tmp_path, train_data):
    cfg = write_config(tmp_path / "config.json", base_config(epochs=1, warmup_epochs=0, repeats=2))
    r0 = _run_ok(cfg, RUN_1W, train_data, tmp_path / "w1r0")
    r1 = _run_ok(cfg, "local_gloo_n1_w1_b150_lrnone_r1", train_data, tmp_path / "w1r1")
    w2 = _run_ok(cfg, "local_gloo_n1_w2_b75_lrnone_r0", train_data, tmp_path / "w2r0")
    assert r0["config"]["seed_base"] == r1["config"]["seed_base"] == 11
    assert r0["config"]["seed"] != r1["config"]["seed"]
    assert r0["config"]["seed"] == w2["config"]["seed"]
    assert r0["initial_weights_sha256"] != r1["initial_weights_sha256"]
    assert r0["initial_weights_sha256"] == w2["initial_weights_sha256"]
    assert r0["epochs"][0]["val_loss"] != r1["epochs"][0]["val_loss"]


FAULT_S = 0.01  # per step, in the compute phase of every step (timed or not)


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_instrument_every_10_scales_the_phase_split_and_counts_the_calls(tmp_path, train_data):
    """1 rank, one step per call, every 10th call timed, the timeline window in epoch 1:
    the step counts of each kind are exact, and the scaled compute phase holds at least
    every step's injected delay (the timed steps alone hold a tenth of it)."""
    cfg = write_config(
        tmp_path / "config.json",
        base_config(epochs=2, warmup_epochs=1, steps_per_execution=1, timeline_steps=5),
    )
    out = tmp_path / "run"
    _run_ok(cfg, RUN_1W, train_data, out, env=fault_env(f"compute:{FAULT_S}"))
    rec = load_record(out)
    assert rec["config"]["instrument_every"] == 10
    for e in rec["epochs"]:
        tl = 5 if e["epoch"] == 1 else 0  # the timeline window: after the warm-up epoch
        rest = e["steps"] - tl
        assert e["timed_steps"] == math.ceil(rest / 10)
        assert e["plain_steps"] == rest - e["timed_steps"]
        assert e["time_compute_s"] >= e["steps"] * FAULT_S  # scaled to all steps
        assert e["wall_s"] >= e["steps"] * FAULT_S
        assert e["step_s_plain"] >= FAULT_S and e["step_s_timed"] >= FAULT_S
    inst = rec["timing"]["instrumentation"]
    assert inst["instrumented_steps"] == sum(e["timed_steps"] for e in rec["epochs"])
    assert inst["uninstrumented_steps"] == sum(e["plain_steps"] for e in rec["epochs"])
    assert inst["uninstrumented_step_s"] == rec["epochs"][1]["step_s_plain"]
    assert inst["overhead"] == pytest.approx(
        inst["instrumented_step_s"] / inst["uninstrumented_step_s"] - 1, abs=1e-6
    )
    assert (out / "timeline.json").is_file()  # 1 worker: whatever Horovod shows
    assert rec["label_proof"]["ok"], rec["label_proof"]
