"""The learning-rate re-tuning sweep: run table, run config, and select_tuned on hand-made
and simulated run records (tests/fixtures_runs.py)."""

import math

import pandas as pd
import pytest
from fixtures_runs import record_from_epochs, write_failure, write_record, write_study

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.tuning import candidates, select_tuned
from hvdscale.config.load import validate_config
from hvdscale.errors import ConfigError
from hvdscale.matrix.runtable import find_run, run_config, run_table

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


LOSS_1W = [0.5, 0.3, 0.2, 0.10]
TARGET = 0.105  # the study-wide target validation loss (fixed before training)
W = [1.0, 1.0, 1.0, 1.0]


def _write_hand_made(tmp_path, failed_w2=False):
    # 1-worker candidates: m2_wu0 reaches the target at epoch 2, m1_wu1 at epoch 3
    losses_1 = {"m2_wu0": [0.4, 0.2, 0.1, 0.09], "m1_wu1": LOSS_1W}
    # 2-worker candidates: m2_wu1 and m2_wu0 reach it at epoch 2 (tie: m2_wu1's best
    # validation loss is lower); m0p5_wu0 never does (censored)
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
            rec = record_from_epochs(
                rid, [x / w for x in W], test_loss=loss, warmup_epochs=warm, target_test_loss=TARGET
            )
            write_record(tmp_path, rec)


def test_selection_on_validation_time_to_target(tmp_path):
    _write_hand_made(tmp_path)
    agg = aggregate(tmp_path)
    c = agg.runs[agg.runs["candidate"] != ""]
    assert c["target_val_loss"].tolist() == pytest.approx([TARGET] * len(c))
    assert agg.summary.empty  # candidates are not scaling configurations
    tuned = select_tuned(agg.runs, agg.status).set_index("workers")
    assert tuned.loc[1, "candidate"] == "m2_wu0"
    assert tuned.loc[1, "selection_time_to_target_s"] == pytest.approx(3.0)
    # tie at 1.5 s between m2_wu0 and m2_wu1: the lower best validation loss wins
    assert tuned.loc[2, "candidate"] == "m2_wu1"
    assert tuned.loc[2, "selection_time_to_target_s"] == pytest.approx(1.5)
    assert tuned.loc[2, "n_candidates"] == 4 and tuned.loc[2, "n_candidates_reached"] == 3
    assert tuned.loc[2, "lr_multiplier"] == 2 and tuned.loc[2, "warmup_epochs"] == 1
    # no re-runs yet: nothing tuned is reported from the selection runs
    assert (tuned["status"] == "awaiting_reruns").all()
    assert tuned["time_to_target_s"].isna().all() and tuned["speedup_ttt"].isna().all()
    assert "awaiting reruns" in tuned.loc[2, "ci_note"]


def test_a_group_whose_candidates_all_failed_is_reported(tmp_path):
    _write_hand_made(tmp_path, failed_w2=True)
    agg = aggregate(tmp_path)
    tuned = select_tuned(agg.runs, agg.status).set_index("workers")
    assert tuned.loc[2, "status"] == "all_failed"
    assert tuned.loc[2, "n_candidates_completed"] == 0
    assert pd.isna(tuned.loc[2, "speedup_ttt"])
    assert tuned.loc[1, "status"] == "awaiting_reruns"


def _run(workers, cand, repeat, ttt, kind="", val=0.1, epoch_time=1.0):
    """A runs.csv row of a tuning run (the aggregation's columns that tuning reads)."""
    suffix = f"_{kind}" if kind else ""
    return {
        "run_id": f"local_gloo_n1_w{workers}_b75_lrlinear_{cand}{suffix}_r{repeat}",
        "partition": "local",
        "backend": "gloo",
        "batch_per_worker": 75,
        "workers": workers,
        "lr_rule": "linear",
        "candidate": cand,
        "kind": kind,
        "repeat": repeat,
        "status": "completed",
        "lr_multiplier": float(cand[1:].split("_")[0].replace("p", ".")),
        "warmup_epochs": int(cand[-1]),
        "learning_rate": 1e-3,
        "global_batch": 75 * workers,
        "reached_target": math.isfinite(ttt),
        "time_to_target_s": ttt,
        "epochs_to_target": ttt / epoch_time,
        "final_test_loss": 0.1,
        "best_val_loss": val,
        "epoch_time_s": epoch_time,
        "target_val_loss": TARGET,
        "target_in_warmup": False,
    }


