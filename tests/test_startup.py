"""Honest clocks (issue 30, item 7): the start-up of every run beside its time to target.

Synthetic records with known start-up (tests/fixtures_runs.py ``startup_s``):
runs.csv's ``startup_s`` and ``launch_to_target_s``, headline.csv's launch-to-target
speedup with its interval (computed like speedup_ttt), older tables and records without
them, and the report's sentences. The record field itself: tests/test_runrecord.py; the
variable in every launcher's environment: tests/test_launch.py; a real launch:
tests/test_train.py."""

from __future__ import annotations

import math
from statistics import median
from types import SimpleNamespace

import fixtures_runs as F
import pytest

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.columns import HEADLINE_COLUMNS, RUNS_COLUMNS
from hvdscale.analysis.headline import headline, launch_speedup
from hvdscale.analysis.stats import censored_median
from hvdscale.analysis.tables import read_headline, read_runs, write_csv
from hvdscale.report import fmt

TARGET = 0.105
ONE = [0.5, 0.3, 0.2, 0.15, 0.10, 0.09]  # reaches 0.105 in epoch 4
TWO = [0.5, 0.3, 0.2, 0.15, 0.12, 0.10]  # in epoch 5
MISS = [0.5, 0.4, 0.3, 0.25, 0.2, 0.2]  # never


def _study(tmp_path, *, censored=(), no_stamp=()):
    """Five paired repeats of 1 and 2 workers: 1 worker 1.0 s epochs (x 1 + 0.02 r),
    start-up 5.0 + 0.1 r s; 2 workers 0.6 s epochs, start-up 6.0 + 0.1 r s (a slower
    start: more to initialise). ``censored``: 2-worker repeats that never reach the
    target; ``no_stamp``: 1-worker repeats with records of the older shape."""
    for r in range(5):
        f = 1.0 + 0.02 * r
        one = F.record_from_epochs(
            f"local_gloo_n1_w1_b75_lrnone_r{r}",
            [f] * 6,
            test_loss=ONE,
            target_test_loss=TARGET,
            startup_s=None if r in no_stamp else 5.0 + 0.1 * r,
        )
        two = F.record_from_epochs(
            f"local_gloo_n1_w2_b75_lrnone_r{r}",
            [0.6 * f] * 6,
            test_loss=MISS if r in censored else TWO,
            target_test_loss=TARGET,
            startup_s=6.0 + 0.1 * r,
        )
        F.write_record(tmp_path, one)
        F.write_record(tmp_path, two)
    return aggregate(tmp_path)


def _by(runs, workers):
    return runs[runs["workers"] == workers].sort_values("repeat").reset_index(drop=True)


def test_runs_csv_carries_startup_and_launch_to_target(tmp_path):
    agg = _study(tmp_path, censored={4}, no_stamp={3})
    i = RUNS_COLUMNS.index("startup_s")  # the step settings (issue 32) follow them
    assert RUNS_COLUMNS[i : i + 2] == ["startup_s", "launch_to_target_s"]
    one, two = _by(agg.runs, 1), _by(agg.runs, 2)
    for r in (0, 1, 2, 4):
        f = 1.0 + 0.02 * r
        assert one.at[r, "startup_s"] == pytest.approx(5.0 + 0.1 * r)
        assert one.at[r, "time_to_target_s"] == pytest.approx(5 * f)  # training only
        assert one.at[r, "launch_to_target_s"] == pytest.approx(5.0 + 0.1 * r + 5 * f)
    # a record of the older shape: no figure (NaN), not 0
    assert math.isnan(one.at[3, "startup_s"]) and math.isnan(one.at[3, "launch_to_target_s"])
    # censored: +inf like its time to target, the start-up is still known
    assert two.at[4, "time_to_target_s"] == math.inf == two.at[4, "launch_to_target_s"]
    assert two.at[4, "startup_s"] == pytest.approx(6.4)
    # written and read back
    write_csv(agg.runs, tmp_path / "runs.csv")
    back = read_runs(tmp_path / "runs.csv")
    assert back.loc[back["run_id"] == two.at[4, "run_id"], "launch_to_target_s"].item() == math.inf


