"""Time to target from the records' target block, censoring and mislabelled runs,
on hand-made run records (aggregation without a config: every record found counts)."""

import json
import math

import pandas as pd
import pytest
from fixtures_runs import record_from_epochs, write_record

from hvdscale.analysis.aggregate import aggregate
from hvdscale.config.load import validate_config
from hvdscale.errors import ConfigError, UserError
from hvdscale.target import TOO_LOOSE, describe, read_target, target_spec, time_to

W = [2.0, 1.0, 1.0, 1.0, 1.0]
LOSS = [0.5, 0.3, 0.2, 0.12, 0.10]
MISS = [0.5, 0.4, 0.3, 0.25, 0.2]  # never reaches 0.11: censored


def _write(tmp_path, rid, loss, wall=W, target=0.11, **kw):
    rec = record_from_epochs(rid, wall, test_loss=loss, target_test_loss=target, **kw)
    write_record(tmp_path, rec)
    return rec


def test_time_to_target_comes_from_the_record_target_block(tmp_path):
    _write(tmp_path, "local_gloo_n1_w1_b75_lrnone_r0", LOSS)
    _write(
        tmp_path,
        "local_gloo_n1_w2_b75_lrnone_r0",
        [0.6, 0.4, 0.3, 0.2, 0.105],
        [1, 0.5] * 2 + [0.5],
    )
    agg = aggregate(tmp_path)
    runs = agg.runs.set_index("run_id")
    assert runs["target_val_loss"].tolist() == pytest.approx([0.11, 0.11])
    # 1 worker: val loss 0.10 at epoch 4 (elapsed 6.0); 2 workers: 0.105 at epoch 4 (3.5)
    assert runs.loc["local_gloo_n1_w1_b75_lrnone_r0", "time_to_target_s"] == pytest.approx(6.0)
    assert runs.loc["local_gloo_n1_w2_b75_lrnone_r0", "time_to_target_s"] == pytest.approx(3.5)
    assert (runs["epochs_to_target"] == 5).all()
    s = agg.summary.set_index("workers")
    assert s.loc[2, "speedup_ttt"] == pytest.approx(6.0 / 3.5)
    assert s.loc[2, "epochs_ratio"] == pytest.approx(1.0)
    assert "fewer than 3" in s.loc[2, "ci_note"]


