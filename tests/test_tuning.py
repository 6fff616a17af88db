"""The learning-rate re-tuning sweep: run table, run config, and select_tuned on hand-made
and simulated run records (tests/fixtures_runs.py)."""

import pandas as pd
import pytest
from fixtures_runs import record_from_epochs, write_failure, write_record, write_study

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.tuning import candidates, select_tuned
from hvdscale.config import ConfigError, find_run, run_config, run_table, validate_config

TUNE = {
    "partitions": ["local"],
    "workers": [1, 2],
    "backends": ["gloo"],
    "batch_sizes": [75],
    "lr_multipliers": [0.5, 1, 2],
    "warmup_epochs": [0, 1],
}


def _cfg(tune=TUNE, **training):
    return validate_config(
        {
            "training": {"max_epochs": 4, "warmup_epochs": 1, **training},
            "scaling": {
                "sweeps": [
                    {
                        "partitions": ["local"],
                        "workers": [1, 2],
                        "backends": ["gloo"],
                        "batch_sizes": [75],
                        "lr_rules": ["none"],
                    }
                ],
                "tune": tune,
            },
        }
    )


def test_every_candidate_is_its_own_run_with_its_own_config():
    cfg = _cfg()
    runs = run_table(cfg)
    cands = [r for r in runs if r.candidate]
    assert len(cands) == 2 * 3 * 2  # workers x multipliers x warm-ups (lr_rules [linear])
    assert len(runs) == len(cands) + 2 + 3  # and the target's 3 calibration runs
    rid = "local_gloo_n1_w2_b75_lrlinear_m0p5_wu0_r0"
    assert rid in {r.run_id for r in cands}
    sub = validate_config(run_config(cfg, rid))
    assert sub["training"]["learning_rate"] == pytest.approx(0.5 * cfg["training"]["learning_rate"])
    assert sub["training"]["warmup_epochs"] == 0 and sub["training"]["lr_warmup"] is False
    run = find_run(sub, rid)  # what training looks up
    assert (run.workers, run.lr_rule, run.lr_mult, run.tune_warmup) == (2, "linear", 0.5, 0)
    # the target is not part of a run's config: changing it retrains nothing
    other = _cfg(target={"mode": "calibrated", "value": 20})
    assert run_config(other, rid) == run_config(cfg, rid)


def test_tune_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="scaling.tune.warmup_epochs"):
        _cfg({**TUNE, "warmup_epochs": [4]})
    with pytest.raises(ConfigError, match="scaling.tune.lr_multipliers"):
        _cfg({**TUNE, "lr_multipliers": [0.125]})


LOSS_1W = [0.5, 0.3, 0.2, 0.10]  # the untuned 1-worker run: best 0.10 -> target 0.105
W = [1.0, 1.0, 1.0, 1.0]


def _write_hand_made(tmp_path, failed_w2=False):
    write_record(
        tmp_path, record_from_epochs("local_gloo_n1_w1_b75_lrnone_r0", W, test_loss=LOSS_1W)
    )
    write_record(
        tmp_path,
        record_from_epochs(
            "local_gloo_n1_w2_b75_lrnone_r0", [0.6] * 4, test_loss=[0.6, 0.4, 0.3, 0.2]
        ),
    )
    # 1-worker candidates: m1_wu1 reaches the target at epoch 3, m2_wu0 at epoch 2
    losses_1 = {"m2_wu0": [0.4, 0.2, 0.1, 0.09], "m1_wu1": LOSS_1W}
    # 2-worker candidates: m2_wu1 and m2_wu0 reach it at epoch 2 (tie: m2_wu1 ends lower)
    losses_2 = {
        "m0p5_wu0": [0.6, 0.5, 0.4, 0.3],
        "m2_wu0": [0.5, 0.3, 0.104, 0.100],
        "m2_wu1": [0.5, 0.3, 0.103, 0.095],
        "m1_wu1": [0.5, 0.3, 0.2, 0.104],
    }
    for w, losses in ((1, losses_1), (2, losses_2)):
        for cand, loss in losses.items():
            rid = f"local_gloo_n1_w{w}_b75_lrlinear_{cand}_r0"
            if failed_w2 and w == 2:
                write_failure(tmp_path, rid)
                continue
            warm = int(cand[-1])
            write_record(
                tmp_path,
                record_from_epochs(rid, [x / w for x in W], test_loss=loss, warmup_epochs=warm),
            )