def test_an_older_runs_csv_reads_with_nan_startup(tmp_path):
    agg = _study(tmp_path)
    old = agg.runs.drop(columns=["startup_s", "launch_to_target_s"])
    write_csv(old, tmp_path / "runs.csv")
    back = read_runs(tmp_path / "runs.csv")
    assert back["startup_s"].isna().all() and back["launch_to_target_s"].isna().all()


def test_headline_launch_to_target_speedup_has_a_known_answer(tmp_path):
    agg = _study(tmp_path)
    h = headline(agg.runs)
    assert list(h.columns) == HEADLINE_COLUMNS
    r = h[~h["tuned"]].iloc[0]
    rs = range(5)
    base = [5.0 + 0.1 * i + 5 * (1 + 0.02 * i) for i in rs]
    n = [6.0 + 0.1 * i + 6 * 0.6 * (1 + 0.02 * i) for i in rs]
    assert r.speedup_launch_ttt == pytest.approx(median(base) / median(n))  # 10.4 / 9.944
    # start-up shrinks the training-only speedup toward 1 (both sides pay about 5-6 s)
    assert r.speedup_ttt == pytest.approx(5.2 / (3.6 * 1.04))
    assert 1 < r.speedup_launch_ttt < r.speedup_ttt
    assert r.speedup_launch_ttt_lo <= r.speedup_launch_ttt <= r.speedup_launch_ttt_hi
    assert math.isfinite(r.speedup_launch_ttt_lo) and math.isfinite(r.speedup_launch_ttt_hi)
    # the same pairing and method as speedup_ttt: the interval is reproducible
    h2 = headline(agg.runs)
    again = h2[~h2["tuned"]].iloc[0]
    assert (again.speedup_launch_ttt_lo, again.speedup_launch_ttt_hi) == (
        r.speedup_launch_ttt_lo,
        r.speedup_launch_ttt_hi,
    )


def test_headline_launch_speedup_counts_censored_runs_and_needs_every_stamp(tmp_path):
    agg = _study(tmp_path / "a", censored={4})
    r = headline(agg.runs).iloc[0]
    one, two = _by(agg.runs, 1), _by(agg.runs, 2)
    expected = (
        censored_median(one["launch_to_target_s"].tolist())[0]
        / censored_median(two["launch_to_target_s"].tolist())[0]
    )
    assert r.speedup_launch_ttt == pytest.approx(expected)
    assert not math.isnan(r.speedup_launch_ttt_lo)  # an interval, possibly with an open end
    # one 1-worker record without a start-up figure: no launch-to-target speedup at all (a
    # part of the runs would be another sample); the training-only one stays
    agg = _study(tmp_path / "b", no_stamp={3})
    r = headline(agg.runs).iloc[0]
    assert math.isnan(r.speedup_launch_ttt) and math.isnan(r.speedup_launch_ttt_lo)
    assert math.isfinite(r.speedup_ttt)
    one, two = _by(agg.runs, 1), _by(agg.runs, 2)
    out = launch_speedup(one, two, "x", dict(base_repeats=[0] * 5, repeats=[0] * 5))
    assert all(math.isnan(v) for v in out.values())


def test_an_older_headline_csv_reads_with_nan_launch_speedup(tmp_path):
    agg = _study(tmp_path)
    h = headline(agg.runs)
    cols = ["speedup_launch_ttt", "speedup_launch_ttt_lo", "speedup_launch_ttt_hi"]
    write_csv(h.drop(columns=cols), tmp_path / "headline.csv")
    back = read_headline(tmp_path / "headline.csv")
    assert set(HEADLINE_COLUMNS) <= set(back.columns)
    assert back[cols].isna().all().all()
    write_csv(h, tmp_path / "headline.csv")
    assert read_headline(tmp_path / "headline.csv").at[0, cols[0]] == pytest.approx(
        h.at[0, cols[0]]
    )


