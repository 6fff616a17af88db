"""The report's equal-accuracy pages (issue 16): the generated headline sentences, the
readers of headline.csv and target.json, the times to target with censored runs, the
method text, mislabelled runs and the config header; and a report rendered from
synthetic tables with its first page checked."""

from __future__ import annotations

import math
import shutil
import subprocess

import pandas as pd
import pytest
import report_fixtures as RF
from required_layers import layer_skipif

from hvdscale.analysis.stats import censored_median
from hvdscale.analysis.tables import read_headline
from hvdscale.errors import UserError
from hvdscale.report import fmt
from hvdscale.report.equal_accuracy import CENSORED, conclusion, ttt_rows
from hvdscale.report.headline_text import (
    NO_INTERVAL,
    batch_sentence,
    headline_sentence,
    headline_sentences,
)
from hvdscale.target import read_target

D = fmt.EN_DASH


def test_sentence_when_the_target_is_reached():
    row = RF.headline_row(epochs_ratio=1.4 / 1.8)
    s = headline_sentence(row)
    assert s == (
        f"2 workers reach the target validation loss 1.40x [1.20{D}1.70] faster than 1 worker "
        f"(5/5 reached; 1 worker 5/5); epoch time 1.80x [1.70{D}1.90]; "
        "the time-to-target speedup is 0.78x the epoch-time speedup (ratio of the medians; "
        "the epochs ratio and the warm-up make up the rest)"
    )
    assert "survives" not in s  # a ratio of speedups, not a share of a gain


def test_sentence_when_slower_says_so():
    s = headline_sentence(
        RF.headline_row(epochs_ratio=0.5, speedup_ttt_lo=0.8, speedup_ttt_hi=0.99)
    )
    assert "more slowly than 1 worker: speedup 0.90x" in s and "faster than" not in s
    assert "the time-to-target speedup is 0.50x the epoch-time speedup" in s


def test_sentence_when_the_interval_holds_one_claims_neither_direction():
    for s_, lo, hi in ((0.99, 0.57, 1.36), (1.01, 0.88, 1.22), (1.0, 1.0, 1.3)):
        s = headline_sentence(RF.headline_row(speedup_ttt=s_, speedup_ttt_lo=lo, speedup_ttt_hi=hi))
        assert "neither clearly faster nor slower than 1 worker: speedup" in s, s
        assert f"{s_:.2f}x [{lo:.2f}{D}{hi:.2f}], the interval holds 1 (5/5 reached" in s
        assert "faster than 1 worker (" not in s and "more slowly" not in s


def test_an_open_interval_end_is_printed_as_such_and_decides_the_words():
    """Issue 30: a censored resample gives an interval end of +inf (or 0); it is printed
    open, and "faster" is said only where the whole interval lies above 1."""
    inf = float("inf")
    s = headline_sentence(RF.headline_row(speedup_ttt=1.4, speedup_ttt_lo=1.1, speedup_ttt_hi=inf))
    assert "1.40x [1.10, inf) faster than 1 worker" in s
    s = headline_sentence(RF.headline_row(speedup_ttt=1.4, speedup_ttt_lo=0.8, speedup_ttt_hi=inf))
    assert "1.40x [0.80, inf), the interval holds 1" in s and "faster than 1 worker (" not in s
    s = headline_sentence(RF.headline_row(speedup_ttt=0.6, speedup_ttt_lo=0.0, speedup_ttt_hi=0.9))
    assert "more slowly than 1 worker: speedup 0.60x (0, 0.90]" in s
    s = headline_sentence(RF.headline_row(speedup_ttt=0.9, speedup_ttt_lo=0.0, speedup_ttt_hi=inf))
    assert "(0, inf), the interval holds 1" in s and "slowly" not in s


def test_no_interval_no_direction():
    """Too few repeats for an interval: the speedup is given, a direction is not."""
    nan = float("nan")
    for s_ in (0.5, 1.6):
        row = RF.headline_row(
            speedup_ttt=s_, speedup_ttt_lo=nan, speedup_ttt_hi=nan, total=2, base_total=2,
            reached=2, base_reached=2,
        )  # fmt: skip
        s = headline_sentence(row)
        assert f"at a speedup of {s_:.2f}x over 1 worker, too few runs to say" in s, s
        assert "faster than 1 worker (" not in s and "more slowly" not in s