def test_tuned_times_come_from_the_reruns_not_the_lucky_selection_runs():
    rows = []
    for w, e in ((1, 1.0), (2, 0.5)):
        rows.append(_run(w, "m1_wu0", 0, 10.0 * e, epoch_time=e))
        rows.append(_run(w, "m2_wu0", 0, 4.0 * e, epoch_time=e))  # lucky: wins the selection
        # its re-runs with fresh seeds are slower; 2 workers: one of five censored
        reruns = [6.0, 7.0, 8.0, 6.5, 7.5] if w == 1 else [4.0, 4.5, 5.0, 3.5, math.inf]
        rows += [_run(w, "m2_wu0", k, t, "rerun", epoch_time=e) for k, t in enumerate(reruns)]
    tuned = select_tuned(pd.DataFrame(rows)).set_index("workers")
    assert (tuned["candidate"] == "m2_wu0").all() and (tuned["status"] == "selected").all()
    assert tuned.loc[1, "selection_time_to_target_s"] == 4.0
    assert tuned.loc[1, "time_to_target_s"] == 7.0  # median of the re-runs
    assert tuned.loc[2, "time_to_target_s"] == 4.5  # the censored re-run counts as +inf
    assert (tuned.loc[2, "n_reached_target"], tuned.loc[2, "n_ttt_total"]) == (4, 5)
    assert tuned.loc[2, "n_repeats"] == 5
    assert tuned.loc[2, "speedup_ttt"] == pytest.approx(7.0 / 4.5)
    assert tuned.loc[2, "speedup_ttt_lo"] <= 7.0 / 4.5 <= tuned.loc[2, "speedup_ttt_hi"]
    assert tuned.loc[2, "speedup"] == pytest.approx(2.0)


def test_fewer_than_three_reruns_give_no_interval():
    rows = []
    for w in (1, 2):
        rows.append(_run(w, "m1_wu0", 0, 4.0 / w))
        rows += [_run(w, "m1_wu0", k, 5.0 / w, "rerun") for k in range(2)]
    tuned = select_tuned(pd.DataFrame(rows)).set_index("workers")
    assert tuned.loc[2, "speedup_ttt"] == pytest.approx(2.0)
    assert math.isnan(tuned.loc[2, "speedup_ttt_lo"]) and "fewer than 3" in tuned.loc[2, "ci_note"]


def test_select_tuned_on_a_simulated_study_and_its_figures(tmp_path):
    cfg = _cfg({**TUNE, "batch_sizes": [75, 1000], "repeats": 3}, repeats=3)
    write_study(tmp_path, cfg, train_samples=30000)
    agg = aggregate(tmp_path, cfg)
    first = select_tuned(agg.runs, agg.status)
    assert len(first) == 4  # (batch 75, 1000) x (1, 2 workers)
    assert set(first["status"]) <= {"awaiting_reruns", "none_reached", "all_failed"}
    assert len(candidates(agg.runs)) == 2 * 2 * 6
    # the winners' re-runs (here: copies of the selection runs, 10 % slower)
    sel = first[first["status"] == "awaiting_reruns"]
    keys = ["partition", "backend", "batch_per_worker", "workers", "lr_rule", "candidate"]
    won = agg.runs.merge(sel[keys], on=keys)
    won = won.assign(
        kind="rerun",
        run_id=won["run_id"].str.replace(r"_r([0-9]+)$", r"_rerun_r\1", regex=True),
        time_to_target_s=won["time_to_target_s"] * 1.1,
    )
    everything = pd.concat([agg.runs, won], ignore_index=True)
    tuned = select_tuned(everything, agg.status)
    assert set(tuned["status"]) <= {"selected", "none_reached", "all_failed"}
    merged = tuned.merge(first, on=keys[:4], suffixes=("", "_first"))
    done = merged[merged["status"] == "selected"]
    assert (done["time_to_target_s"] == done["selection_time_to_target_s"] * 1.1).all()
    ok = tuned[tuned["speedup_ttt_lo"].notna()]
    assert len(ok) >= 2
    assert (tuned["speedup_ttt_lo"].notna() | (tuned["ci_note"] != "")).all()
    assert (ok["speedup_ttt_lo"] <= ok["speedup_ttt"]).all()
    assert (ok["speedup_ttt"] <= ok["speedup_ttt_hi"]).all()

    import matplotlib

    matplotlib.use("Agg", force=True)
    from hvdscale.analysis.headline import headline
    from hvdscale.analysis.references import references_of
    from hvdscale.figures.time_to_target import fig_speedup_ttt, fig_tune_heatmap, tuned_points

    fig_tune_heatmap(agg.runs, agg.summary, agg.epochs, None, references_of(None))
    head = headline(everything, tuned)
    # the figure's tuned points are headline.csv's tuned rows, each series from 1 worker
    pts = tuned_points(head)
    n = int((head["tuned"] & head["speedup_ttt"].notna()).sum())
    assert n >= 1 and len(pts) == n + len(pts[pts["workers"] == 1])
    fig_speedup_ttt(agg.runs, agg.summary, agg.epochs, None, references_of(None), head)


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