def test_test_loss_chooses_nothing(tmp_path):
    """Corrupting the (final) test loss changes no target, time or selection column."""
    rid = "local_gloo_n1_w1_b75_lrnone_r0"
    rec = _write(tmp_path, rid, LOSS)
    a = aggregate(tmp_path).runs
    rec["epochs"][-1]["test_loss"] = 99.0
    rec["summary"]["final_test_loss"] = rec["summary"]["best_test_loss"] = 99.0
    write_record(tmp_path, rec)
    b = aggregate(tmp_path).runs
    cols = ["time_to_target_s", "reached_target", "epochs_to_target", "best_val_loss"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert b.loc[0, "final_test_loss"] == 99.0


def test_absolute_target_met_in_warmup_is_flagged_not_a_speedup(tmp_path):
    _write(tmp_path, "local_gloo_n1_w1_b75_lrnone_r0", LOSS, target=0.55)
    _write(tmp_path, "local_gloo_n1_w2_b75_lrnone_r0", [0.6, 0.5, 0.3, 0.2, 0.1], target=0.55)
    agg = aggregate(tmp_path)
    runs = agg.runs.set_index("run_id")
    assert runs.loc["local_gloo_n1_w1_b75_lrnone_r0", "target_in_warmup"]
    assert not runs.loc["local_gloo_n1_w2_b75_lrnone_r0", "target_in_warmup"]
    s = agg.summary.set_index("workers")
    assert s["target_too_loose"].all()  # the 2-worker row through its baseline
    assert s["speedup_ttt"].isna().all()
    assert TOO_LOOSE in s.loc[1, "ci_note"]


def _five(tmp_path, n_censored):
    for r in range(5):
        f = 1.0 + 0.05 * r
        _write(tmp_path, f"local_gloo_n1_w1_b75_lrnone_r{r}", LOSS, [x * f for x in W])
        loss = MISS if r < n_censored else LOSS
        _write(tmp_path, f"local_gloo_n1_w2_b75_lrnone_r{r}", loss, [x * f / 1.6 for x in W])
    return aggregate(tmp_path)


def test_two_of_five_censored_give_a_finite_median_and_3_of_5(tmp_path):
    agg = _five(tmp_path, 2)
    runs = agg.runs[agg.runs["workers"] == 2].set_index("repeat")
    assert math.isinf(runs.loc[0, "time_to_target_s"]) and bool(runs.loc[0, "target_censored"])
    s = agg.summary.set_index("workers")
    assert (s.loc[2, "n_reached_target"], s.loc[2, "n_ttt_total"]) == (3, 5)
    assert math.isfinite(s.loc[2, "time_to_target_s"])
    # censored repeats count as +inf: the median is the 3rd of 5, the largest finite time
    assert s.loc[2, "time_to_target_s"] == pytest.approx(sorted(runs["time_to_target_s"])[2])
    assert s.loc[2, "ttt_note"] == ""
    assert s.loc[2, "speedup_ttt_lo"] <= s.loc[2, "speedup_ttt"] <= s.loc[2, "speedup_ttt_hi"]


def test_three_of_five_censored_give_no_median_and_say_so(tmp_path):
    agg = _five(tmp_path, 3)
    s = agg.summary.set_index("workers")
    assert (s.loc[2, "n_reached_target"], s.loc[2, "n_ttt_total"]) == (2, 5)
    assert math.isnan(s.loc[2, "time_to_target_s"]) and math.isnan(s.loc[2, "speedup_ttt"])
    assert s.loc[2, "ttt_note"] == "time to target: 3/5 censored: no median"
    assert "3/5 censored: no median" in s.loc[2, "ci_note"]
    assert math.isnan(s.loc[2, "speedup_ttt_lo"])


def test_mislabelled_run_is_excluded_and_listed(tmp_path):
    for r in range(3):
        _write(tmp_path, f"local_gloo_n1_w1_b75_lrnone_r{r}", LOSS)
        _write(tmp_path, f"local_gloo_n1_w2_b75_lrnone_r{r}", LOSS, [x / 2 for x in W])
    bad = "local_gloo_n1_w2_b75_lrnone_r3"
    _write(
        tmp_path,
        bad,
        LOSS,
        [x / 100 for x in W],  # would pull the median down if it counted
        label_problems=["world size 1, label says 2 workers"],
    )
    agg = aggregate(tmp_path)
    st = agg.status.set_index("run_id")
    assert st.loc[bad, "status"] == "mislabelled"
    assert "world size 1, label says 2 workers" in st.loc[bad, "detail"]
    assert agg.runs.set_index("run_id").loc[bad, "status"] == "mislabelled"
    s = agg.summary.set_index("workers")
    assert s.loc[2, "n_mislabelled"] == 1 and s.loc[2, "n_completed"] == 3
    assert s.loc[2, "epoch_time_s"] == pytest.approx(0.5)
    assert s.loc[2, "speedup"] == pytest.approx(2.0)


def test_time_to_reads_the_validation_loss():
    ep = [
        {"epoch": 0, "warmup": False, "elapsed_s": 1.0, "val_loss": 0.3, "test_loss": None},
        {"epoch": 1, "warmup": False, "elapsed_s": 2.0, "val_loss": 0.2, "test_loss": 0.0},
        {"epoch": 2, "warmup": True, "elapsed_s": 3.0, "val_loss": 0.1, "test_loss": 0.0},
    ]
    assert time_to(ep, 0.01) == (None, None, False)
    assert time_to(ep, 0.25) == (2.0, 1, False)
    assert time_to(ep, 0.3) == (1.0, 0, True)  # the first epoch counts as warm-up
    assert time_to(ep[1:], 0.15) == (3.0, 2, True)  # an epoch marked warm-up
    assert time_to(ep, float("nan")) == (None, None, False)


def test_old_target_test_loss_still_works_and_both_is_an_error():
    cfg = validate_config({"training": {"target_test_loss": 0.2}})
    mode_value = {k: cfg["training"]["target"][k] for k in ("mode", "value")}
    assert mode_value == {"mode": "absolute", "value": 0.2}
    assert validate_config(cfg)["training"]["target"] == cfg["training"]["target"]
    with pytest.raises(ConfigError, match="replaced by training.target"):
        validate_config(
            {"training": {"target_test_loss": 0.2, "target": {"mode": "calibrated", "value": 5}}}
        )


def test_target_json_is_read_and_described(tmp_path):
    path = tmp_path / "target.json"
    spec = {
        "mode": "calibrated",
        "value": 0.0525,
        "percent": 5,
        "calibration_runs": ["a", "b", "c"],
        "best_val_losses": [0.05, 0.049, 0.051],
        "median_best_val_loss": 0.05,
    }
    path.write_text(json.dumps(spec))
    assert target_spec(None, path) == spec
    text = describe(read_target(path))
    assert "0.0525 = (1 + 5 %) x 0.05" in text and "3 calibration runs (1 worker, long" in text
    assert describe({"mode": "absolute", "value": 0.1}) == (
        "validation loss 0.1 (absolute, set in the config)"
    )
    path.write_text("{}")
    with pytest.raises(UserError, match="target.json"):
        read_target(path)