# ----------------------------------------------------------------------------- report


ROW = {
    "partition": "local",
    "framework": "horovod-tf",
    "backend": "gloo",
    "batch_per_worker": 75,
    "workers": 2,
    "tuned": False,
    "speedup_ttt": 1.40,
    "speedup_ttt_lo": 1.20,
    "speedup_ttt_hi": 1.70,
    "reached": 5,
    "total": 5,
    "base_reached": 5,
    "base_total": 5,
    "epoch_speedup": 1.8,
    "epoch_lo": 1.7,
    "epoch_hi": 1.9,
    "epochs_ratio": 0.8,
    "fixed_factor": 0.97,
    "retained_fraction": 0.78,
    "note": "",
}


@pytest.mark.parametrize(
    "s, lo, hi, text",
    [
        (1.10, 1.04, 1.18, "; with start-up: 1.10x [1.04\u20131.18], faster"),
        (0.80, 0.70, 0.92, "; with start-up: 0.80x [0.70\u20130.92], slower"),
        (1.05, 0.91, 1.20, "; with start-up: 1.05x [0.91\u20131.20], the interval holds 1"),
        (1.05, 0.90, math.inf, "; with start-up: 1.05x [0.90, inf), the interval holds 1"),
        (1.05, math.nan, math.nan, "; with start-up: 1.05x, no interval"),
        (math.nan, math.nan, math.nan, ""),  # older records: no figure, no clause
    ],
)
def test_launch_clause_says_a_direction_only_where_the_interval_does(s, lo, hi, text):
    from hvdscale.report.headline_text import launch_clause

    row = {"speedup_launch_ttt": s, "speedup_launch_ttt_lo": lo, "speedup_launch_ttt_hi": hi}
    assert launch_clause(row) == text
    assert launch_clause({}) == ""  # a headline.csv row of before issue 30 item 7


def test_the_first_page_sentence_carries_the_launch_to_target_speedup(tmp_path):
    from hvdscale.report.headline_text import batch_sentence, headline_section

    row = {
        **ROW,
        "speedup_launch_ttt": 1.05,
        "speedup_launch_ttt_lo": 0.91,
        "speedup_launch_ttt_hi": 1.20,
    }
    text = batch_sentence(row, None)
    assert "faster than 1 worker" in text  # training only: [1.20-1.70]
    assert "; with start-up: 1.05x [0.91\u20131.20], the interval holds 1" in text
    assert "with start-up: 1.05x [0.91\u20131.20], faster" not in text
    assert "with start-up" not in batch_sentence(ROW, None)  # no figure: not invented

    # the first page: one clause per row, from the real headline table, and what the time
    # to target counts, with the measured start-up
    agg = _study(tmp_path)
    h = headline(agg.runs)
    lines: list[str] = []
    doc = SimpleNamespace(p=lambda t, *a: lines.append(t), bullets=lambda b: lines.extend(b))
    headline_section(doc, SimpleNamespace(headline=h, runs=agg.runs))
    page = " ".join(lines)
    r = h.iloc[0]
    assert f"with start-up: {fmt.speedup(r.speedup_launch_ttt)}x " in page
    assert "Time to target is training time" in page and "not in it" in page
    assert "queue wait and the SLURM allocation are not included" in page
    startups = agg.runs["startup_s"].median()
    assert f"Median start-up {fmt.seconds(startups)} s per run" in page


def test_the_method_text_says_what_the_time_counts():
    from hvdscale.report.accuracy_section import TTT_NOTE
    from hvdscale.report.method_section import equal_accuracy_bullets

    assert "the start-up" in TTT_NOTE and "is not" in TTT_NOTE
    assert "launch-to-target" in TTT_NOTE and "queue wait" in TTT_NOTE
    text = " ".join(equal_accuracy_bullets(None, None, "percentile bootstrap", None))
    assert "time to target is training time, start-up excluded" in text
    assert "The launch-to-target time includes it" in text
    assert "queue wait and the SLURM allocation are not included" in text