def test_sentence_without_a_faster_epoch_names_the_hardware_not_a_share():
    row = RF.headline_row(epoch_speedup=0.97, epoch_lo=0.8, epoch_hi=1.07, epochs_ratio=0.93)
    s = headline_sentence(row)
    # the epoch-time interval holds 1: neither "faster" nor "not faster" from the point
    assert f"no epoch-time gain shown: the epoch-time interval 0.97x [0.80{D}1.07] holds 1" in s
    assert "survives" not in s and "not faster" not in s
    slow = headline_sentence(RF.headline_row(epoch_speedup=0.9, epoch_lo=0.8, epoch_hi=0.95))
    assert f"no epoch-time gain to keep: the epoch itself is slower (0.90x [0.80{D}0.95]" in slow
    one = headline_sentence(RF.headline_row(epoch_speedup=0.9, epoch_lo=math.nan))
    assert "the epoch-time speedup 0.90x has no interval" in one and "slower" not in one


def test_sentence_when_censored_has_no_median_and_names_the_factor():
    none = headline_sentence(RF.censored_row(0))
    assert none.startswith("2 workers do not reach the target (0/5 reached, 5 hit the budget)")
    assert "epoch time 1.80x" in none and "needs more epochs" in none
    assert f"predicts an epochs ratio of 0.94 [0.88{D}0.97]" in none and "faster than" not in none
    some = headline_sentence(RF.censored_row(2))
    assert "reach the target in only 2/5 runs (2/5 reached, 3 hit the budget): no median" in some
    # an epoch-time interval that holds 1 names no factor (no direction from the point)
    held = headline_sentence(RF.censored_row(0, epoch_speedup=0.9, epoch_lo=0.8, epoch_hi=1.0))
    assert f"the epoch-time speedup 0.90x [0.80{D}1.00]: its interval holds 1" in held
    assert "not faster" not in held and "slower" not in held
    slow = headline_sentence(RF.censored_row(0, epoch_speedup=0.9, epoch_lo=0.8, epoch_hi=0.95))
    assert f"the epoch itself is slower (0.90x [0.80{D}0.95]: hardware" in slow
    base = headline_sentence(RF.censored_row(5, base_reached=2))
    assert base.startswith("1 worker reaches the target in only 2/5 runs (2/5 reached, 3 hit")
    # diverged runs are named as such, not as budget
    div = headline_sentence(RF.censored_row(2, diverged=3))
    assert "only 2/5 runs (2/5 reached, 3 diverged (non-finite loss)): no median" in div
    assert "budget" not in div and "needs more epochs" not in div
    mixed = headline_sentence(RF.censored_row(0, diverged=2))
    assert "(0/5 reached, 2 diverged (non-finite loss), 3 hit the budget)" in mixed
    ok = headline_sentence(RF.headline_row(reached=4, diverged=1, base_reached=5))
    assert "(4/5 reached, 1 diverged (non-finite loss); 1 worker 5/5)" in ok


def test_sentence_without_an_interval_says_why():
    s = headline_sentence(
        RF.headline_row(total=2, base_total=2, reached=2, base_reached=2, speedup_ttt_lo=math.nan)
    )
    assert "(2/2 reached; 1 worker 2/2; no interval: fewer than 3 repeats)" in s
    assert NO_INTERVAL == "no interval: fewer than 3 repeats"


