"""Target test loss resolution and the 'met in warm-up' flag on hand-made run records."""

import math

import pandas as pd
import pytest
from fixtures_runs import record_from_epochs, write_record

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.target import TOO_LOOSE, time_to
from hvdscale.config import ConfigError, validate_config

W = [2.0, 1.0, 1.0, 1.0, 1.0]


def _cfg(target, repeats=1, **training):
    return validate_config(
        {
            "training": {
                "max_epochs": 5,
                "warmup_epochs": 1,
                "repeats": repeats,
                "target": target,
                **training,
            },
            "scaling": {
                "sweeps": [
                    {
                        "partitions": ["local"],
                        "workers": [1, 2],
                        "backends": ["gloo"],
                        "batch_sizes": [75],
                        "lr_rules": ["none"],
                    }
                ]
            },
        }
    )


def _write(tmp_path, rid, loss, wall=W):
    write_record(tmp_path, record_from_epochs(rid, wall, test_loss=loss, warmup_epochs=1))


def test_relative_target_is_resolved_from_the_group_baseline(tmp_path):
    cfg = _cfg({"mode": "relative", "value": 10})
    _write(tmp_path, "local_gloo_n1_w1_b75_lrnone_r0", [0.5, 0.3, 0.2, 0.12, 0.10])
    _write(
        tmp_path,
        "local_gloo_n1_w2_b75_lrnone_r0",
        [0.6, 0.4, 0.3, 0.2, 0.105],
        [1, 0.5] * 2 + [0.5],
    )
    agg = aggregate(tmp_path, cfg)
    runs = agg.runs.set_index("run_id")
    assert runs["target_test_loss"].tolist() == pytest.approx([0.11, 0.11])
    # 1 worker: loss 0.10 at epoch 4 (elapsed 6.0); 2 workers: 0.105 at epoch 4 (elapsed 3.5)
    assert runs.loc["local_gloo_n1_w1_b75_lrnone_r0", "time_to_target_s"] == pytest.approx(6.0)
    assert runs.loc["local_gloo_n1_w2_b75_lrnone_r0", "time_to_target_s"] == pytest.approx(3.5)
    assert not runs["target_in_warmup"].any()
    s = agg.summary.set_index("workers")
    assert s.loc[2, "speedup_ttt"] == pytest.approx(6.0 / 3.5)
    assert not s["target_too_loose"].any()
    assert "fewer than 3" in s.loc[2, "ci_note"]


def test_absolute_target_met_in_warmup_is_flagged_not_a_speedup(tmp_path):
    cfg = _cfg({"mode": "absolute", "value": 0.55})
    _write(tmp_path, "local_gloo_n1_w1_b75_lrnone_r0", [0.5, 0.3, 0.2, 0.12, 0.10])
    _write(tmp_path, "local_gloo_n1_w2_b75_lrnone_r0", [0.6, 0.5, 0.3, 0.2, 0.1])
    agg = aggregate(tmp_path, cfg)
    runs = agg.runs.set_index("run_id")
    assert runs.loc["local_gloo_n1_w1_b75_lrnone_r0", "target_in_warmup"]
    assert not runs.loc["local_gloo_n1_w2_b75_lrnone_r0", "target_in_warmup"]
    s = agg.summary.set_index("workers")
    assert s["target_too_loose"].all()  # the 2-worker row through its baseline
    assert s["speedup_ttt"].isna().all()
    assert TOO_LOOSE in s.loc[1, "ci_note"]


def test_three_repeats_give_intervals_in_the_summary(tmp_path):
    cfg = _cfg({"mode": "relative", "value": 5}, repeats=3)
    for r, f in enumerate([1.0, 1.1, 0.9]):
        loss = [0.5, 0.3, 0.2, 0.12, 0.10]
        _write(tmp_path, f"local_gloo_n1_w1_b75_lrnone_r{r}", loss, [x * f for x in W])
        _write(tmp_path, f"local_gloo_n1_w2_b75_lrnone_r{r}", loss, [x * f / 1.6 for x in W])
    s = aggregate(tmp_path, cfg).summary.set_index("workers")
    assert (s["n_repeats"] == 3).all()
    assert s.loc[2, "speedup"] == pytest.approx(1.6)
    assert s.loc[2, "speedup_lo"] <= 1.6 <= s.loc[2, "speedup_hi"]
    assert s.loc[2, "efficiency_hi"] == pytest.approx(s.loc[2, "speedup_hi"] / 2)
    assert s.loc[2, "speedup_ttt_lo"] <= s.loc[2, "speedup_ttt"] <= s.loc[2, "speedup_ttt_hi"]
    assert s.loc[2, "ci_note"] == ""


def test_time_to_never_reached_and_first_epoch():
    ep = pd.DataFrame(
        {
            "epoch": [0, 1],
            "warmup": [False, False],
            "elapsed_s": [1.0, 2.0],
            "test_loss": [0.3, 0.2],
        }
    )
    assert time_to(ep, 0.1)[0] != time_to(ep, 0.1)[0]  # NaN
    assert time_to(ep, 0.25) == (2.0, 1.0, False)
    assert time_to(ep, 0.3) == (1.0, 0.0, True)  # the first epoch counts as warm-up
    assert math.isnan(time_to(ep, math.nan)[0])


def test_old_target_test_loss_still_works_and_both_is_an_error():
    cfg = validate_config({"training": {"target_test_loss": 0.2}})
    mode_value = {k: cfg["training"]["target"][k] for k in ("mode", "value")}
    assert mode_value == {"mode": "absolute", "value": 0.2}
    assert validate_config(cfg)["training"]["target"] == cfg["training"]["target"]
    with pytest.raises(ConfigError, match="replaced by training.target"):
        validate_config(
            {"training": {"target_test_loss": 0.2, "target": {"mode": "calibrated", "value": 5}}}
        )
