"""Bootstrap confidence intervals of speedups (analysis/stats.py) on hand-made repeats."""

import math

import numpy as np

from hvdscale.analysis.stats import bootstrap_ratio, rng_for, speedup_interval


def test_identical_repeats_give_a_zero_width_interval():
    lo, hi, note = speedup_interval([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], "x")
    assert (lo, hi, note) == (2.0, 2.0, "")


def test_fewer_than_three_repeats_give_no_interval_and_say_why():
    lo, hi, note = speedup_interval([2.0, 2.1, 1.9], [1.0, 1.1], "x")
    assert math.isnan(lo) and math.isnan(hi)
    assert "fewer than 3" in note and "this configuration 2" in note
    lo, hi, note = speedup_interval([2.0], [1.0, 1.1, 1.2], "x")
    assert math.isnan(lo) and "1-worker baseline 1" in note


def test_interval_is_deterministic_and_resamples_the_baseline():
    base, vals = [2.0, 2.2, 1.8, 2.1, 1.9], [1.0, 1.0, 1.0, 1.0, 1.0]
    a = speedup_interval(base, vals, "g")
    assert a == speedup_interval(base, vals, "g")
    # the configuration has no spread: the whole width comes from the baseline's repeats
    assert a[0] < 2.0 < a[1]
    assert a[0] >= 1.8 and a[1] <= 2.2


def test_interval_covers_the_true_ratio_in_about_95_percent_of_trials():
    rng = np.random.default_rng(7)
    true_ratio, n, trials, hits = 2.0, 25, 1000, 0
    for t in range(trials):
        base = 2.0 * rng.lognormal(0.0, 0.1, n)  # median 2.0
        vals = 1.0 * rng.lognormal(0.0, 0.1, n)  # median 1.0
        lo, hi = bootstrap_ratio(base, vals, n_boot=400, rng=rng_for(str(t)))
        hits += lo <= true_ratio <= hi
    assert 0.90 <= hits / trials <= 0.99