def test_sentences_per_batch_untuned_and_tuned_or_missing():
    rows = [
        RF.headline_row(batch_per_worker=75),
        RF.headline_row(batch_per_worker=75, tuned=True, epochs_ratio=0.9),
        RF.censored_row(0, batch_per_worker=1000),
        RF.headline_row(batch_per_worker=75, workers=1),  # a baseline row: no sentence
    ]
    out = headline_sentences(pd.DataFrame(rows))
    assert len(out) == 2
    b75, b1000 = out
    # every number names its baseline (issue 30): untuned against untuned, tuned against tuned
    assert b75.startswith(
        "Batch 75 per worker (local, mpi): untuned (baseline: the 1-worker runs of this "
        "batch and LR rule), 2 workers reach"
    )
    assert (
        ". Tuned (winners re-run with fresh seeds; baseline: the tuned 1-worker re-runs), "
        "2 workers reach the target"
    ) in b75
    assert "1.62x" in b75  # 1.8 x 0.9
    assert b1000.startswith("Batch 1000 per worker (local, mpi): untuned (baseline: the")
    assert b1000.endswith("Tuned: no re-runs of a tuned configuration (not in the tuning sweep).")
    assert batch_sentence(None, RF.headline_row(tuned=True)).startswith(
        "Batch 75 per worker (local, mpi): untuned: no configuration"
    )


def test_the_fastest_1_worker_baseline_stands_beside_the_per_batch_one():
    """Issue 30: beside each per-batch speedup, the one against the fastest 1-worker
    configuration to the target, named, with its interval and only the words it supports."""
    row = RF.headline_row(
        best1_baseline="batch 1000, LR none",
        speedup_ttt_best1=0.85, speedup_ttt_best1_lo=0.6, speedup_ttt_best1_hi=1.1,
    )  # fmt: skip
    s = batch_sentence(row, None)
    want = (
        "; against the fastest 1-worker configuration of this setting (batch 1000, LR none; "
        "chosen on these runs, the interval resamples the choice): "
    )
    assert want + f"0.85x [0.60{D}1.10], the interval holds 1" in s
    row.update(speedup_ttt_best1_lo=0.5, speedup_ttt_best1_hi=0.9)
    assert "the choice): 0.85x [0.50" in batch_sentence(row, None)
    assert "0.90], slower" in batch_sentence(row, None)
    row.update(best1_baseline="")
    assert "fastest 1-worker" not in batch_sentence(row, None)


def test_a_tuned_row_without_a_tuned_1_worker_baseline_says_so():
    from hvdscale.analysis.headline import NO_TUNED_BASELINE

    nan = float("nan")
    row = RF.headline_row(
        tuned=True, speedup_ttt=nan, speedup_ttt_lo=nan, speedup_ttt_hi=nan, base_total=0,
        base_reached=0, note=NO_TUNED_BASELINE,
    )  # fmt: skip
    s = headline_sentence(row)
    assert s.startswith("no tuned 1-worker baseline: the tuning sweep has no 1-worker group")
    assert "faster" not in s


def test_conclusions_follow_from_the_numbers():
    def c(**kw):
        return conclusion(pd.DataFrame([RF.headline_row(**kw)]).iloc[0])

    assert "needs 1.33x the epochs of 1 worker" in c()
    assert "the time-to-target speedup is 0.75x the epoch-time speedup" in c()
    assert c().startswith("Batch 75, 2 workers (local, mpi, untuned): time to target 1.35x")
    assert "(local, mpi, bf16, compile default, tuned)" in c(
        precision="bf16", compile="default", tuned=True
    )
    # the measured speedup keeps the fixed costs the two factors leave out
    slow_start = c(fixed_factor=0.8)
    assert "time to target 1.08x = epoch time 1.80x" in slow_start
    assert "x 0.80 (the rest: the warm-up epochs beyond a steady-state epoch)" in slow_start
    assert "the time-to-target speedup is 0.60x the epoch-time speedup" in slow_start
    cens = conclusion(pd.DataFrame([RF.censored_row(1)]).iloc[0])
    assert "no median time to target (1/5 reached: 4 hit the budget)" in cens
    assert f"although the epoch is faster (1.80x [1.70{D}1.90])" in cens
    assert "epochs-to-target factor" in cens
    div = conclusion(pd.DataFrame([RF.censored_row(1, diverged=4)]).iloc[0])
    assert "(1/5 reached: 4 diverged (non-finite loss))" in div and "budget" not in div
    assert "statistics" not in div
    hw = conclusion(
        pd.DataFrame([RF.censored_row(1, epoch_speedup=0.9, epoch_lo=0.8, epoch_hi=0.95)]).iloc[0]
    )
    assert "the epoch is slower (0.90x" in hw and "the hardware factor stops it" in hw
    # a point estimate below 1 whose interval holds 1: no factor named
    held = conclusion(
        pd.DataFrame([RF.censored_row(1, epoch_speedup=0.95, epoch_lo=0.8, epoch_hi=1.05)]).iloc[0]
    )
    assert "do not say which factor" in held and "hardware factor" not in held


