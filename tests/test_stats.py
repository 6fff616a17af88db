"""The one bootstrap (analysis/stats.py, scipy.stats.bootstrap) and censored medians."""

import math

import numpy as np

from hvdscale.analysis.stats import (
    CI_METHOD,
    bootstrap_ci,
    bootstrap_ratio,
    censor_note,
    censored_median,
    median_interval,
    rng_for,
    speedup_interval,
)


def test_identical_repeats_give_a_zero_width_interval():
    lo, hi, note = speedup_interval([2.0, 2.0, 2.0, 2.0, 2.0], [1.0] * 5, "x")
    assert (lo, hi, note) == (2.0, 2.0, "")


def test_fewer_than_three_repeats_give_no_interval_and_say_why():
    lo, hi, note = speedup_interval([2.0, 2.1, 1.9], [1.0, 1.1], "x")
    assert math.isnan(lo) and math.isnan(hi)
    assert "fewer than 3" in note and "this configuration 2" in note
    lo, hi, note = speedup_interval([2.0], [1.0, 1.1, 1.2], "x")
    assert math.isnan(lo) and "1-worker baseline 1" in note


def test_three_or_four_repeats_give_an_interval_with_a_coverage_note():
    lo, hi, note = speedup_interval([2.0, 2.1, 1.9], [1.0, 1.1, 0.9], "x")
    assert lo < 2.0 < hi and "coverage below 95 %" in note


def test_interval_is_deterministic_and_resamples_the_baseline():
    base, vals = [2.0, 2.2, 1.8, 2.1, 1.9], [1.0, 1.0, 1.0, 1.0, 1.0]
    a = speedup_interval(base, vals, "g")
    assert a == speedup_interval(base, vals, "g")
    # the configuration has no spread: the whole width comes from the baseline's repeats
    assert a[0] < 2.0 < a[1]
    assert a[0] >= 1.8 and a[1] <= 2.2
    assert "scipy.stats.bootstrap" in CI_METHOD