def test_headline_tuned_rows_come_from_the_reruns():
    from hvdscale.analysis.headline import headline

    rows = []
    for w, e in ((1, 1.0), (2, 0.5)):
        rows.append(_run(w, "m2_wu0", 0, 2.0 * e, epoch_time=e))  # lucky selection run
        reruns = [6.0, 7.0, 8.0, 6.5, 7.5] if w == 1 else [4.0, 4.5, 5.0, 3.5, 4.2]
        rows += [_run(w, "m2_wu0", k, t * e, "rerun", epoch_time=e) for k, t in enumerate(reruns)]
    h = headline(pd.DataFrame(rows))
    assert len(h) == 1 and bool(h.loc[0, "tuned"])
    r = h.iloc[0]
    # epochs to target = time / epoch time: medians 7.0 (1 worker) and 4.2 (2 workers)
    assert r.epochs_ratio == pytest.approx(7.0 / 4.2)
    assert r.epoch_speedup == pytest.approx(2.0)
    assert r.speedup_ttt == pytest.approx(2.0 * 7.0 / 4.2)
    assert (r.reached, r.total) == (5, 5)
    assert r.speedup_ttt_lo <= r.speedup_ttt <= r.speedup_ttt_hi


def _two_worker_tuning_only():
    """Re-runs of a 2-worker tuning group and untuned 1-worker scaling runs: a sweep that
    tunes 2 workers only."""
    rows = [_run(2, "m2_wu0", 0, 2.0, epoch_time=0.5)]  # the selection run
    rows += [
        _run(2, "m2_wu0", k, t * 0.5, "rerun", epoch_time=0.5)
        for k, t in enumerate([4.0, 4.5, 5.0, 3.5, 4.2])
    ]
    for k, t in enumerate([6.0, 7.0, 8.0, 6.5, 7.5]):
        r = _run(1, "m1_wu0", k, t, epoch_time=1.0)
        r.update(run_id=f"local_gloo_n1_w1_b75_lrlinear_r{k}", candidate="")
        rows.append(r)
    return rows


def test_tuned_rows_without_a_1_worker_tuning_group_have_no_tuned_speedup():
    """Issue 30, like against like: a sweep that tunes 2 workers only gives no tuned
    speedup (never tuned 2 workers against untuned 1 worker); the row says why and keeps
    the 2-worker re-runs' counts."""
    from hvdscale.analysis.headline import NO_TUNED_BASELINE, headline

    rows = _two_worker_tuning_only()
    h = headline(pd.DataFrame(rows))
    tuned = h[h["tuned"]].iloc[0]
    assert math.isnan(tuned.speedup_ttt) and math.isnan(tuned.speedup_ttt_lo)
    assert (tuned.reached, tuned.total, tuned.base_reached, tuned.base_total) == (5, 5, 0, 0)
    assert tuned.note == NO_TUNED_BASELINE
    # a group whose candidates all missed the target says so, with 0/0 counts
    missed = [_run(2, "m2_wu0", 0, math.inf, epoch_time=0.5)] + rows[6:]
    t2 = headline(pd.DataFrame(missed))
    t2 = t2[t2["tuned"]].iloc[0]
    assert "no tuned 1-worker baseline" in t2.note and t2.base_total == 0