def test_headline_reader_names_the_file_and_the_problem(tmp_path):
    good = RF.write_headline(tmp_path / "headline.csv", [RF.headline_row(), RF.censored_row(0)])
    df = read_headline(good)
    assert list(df["tuned"]) == [False, False] and df["reached"].tolist() == [5, 0]
    assert math.isnan(df["speedup_ttt"].iloc[1])
    bad = tmp_path / "bad.csv"
    for text, needle in (
        (good.read_text().replace("ci_method", "method"), "missing column(s) ci_method"),
        (good.read_text().replace(",False,", ",maybe,", 1), "column tuned must be"),
        (
            good.read_text().replace(",5,5,5,5,0,0,", ",5,x,5,5,0,0,", 1),
            "column total must be a count",
        ),
        ("", "not a readable CSV"),
    ):
        bad.write_text(text)
        with pytest.raises(UserError, match="headline table .*bad.csv") as e:
            read_headline(bad)
        assert needle in str(e.value)
    with pytest.raises(UserError, match="not found"):
        read_headline(tmp_path / "none.csv")


def test_target_reader_and_description(tmp_path):
    from hvdscale.target import describe

    cal = read_target(RF.write_target(tmp_path / "t.json", RF.target_spec()))
    text = describe(cal)
    assert "0.0105 = (1 + 5 %) x 0.01" in text and "3 calibration runs" in text
    assert "local_mpi_n1_w1_b75_lrnone_cal_r2" in text
    assert "absolute" in describe(RF.target_spec("absolute"))
    for broken, needle in (
        ("{", "not valid JSON"),
        ('{"mode": "absolute"}', "missing key(s) value"),
        ({**RF.target_spec(), "mode": "relative"}, "mode must be"),
        ({**RF.target_spec(), "value": "low"}, "value must be a positive number"),
        ({**RF.target_spec(), "percent": None}, "needs numbers percent"),
    ):
        p = tmp_path / "broken.json"
        p.write_text(broken if isinstance(broken, str) else __import__("json").dumps(broken))
        with pytest.raises(UserError, match="target file .*broken.json") as e:
            read_target(p)
        assert needle in str(e.value)


def test_censored_median_and_every_time_to_target():
    inf = math.inf  # the table's medians are the analysis' (analysis.stats.censored_median)
    assert censored_median([10, 11, 12, inf, inf])[0] == 12  # 2/5 censored: a median
    assert math.isnan(censored_median([10, 11, inf, inf, inf])[0])  # 3/5: none
    ids = [f"local_mpi_n1_w2_b75_lrnone_r{k}" for k in range(5)]
    ids += ["local_mpi_n1_w2_b75_lrnone_m2p0_wu1_r0"]  # a selection run: not listed
    ids += ["local_mpi_n1_w2_b75_lrnone_m2p0_wu1_rerun_r0", "local_mpi_n1_w1_b75_lrnone_cal_r0"]
    times = [10.0, 11.0, math.nan, 12.0, math.nan, 5.0, 9.0, 30.0]
    runs = pd.DataFrame(
        dict(
            run_id=ids,
            partition="local",
            backend="mpi",
            batch_per_worker=75,
            workers=[2] * 7 + [1],
            global_batch=150,
            repeat=[0, 1, 2, 3, 4, 0, 0, 0],
            status="completed",
            candidate=[""] * 5 + ["m2p0_wu1"] * 2 + [""],
            time_to_target_s=times,
            reached_target=[math.isfinite(t) for t in times],
        )
    )
    status = runs[["run_id", "status"]].copy()
    status.loc[3, "status"] = "mislabelled"
    rows = ttt_rows(runs, status)
    assert [r["config"] for r in rows] == [
        "local_mpi_n1_w2_b75_lrnone",
        "local_mpi_n1_w2_b75_lrnone_m2p0_wu1_rerun",
    ]
    plain, rerun = rows
    assert (plain["reached"], plain["total"], plain["tuned"]) == (2, 4, False)
    each = f"{fmt.seconds(10.0)}, {fmt.seconds(11.0)}, {CENSORED}, {CENSORED}"
    assert plain["each"] == each and math.isnan(plain["median"])  # 2/4 censored: no median
    assert rerun["tuned"] and rerun["median"] == 9.0
    # a diverged run is listed as not reached, never dropped (issue 30)
    runs.loc[1, "status"] = status.loc[1, "status"] = "nan_loss"  # lost before the target
    runs.loc[1, ["time_to_target_s", "reached_target"]] = [math.nan, False]
    plain = ttt_rows(runs, status)[0]
    assert (plain["reached"], plain["total"], plain["diverged"]) == (1, 4, 1)
    # named as diverged, not as a run that hit its budget
    assert plain["each"] == f"{fmt.seconds(10.0)}, diverged, {CENSORED}, {CENSORED}"