def _lognormal_pairs(trials, n, seed):
    """Times with a known speedup of 2 (ratio of the medians); repeat i of both sides
    shares a seed effect (the paired design) plus its own timing noise."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0.0, 0.2, (trials, n))
    base = 2.0 * np.exp(shared + rng.normal(0.0, 0.2, (trials, n)))
    vals = np.exp(shared + rng.normal(0.0, 0.2, (trials, n)))
    return base, vals


def test_paired_interval_covers_the_true_ratio_in_93_to_97_percent_at_n5():
    base, vals = _lognormal_pairs(1000, 5, seed=7)
    lo, hi = bootstrap_ratio(base, vals, paired=True, n_resamples=2000, rng=rng_for("cov"))
    coverage = np.mean((lo <= 2.0) & (2.0 <= hi))
    assert 0.93 <= coverage <= 0.97


def test_independent_interval_covers_at_least_93_percent_at_n5():
    rng = np.random.default_rng(11)
    base = 2.0 * rng.lognormal(0.0, 0.3, (1000, 5))
    vals = rng.lognormal(0.0, 0.3, (1000, 5))
    lo, hi = bootstrap_ratio(base, vals, paired=False, n_resamples=2000, rng=rng_for("ind"))
    coverage = np.mean((lo <= 2.0) & (2.0 <= hi))
    assert 0.93 <= coverage <= 0.99


def test_repeats_pair_up_by_repeat_index():
    base, vals = [2.0, 4.0, 2.2, 4.4, 2.1], [1.0, 2.0, 1.1, 2.2, 1.05]  # speedup 2 per pair
    lo, hi, _ = speedup_interval(base, vals, "p", base_repeats=range(5), repeats=range(5))
    assert math.isclose(lo, 2.0) and math.isclose(hi, 2.0)
    lo2, hi2, _ = speedup_interval(base, vals, "p")  # unpaired: the pairing is lost
    assert lo2 < 2.0 < hi2
    lo3, hi3, _ = speedup_interval(base, vals, "p", base_repeats=range(5), repeats=[0, 1, 2, 3, 9])
    assert (lo3, hi3) == (lo2, hi2)  # other repeat indices: independent


def test_censored_median_counts_censored_runs_as_infinite():
    med, reached, total = censored_median([10.0, 12.0, 11.0, math.inf, math.inf])
    assert med == 12.0 and (reached, total) == (3, 5)
    assert censor_note(reached, total) == ""
    med, reached, total = censored_median([10.0, 12.0, math.inf, math.inf, math.inf])
    assert math.isnan(med) and (reached, total) == (2, 5)
    assert censor_note(reached, total) == "3/5 censored: no median"
    med, _, total = censored_median([10.0, math.nan, None, 11.0, 12.0])  # missing: dropped
    assert med == 11.0 and total == 3


def test_bootstrap_handles_censored_repeats():
    base = [10.0, 11.0, 12.0, math.inf, 10.5]
    vals = [5.0, 5.5, 6.0, 5.2, math.inf]
    lo, hi, note = speedup_interval(base, vals, "c")
    # a replicate can draw 3 censored repeats: its median is +inf, its speedup 0 or inf
    assert 0.0 <= lo < 2.0 < hi and note == ""
    lo, hi, note = speedup_interval(base, [5.0, math.inf, math.inf, 6.0, math.inf], "c")
    assert math.isnan(lo) and "3/5 censored" in note


def test_median_interval_and_generic_ci():
    m, lo, hi = median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert m == 3.0 and 1.0 <= lo < 3.0 < hi <= 5.0
    assert median_interval([1.0, 2.0])[1:] == (None, None)
    ci = bootstrap_ci([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]], lambda g: np.median(g[1], axis=-1))
    assert 2.0 <= ci[0] <= 4.0 <= ci[1] <= 6.0
    assert bootstrap_ci([[1.0, 2.0]], lambda g: np.median(g[0], axis=-1)) is None


def test_the_censored_median_is_the_kaplan_meier_median():
    """The proof the module doc promises: with every censored run censored after the last
    observed time (one budget for all runs of a study), counting censored runs as +inf
    gives the Kaplan-Meier median of scipy.stats.ecdf on CensoredData (odd repeat counts;
    with an even count ours is the usual midpoint of the two middle values, KM's the
    lower of them)."""
    from scipy.stats import CensoredData, ecdf

    def km_median(times, budget):
        seen = [t for t in times if math.isfinite(t)]
        cens = [budget] * (len(times) - len(seen))
        sf = ecdf(CensoredData(uncensored=seen, right=cens)).sf
        q = sf.quantiles[sf.evaluate(sf.quantiles) <= 0.5]
        return float(q[0]) if q.size else math.inf

    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.choice([3, 5, 7, 9]))
        t = rng.lognormal(1.0, 0.4, size=n)
        k = int(rng.integers(0, (n - 1) // 2 + 1))  # fewer than half censored
        times = [*t[: n - k], *([math.inf] * k)]
        budget = float(t.max()) * 1.5  # after every observed time
        assert censored_median(times)[0] == km_median(times, budget), (trial, times)
    even = [1.0, 2.0, 3.0, math.inf]
    assert km_median(even, 10.0) == 2.0 <= censored_median(even)[0] == 2.5 <= 3.0


def test_an_interval_end_is_open_where_a_resampled_median_is_censored():
    """One censored repeat of five in the baseline: some replicates draw three of it, their
    baseline median is +inf and so is the ratio; the upper end is then +inf (open), never
    a number, and the lower end is finite."""
    base = [10.0, 11.0, 12.0, math.inf, 10.5]
    vals = [5.0, 5.5, 6.0, 5.2, 5.4]
    lo, hi, note = speedup_interval(base, vals, "open")
    assert 1.0 < lo < 2.5 and math.isinf(hi) and note == ""
    # this side censored instead: the lower end is 0 (open), the upper finite
    lo, hi, _ = speedup_interval(vals, base, "open")
    assert lo == 0.0 and 0.4 < hi < 1.0


def test_replicates_censored_on_both_sides_widen_the_interval_never_narrow_it():
    """Both sides with two censored repeats of five: replicates where both medians are
    +inf bound nothing, so they count as 0 for the lower end and +inf for the upper."""
    base = [10.0, 11.0, math.inf, math.inf, 10.5]
    vals = [5.0, math.inf, 6.0, 5.2, math.inf]
    lo, hi = bootstrap_ratio(base, vals, rng=rng_for("both"))
    assert lo == 0.0 and math.isinf(hi)
    # no replicate censored on both sides: the two passes agree with one
    lo2, hi2 = bootstrap_ratio([10.0, 11, 12, 13, 14], [5.0, 6, 7, 8, 9], rng=rng_for("x"))
    assert 1.2 < lo2 < hi2 < 2.8


def test_a_huge_log_ratio_does_not_overflow():
    from hvdscale.analysis.stats import _from_log

    assert _from_log(800.0) > 1e300 and math.isinf(_from_log(1e6))
    assert _from_log(-1e6) == 0.0
