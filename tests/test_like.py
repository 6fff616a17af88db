"""Like against like (analysis/like.py): every step setting of a precision x compile sweep
gets its own 1-worker baseline through `hvdscale aggregate`, and pairing never collapses
two runs of one seed."""

import math

import fixtures_runs as F
import pandas as pd
import pytest

from hvdscale.analysis.stats import speedup_interval
from hvdscale.cli import main
from hvdscale.errors import UserError

#: (precision, compile) -> (1-worker epoch time, 2-worker epoch time): each setting its
#: own true speedup (both sides reach the target in the same epoch, so the time-to-target
#: speedup is the epoch-time ratio)
SWEEP = {
    ("fp32", "off"): (1.00, 0.625),  # 1.6
    ("bf16", "off"): (0.70, 0.50),  # 1.4
    ("fp32", "default"): (0.90, 0.45),  # 2.0
    ("bf16", "default"): (0.60, 0.50),  # 1.2
}
LOSS = [0.5, 0.3, 0.2, 0.15, 0.10, 0.09]


def _suffix(prec, comp):
    return ("" if prec == "fp32" else f"_{prec}") + ("" if comp == "off" else f"_c{comp}")


def _sweep(runs_dir):
    for (prec, comp), (t1, t2) in SWEEP.items():
        for r in range(5):
            jitter = 1.0 + 0.01 * r  # the same seed (repeat) in every setting: pairs
            for w, t in ((1, t1), (2, t2)):
                rid = f"local_gloo_n1_w{w}_b75_lrnone{_suffix(prec, comp)}_r{r}"
                rec = F.record_from_epochs(
                    rid, [t * jitter] * 6, test_loss=LOSS, target_test_loss=0.105
                )
                F.write_record(runs_dir, rec)


def _aggregate(tmp_path):
    out = tmp_path / "out"
    argv = ["aggregate", "--runs-dir", str(tmp_path / "runs"), "--quiet"]
    for name in ("runs", "summary", "status", "headline"):
        argv += [f"--out-{name}", str(out / f"{name}.csv")]
    assert main(argv) == 0
    return out


def test_precision_by_compile_sweep_has_one_baseline_per_setting(tmp_path):
    _sweep(tmp_path / "runs")
    out = _aggregate(tmp_path)
    h = pd.read_csv(out / "headline.csv", dtype={"precision": str, "compile": str})
    assert len(h) == len(SWEEP)  # one row per setting, none pooled
    for (prec, comp), (t1, t2) in SWEEP.items():
        row = h[(h["precision"] == prec) & (h["compile"] == comp)]
        assert len(row) == 1, (prec, comp)
        r = row.iloc[0]
        # every run of both sides counted once: no pair collapsed by a shared seed
        assert (r.reached, r.total, r.base_reached, r.base_total) == (5, 5, 5, 5)
        assert r.speedup_ttt == pytest.approx(t1 / t2)
        assert r.epoch_speedup == pytest.approx(t1 / t2)
        assert r.speedup_ttt_lo <= t1 / t2 <= r.speedup_ttt_hi
        # the fastest 1-worker configuration is of the same setting (the only one here)
        assert r.best1_baseline == "batch 75, LR none, untuned"
        assert r.speedup_ttt_best1 == pytest.approx(t1 / t2)
    s = pd.read_csv(out / "summary.csv", dtype={"precision": str, "compile": str})
    two = s[s["workers"] == 2].set_index(["precision", "compile"])
    for key, (t1, t2) in SWEEP.items():
        assert two.loc[key, "speedup"] == pytest.approx(t1 / t2)


def test_pairing_refuses_two_runs_of_one_seed():
    with pytest.raises(UserError, match="two runs of seed id 3"):
        speedup_interval(
            [1.0, 1.1, 1.2, 1.3], [0.5, 0.6, 0.7, 0.8], "x", base_repeats=[0, 1, 2, 3],
            repeats=[0, 1, 3, 3],
        )  # fmt: skip
    lo, hi, _ = speedup_interval(
        [1.0, 1.1, 1.2], [0.5, 0.6, 0.7], "x", base_repeats=[0, 1, 2], repeats=[0, 1, 2]
    )
    assert lo <= 1.1 / 0.6 <= hi and not math.isnan(lo)


def test_a_target_met_in_the_warm_up_gives_no_speedup_in_any_table(tmp_path):
    """summary.csv, tuned.csv and headline.csv agree: no time-to-target speedup where a
    run met the target in its warm-up epoch (the target is too loose), and say why."""
    from hvdscale.target import TOO_LOOSE

    loose = [0.1, 0.09, 0.08, 0.07, 0.06, 0.05]  # below 0.105 already in epoch 0
    for r in range(5):
        for w, t in ((1, 1.0), (2, 0.6)):
            rid = f"local_gloo_n1_w{w}_b75_lrnone_r{r}"
            rec = F.record_from_epochs(rid, [t] * 6, test_loss=loose, target_test_loss=0.105)
            F.write_record(tmp_path / "runs", rec)
    out = _aggregate(tmp_path)
    s = pd.read_csv(out / "summary.csv").set_index("workers")
    h = pd.read_csv(out / "headline.csv").iloc[0]
    assert bool(s.loc[2, "target_too_loose"]) and math.isnan(s.loc[2, "speedup_ttt"])
    assert math.isnan(h.speedup_ttt) and math.isnan(h.speedup_ttt_lo)
    assert math.isnan(h.speedup_ttt_best1) and math.isnan(h.speedup_launch_ttt)
    assert TOO_LOOSE in h.note
    assert h.epoch_speedup == pytest.approx(1 / 0.6)  # the epoch time is still measured


def test_results_table_names_each_step_setting_group(tmp_path):
    import report_fixtures as RF

    from hvdscale.analysis.tables import read_summary
    from hvdscale.report.doc import Doc
    from hvdscale.report.results import _config_table

    _sweep(tmp_path / "runs")
    out = _aggregate(tmp_path)
    d = Doc()
    _config_table(d, read_summary(out / "summary.csv"))
    text = RF.story_text(d.story)
    assert "local / gloo / batch 75 per worker" in text  # fp32, eager: as before
    for label in ("bf16, eager", "fp32, compile default", "bf16, compile default"):
        assert f"local / gloo / {label} / batch 75 per worker" in text