def test_method_text_states_the_rules():
    from hvdscale.project import PROJECT_ROOT
    from hvdscale.report.method_section import equal_accuracy_bullets

    cfg = {
        "training": {"instrument_every": 10, "max_epochs": 40, "max_train_s": 600},
        "data": {"val_fraction": 0.1},
        "scaling": {"tune": {"rerun_repeats": 5}},
    }
    runs = pd.DataFrame({"instrumentation_overhead": [0.02, 0.04, 0.03]})
    text = " ".join(equal_accuracy_bullets(cfg, RF.target_spec(), RF.CI_METHOD, runs))
    for needle in (
        RF.CI_METHOD,
        "scipy.stats.bootstrap",
        "paired design",
        "10 % of the train share",
        "test loss is evaluated once",
        "0.0105 = (1 + 5 %)",
        "training.max_epochs = 40, training.max_train_s = 600 s",
        "fewer than half of the repeats did not reach it",
        "named as diverged",
        "(5 re-runs, scaling.tune.rerun_repeats)",
        "every 10-th call",
        "3.0 % (median over 3 runs",
    ):
        assert needle in text, needle
    assert "Horovod allreduce" not in text
    assert PROJECT_ROOT  # the import works without TensorFlow


def test_config_file_listed_once_in_the_header():
    from hvdscale.report.provenance import collect

    info = collect(
        config_file=["config/config.yaml", "config/config.yaml", "x.yaml"],
        cfg=None,
        runs=None,
        provenance=None,
    )
    assert info["config_file"] == "config/config.yaml + x.yaml"
    assert info["config_file_sha256"].count("config.yaml:") == 1