def test_select_tuned_picks_the_known_best_candidate(tmp_path):
    _write_hand_made(tmp_path)
    agg = aggregate(tmp_path, _cfg())
    # the candidates use the untuned 1-worker target and stay out of summary.csv
    c = agg.runs[agg.runs["candidate"] != ""]
    assert c["target_test_loss"].tolist() == pytest.approx([0.105] * len(c))
    assert len(agg.summary) == 2
    tuned = select_tuned(agg.runs, agg.status).set_index("workers")
    assert tuned.loc[1, "candidate"] == "m2_wu0" and tuned.loc[1, "status"] == "selected"
    assert tuned.loc[1, "time_to_target_s"] == pytest.approx(3.0)
    # tie at 1.5 s between m2_wu0 and m2_wu1: the lower final test loss wins
    assert tuned.loc[2, "candidate"] == "m2_wu1"
    assert tuned.loc[2, "time_to_target_s"] == pytest.approx(1.5)
    assert tuned.loc[2, "n_candidates"] == 6 and tuned.loc[2, "n_candidates_completed"] == 4
    assert tuned.loc[2, "speedup_ttt"] == pytest.approx(2.0)
    assert "fewer than 3" in tuned.loc[2, "ci_note"]
    assert tuned.loc[2, "lr_multiplier"] == 2 and tuned.loc[2, "warmup_epochs"] == 1


def test_a_group_whose_candidates_all_failed_is_reported(tmp_path):
    _write_hand_made(tmp_path, failed_w2=True)
    agg = aggregate(tmp_path, _cfg())
    tuned = select_tuned(agg.runs, agg.status).set_index("workers")
    assert tuned.loc[2, "status"] == "all_failed"
    assert tuned.loc[2, "n_candidates_completed"] == 0
    assert pd.isna(tuned.loc[2, "speedup_ttt"])
    assert tuned.loc[1, "status"] == "selected"


def test_select_tuned_on_a_simulated_study_and_its_figures(tmp_path):
    cfg = _cfg({**TUNE, "batch_sizes": [75, 1000], "repeats": 3}, repeats=3)
    write_study(tmp_path, cfg, train_samples=30000)
    agg = aggregate(tmp_path, cfg)
    tuned = select_tuned(agg.runs, agg.status)
    assert len(tuned) == 4  # (batch 75, 1000) x (1, 2 workers)
    assert set(tuned["status"]) <= {"selected", "none_reached", "all_failed"}
    assert len(candidates(agg.runs)) == 2 * 2 * 6
    ok = tuned[tuned["speedup_ttt_lo"].notna()]
    assert len(ok) >= 2
    assert (tuned["speedup_ttt_lo"].notna() | (tuned["ci_note"] != "")).all()
    assert (ok["speedup_ttt_lo"] <= ok["speedup_ttt"]).all()
    assert (ok["speedup_ttt"] <= ok["speedup_ttt_hi"]).all()

    import matplotlib

    matplotlib.use("Agg", force=True)
    from hvdscale.analysis.fig_accuracy import fig_speedup_ttt, fig_tune_heatmap

    fig_tune_heatmap(agg.runs, agg.summary, agg.epochs, None)
    fig_speedup_ttt(agg.runs, agg.summary, agg.epochs, None)


def test_rerun_records_never_enter_the_selection():
    from hvdscale.analysis.tuning import candidate_runs

    runs = pd.DataFrame(
        {
            "run_id": [
                "local_mpi_n1_w2_b75_lrlinear_m2_wu1_r0",
                "local_mpi_n1_w2_b75_lrlinear_m2_wu1_rerun_r0",
                "local_mpi_n1_w2_b75_lrlinear_r0",
            ],
            "candidate": ["m2_wu1", "m2_wu1", ""],
        }
    )
    assert list(candidate_runs(runs)["run_id"]) == ["local_mpi_n1_w2_b75_lrlinear_m2_wu1_r0"]