def test_the_ttt_figure_plots_the_tuned_rows_of_the_headline():
    """Figure 1's tuned series is the headline table's: tuned 2 workers against tuned 1
    worker; a sweep that tunes 2 workers only has no tuned point."""
    from hvdscale.analysis.headline import headline
    from hvdscale.figures.time_to_target import tuned_points

    rows = []
    for w, e in ((1, 1.0), (2, 0.5)):
        rows.append(_run(w, "m2_wu0", 0, 2.0 * e, epoch_time=e))
        times = [6.0, 7.0, 8.0, 6.5, 7.5] if w == 1 else [4.0, 4.5, 5.0, 3.5, 4.2]
        rows += [_run(w, "m2_wu0", k, t * e, "rerun", epoch_time=e) for k, t in enumerate(times)]
    pts = tuned_points(headline(pd.DataFrame(rows))).set_index("workers")
    assert pts.loc[1, "speedup_ttt"] == 1.0
    assert pts.loc[2, "speedup_ttt"] == pytest.approx(2.0 * 7.0 / 4.2)
    assert pts.loc[2, "speedup_ttt_lo"] <= pts.loc[2, "speedup_ttt"] <= pts.loc[2, "speedup_ttt_hi"]
    # tuned 2 workers only: no tuned point at all
    assert tuned_points(headline(pd.DataFrame(_two_worker_tuning_only()))) is None


def test_a_diverged_run_counts_as_not_reached_never_drops_out():
    """Issue 30: a run whose loss became NaN (status nan_loss) never reaches the target; it
    is censored like a run out of budget, in the headline's reached/total, its median and
    interval, and in the selection of tuning candidates (a high learning rate that
    diverges in 3 of 5 runs has no median; it does not win on its 2 lucky runs)."""
    from hvdscale.analysis.headline import headline
    from hvdscale.analysis.tuning import select_tuned

    rows = []
    for w, e in ((1, 1.0), (2, 0.5)):
        times = [6.0, 7.0, 8.0, 6.5, 7.5] if w == 1 else [4.0, 4.5, 5.0, 3.5, 4.2]
        for k, t in enumerate(times):
            r = _run(w, "m1_wu0", k, t * e, "rerun", epoch_time=e)
            rows.append(r)
        rows.append(_run(w, "m1_wu0", 0, 2.0 * e, epoch_time=e))  # the selection run
    # two of the 2-worker re-runs diverge: NaN loss, no time to target in the record
    for r in rows:
        if r["workers"] == 2 and r["kind"] == "rerun" and r["repeat"] in (1, 3):
            r.update(status="nan_loss", reached_target=False, time_to_target_s=float("nan"))
            r.update(epochs_to_target=float("nan"), epoch_time_s=float("nan"))
    h = headline(pd.DataFrame(rows))
    r = h[h["tuned"]].iloc[0]
    assert (r.reached, r.total, r.base_reached, r.base_total) == (3, 5, 5, 5)
    # the median of (4.0, 5.0, 4.2, inf, inf) x 0.5 is 2.5: 7.0 / 2.5
    assert r.speedup_ttt == pytest.approx(7.0 / 2.5)
    assert r.epoch_speedup == pytest.approx(2.0)  # the diverged runs carry no epoch time
    # in the selection: a candidate diverging in 2 of 3 runs has no median and loses
    sel = [_run(2, "m2_wu0", k, t, val=0.05) for k, t in enumerate([1.0, 1.1, 1.2])]
    sel += [_run(2, "m1_wu0", k, t) for k, t in enumerate([2.0, 2.1, 2.2])]
    for r in sel[:2]:
        r.update(status="nan_loss", reached_target=False, time_to_target_s=float("nan"))
    tuned = select_tuned(pd.DataFrame(sel))
    assert list(tuned["candidate"]) == ["m1_wu0"]