# ------------------------------------------------------------------ a rendered report


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The test_report pipeline's tables plus a headline, a target, a censored run and a
    mislabelled run; the report rendered with the config file given twice."""
    import fixtures_runs as F
    from test_report import CONFIG_FILE, pipeline

    from hvdscale.analysis.tables import read_runs, read_status
    from hvdscale.cli import main

    root = tmp_path_factory.mktemp("headline")
    cfg = F.load_test_config("config.yaml", repeats=3)
    F.write_study(root / "runs", cfg)
    out = pipeline(root, cfg, root / "runs", F.study_allreduce(root / "ar", cfg))
    runs, status = read_runs(out["runs"]), read_status(out["status"])
    # the fixture's 2-worker runs miss the target: one gloo repeat reaches it, the others
    # stay censored
    gloo2 = runs.index[(runs.workers == 2) & (runs.backend == "gloo")]
    runs.loc[gloo2, ["reached_target", "time_to_target_s"]] = [False, math.nan]
    runs.loc[gloo2[0], ["reached_target", "time_to_target_s"]] = [True, 5.0]
    bad = runs.loc[(runs.workers == 2) & (runs.backend == "mpi"), "run_id"].iloc[0]
    status.loc[status.run_id == bad, ["status", "detail"]] = [
        "mislabelled",
        "label says 2 ranks, proof found 1",
    ]
    runs.to_csv(out["runs"], index=False)
    status.to_csv(out["status"], index=False)
    head = RF.write_headline(
        root / "scaling" / "headline.csv",
        [
            RF.headline_row(backend="gloo"),
            RF.censored_row(1, backend="mpi"),
            RF.headline_row(backend="mpi", tuned=True, epochs_ratio=0.9),
        ],
    )
    target = RF.write_target(root / "scaling" / "target.json", RF.target_spec())
    pdf = root / "headline.pdf"
    args = ["report", "--config-file", str(CONFIG_FILE), str(CONFIG_FILE)]
    args += ["--config", str(root / "config" / "full.json")]
    for k in ("runs", "summary", "status", "costmodel"):
        args += [f"--{k}", str(out[k])]
    args += ["--plots-dir", str(out["plots"]), "--headline", str(head)]
    assert main(args + ["--target", str(target), "--out", str(pdf)]) == 0
    return pdf, bad, len(gloo2), args


def _text(pdf, *pages) -> str:
    extra = ["-f", str(pages[0]), "-l", str(pages[-1])] if pages else []
    res = subprocess.run(["pdftotext", *extra, str(pdf), "-"], capture_output=True, text=True)
    return " ".join(res.stdout.split())


@layer_skipif(
    "poppler", "poppler-utils not installed" if shutil.which("pdftotext") is None else None
)
def test_rendered_report_first_page_and_equal_accuracy(rendered):
    pdf, bad, n_gloo2, _ = rendered
    first = _text(pdf, 1, 1)
    untuned = "untuned (baseline: the 1-worker runs of this batch and LR rule), 2 workers"
    assert f"Batch 75 per worker (local, gloo): {untuned} reach the target" in first
    assert f"Batch 75 per worker (local, mpi): {untuned} reach the target in only 1/5" in first
    assert "Tuned: no re-runs of a tuned configuration" in first  # gloo has no tuned row
    assert f"epoch time 1.80x [1.70{D}1.90]" in first
    assert "1 run is mislabelled" in first
    text = _text(pdf)
    config = str(__import__("test_report").CONFIG_FILE)
    assert f"{config} + {config}" not in text
    for needle in (
        f"local_gloo_n1_w2_b75_lrlinear 2 150 1/{n_gloo2} {CENSORED} (no median)",
        ", ".join([fmt.seconds(5.0)] + [CENSORED] * (n_gloo2 - 1)),
        "Epochs ratio",
        "adding workers still pays at equal accuracy up to a global batch of about 1,200",
        f"predicted epochs ratio 0.94 [0.88{D}0.97], measured 0.90",
        "the epochs-to-target factor (statistics) stops it",
        "0.0105 = (1 + 5 %) x 0.01",
        RF.CI_METHOD,
        "Missing, failed and mislabelled runs",
        bad,
        "label says 2 ranks, proof found 1",
    ):
        assert needle in text, needle
    assert "does not buy a faster convergence" not in text
    assert "buys no faster convergence" not in text


@layer_skipif(
    "poppler", "poppler-utils not installed" if shutil.which("pdftotext") is None else None
)
def test_an_accuracy_target_is_named_in_its_units_in_every_sentence(rendered, tmp_path):
    """A target on a validation accuracy (target.json's metric, as the digits workload
    writes it): the first page, the tables' notes, the method and the equal-accuracy
    section name it in its units; none speaks of a target validation loss."""
    from hvdscale.cli import main

    *_, args = rendered
    spec = {
        **RF.target_spec("absolute"),
        "value": 0.95,
        "metric": "val_accuracy",
        "workload": "digits",
    }
    target = RF.write_target(tmp_path / "target.json", spec)
    pdf = tmp_path / "accuracy.pdf"
    assert main(args + ["--target", str(target), "--out", str(pdf)]) == 0
    first, text = _text(pdf, 1, 1), _text(pdf)
    goal = "the target (validation accuracy >= 0.95)"
    assert f"2 workers reach {goal} 1.35x [1.20{D}1.70] faster than 1 worker" in first
    for needle in (
        f"Time to {goal} of every run that ended",  # the time-to-target table
        f"and time to {goal} (median over repeats",  # the results table
        "first epoch whose validation accuracy is at or above the target",  # method, section
        "trains until its validation accuracy reaches the target",  # the budget
        "validation accuracy 0.95 or better",  # the target paragraph
        "the validation split only (the validation accuracy;",
    ):
        assert needle in text, needle
    assert "validation loss" not in first  # (the figures' captions follow the config)


def test_noise_sentence_states_a_batch_limit_only_where_interval_and_ratio_agree():
    """Issue 30 item 9: the limit sentence appears only where the critical batch the
    measured epochs ratio implies lies inside the B_simple interval (no 10 % rule on two
    point estimates); without an interval never."""
    from types import SimpleNamespace

    from hvdscale.report.equal_accuracy import noise_sentence

    limit = "adding workers still pays at equal accuracy up to a global batch of about 1,200."
    no_limit = (
        "the noise-scale estimate does not predict the epochs to target here, and no "
        "global-batch limit is read from it."
    )

    def sentence(**over):
        return noise_sentence(SimpleNamespace(**RF.headline_row(**over)))

    # measured 0.90 at 75/150 implies B_crit (0.9 x 150 - 75) / (1 - 0.9) = 600
    agree = sentence(epochs_ratio=0.90, predicted_epochs_ratio=0.94)  # interval 500-2,500
    # the predicted ratio's interval: the ratios at B_simple's ends, 500 and 2,500
    assert (
        f"B_simple = 1,200 [500{D}2,500]; predicted epochs ratio 0.94 [0.88{D}0.97], "
        "measured 0.90" in agree
    )
    assert "which the same model gives for a critical batch of about 600, inside" in agree
    assert agree.endswith(limit)
    # the same point estimates with a narrower interval that misses 600: no limit, although
    # the predicted ratio 0.94 is within 10 % of the measured 0.90
    narrow = sentence(epochs_ratio=0.90, b_simple_lo=900.0, b_simple_hi=1500.0)
    assert "about 600, outside the interval: " in narrow and narrow.endswith(no_limit)
    assert "still pays" not in narrow
    # an interval with an open end bounds the critical batch on one side only: no limit,
    # whatever it holds
    open_ = sentence(epochs_ratio=1.02, b_simple_lo=700.0, b_simple_hi=math.inf)
    assert f"[700{D}inf)" in open_ and "no epoch cost" in open_ and open_.endswith(no_limit)
    assert "the interval has an open end" in open_ and "still pays" not in open_
    zero = sentence(epochs_ratio=0.90, b_simple_lo=0.0, b_simple_hi=math.inf)
    assert zero.endswith(no_limit) and "still pays" not in zero
    assert sentence(epochs_ratio=1.02).endswith(no_limit)  # 500-2,500 does not hold inf
    # fewer than 3 runs: no interval, so no limit, whatever the point estimates say
    none = sentence(epochs_ratio=0.90, b_simple_lo=math.nan, b_simple_hi=math.nan)
    assert "B_simple = 1,200 (no interval; the note says why)" in none
    assert "predicted epochs ratio 0.94 (point estimate), measured 0.90" in none
    assert "with no interval to compare: " in none and none.endswith(no_limit)
    # the default run's case: B_simple 3 predicts 0.51, the runs needed only 1.23x the epochs
    miss = sentence(
        b_simple=3.0, b_simple_lo=2.0, b_simple_hi=5.0, critical_batch=3.0,
        predicted_epochs_ratio=0.51, epochs_ratio=0.81,
    )  # fmt: skip
    assert f"B_simple = 3 [2{D}5]; predicted epochs ratio 0.51 [0.51{D}0.52], measured 0.81" in miss
    assert "critical batch of about 245, outside" in miss and miss.endswith(no_limit)
    assert "not measured" in sentence(epochs_ratio=math.nan)
    assert sentence(b_simple=math.nan, critical_batch=math.nan) is None


def test_results_table_time_to_target_carries_reached_over_total():
    from hvdscale.report.results import ttt_with_counts

    assert ttt_with_counts(12.34, 4, 5) == f"{fmt.seconds(12.34)} (4/5)"
    assert ttt_with_counts(math.nan, 2, 5) == f"{CENSORED} (2/5)"
    assert ttt_with_counts(math.nan, math.nan, 0) == fmt.MISSING
    # a diverged run is counted in the total and named
    assert ttt_with_counts(12.34, 3, 5, 1) == f"{fmt.seconds(12.34)} (3/5; 1 diverged)"
    assert ttt_with_counts(math.nan, 2, 5, 2) == "not reached (2/5; 2 diverged)"


def test_report_command_names_a_malformed_input(rendered, tmp_path, capsys):
    from hvdscale.cli import main

    pdf, _, _, args = rendered
    head = tmp_path / "headline.csv"
    head.write_text("partition,backend\nlocal,mpi\n")
    target = RF.write_target(tmp_path / "target.json", RF.target_spec())
    out = ["--target", str(target), "--out", str(tmp_path / "r.pdf")]
    assert main(args[:-1] + [str(head)] + out) == 2
    err = capsys.readouterr().err
    assert f"headline table {head}: missing column(s)" in err
    target.write_text("{}")
    assert main(args + ["--target", str(target), "--out", str(tmp_path / "r.pdf")]) == 2
    assert f"target file {target}: missing key(s) mode" in capsys.readouterr().err
    assert not (tmp_path / "r.pdf").exists()


def test_first_page_states_the_coverage_of_intervals_from_few_repeats():
    from hvdscale.analysis.stats import COVERAGE_FEW
    from hvdscale.report.headline_text import coverage_note

    three = pd.DataFrame([RF.headline_row(total=3, reached=3, base_total=3, base_reached=3)])
    note = coverage_note(three)
    assert "rest on 3 repeats per side" in note and COVERAGE_FEW in note
    assert "about 75 % with 3 paired repeats" in note
    assert coverage_note(pd.DataFrame([RF.headline_row()])) == ""  # 5 per side
    # a row without an interval says nothing about coverage
    bare = RF.headline_row(total=2, base_total=2, speedup_ttt_lo=math.nan, speedup_ttt_hi=math.nan)
    assert coverage_note(pd.DataFrame([bare])) == ""


def test_conclusion_without_runs_on_a_side_gives_the_reason():
    from hvdscale.analysis.headline import TUNED_GAP

    nan = math.nan
    row = RF.headline_row(
        tuned=True, speedup_ttt=nan, reached=0, total=0, base_reached=0, base_total=0,
        note=TUNED_GAP["awaiting_reruns"],
    )  # fmt: skip
    text = conclusion(pd.DataFrame([row]).iloc[0])
    assert text.endswith(
        "(local, mpi, tuned): the selected candidate's re-runs are not complete yet."
    )


def test_the_factors_table_numbers_its_notes_and_lists_them_below():
    """A row's note (why it has no interval, ...) is a number in the table's last column
    and its text below the table, once per distinct note: a long note in a narrow cell
    made a row many lines tall."""
    from reportlab.platypus import Paragraph, Table

    from hvdscale.report.doc import Doc
    from hvdscale.report.equal_accuracy import factors_part

    why = "no interval: fewer than 3 repeats (this configuration 1, 1-worker baseline 1)"
    rows = [
        RF.headline_row(backend="gloo", note=why),
        RF.headline_row(backend="mpi"),
        RF.headline_row(backend="mpi", batch_per_worker=1000, note=why),
    ]
    d = Doc()
    factors_part(d, pd.DataFrame(rows))
    story = [g for f in d.story for g in getattr(f, "_content", [f])]  # KeepTogether's too
    (table,) = [f for f in story if isinstance(f, Table)]
    notes = [r[-1] for r in table._cellvalues[1:]]
    assert notes == ["[1]", "", "[1]"]  # gloo b75, mpi b75, mpi b1000
    texts = [f.text for f in story if isinstance(f, Paragraph)]
    assert f"Notes: [1] {why}." in texts
