"""The gradient noise scale estimator (hvdscale.analysis.noise_scale, McCandlish et al. 2018)."""

import math

import numpy as np
import pandas as pd
import pytest

from hvdscale.analysis.noise_scale import (
    NEAR_TARGET_EPOCHS,
    WINDOW_COLUMNS,
    agrees,
    configuration_estimate,
    estimate,
    implied_critical_batch,
    near_target_window,
    predicted_epochs_interval,
    predicted_epochs_ratio,
    window_sums,
)


def _data_parallel_norms(seed, workers=4, b_local=16, steps=1000, dim=40):
    """Per step: mean over ranks of |g_local|^2 and |g_allreduced|^2, where each rank's
    gradient is the mean of b_local per-example gradients ~ N(G, Sigma)."""
    rng = np.random.default_rng(seed)
    g = rng.normal(0.0, 0.1, dim)
    a = rng.normal(0.0, 0.1, (dim, dim))
    sigma = a @ a.T
    chol = np.linalg.cholesky(sigma)
    noise = rng.normal(size=(steps, workers, b_local, dim)) @ chol.T
    local = g + noise.mean(axis=2)  # (steps, workers, dim)
    g_local_sq = (local**2).sum(-1).mean(-1)
    g_global_sq = (local.mean(axis=1) ** 2).sum(-1)
    return g_local_sq, g_global_sq, np.trace(sigma) / (g @ g), np.trace(sigma), g @ g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_b_simple_within_10_percent(seed):
    gl, gg, b_true, trace, g2_true = _data_parallel_norms(seed)
    g2, s, b_simple = estimate(16, 64, gl, gg)
    assert b_simple == pytest.approx(b_true, rel=0.10)
    assert s == pytest.approx(trace, rel=0.10)
    # means first (ratio of means): the same as passing the means
    assert estimate(16, 64, gl.mean(), gg.mean()) == pytest.approx((g2, s, b_simple))


def test_exact_expectations_give_exact_values():
    g2, trace = 0.01, 20.0
    out = estimate(75, 150, g2 + trace / 75, g2 + trace / 150)
    assert out == pytest.approx((g2, trace, 2000.0))


def test_degenerate_inputs_give_nan():
    assert all(math.isnan(x) for x in estimate(64, 64, 1.0, 1.0))
    assert math.isnan(estimate(16, 64, 1.0, 2.0)[2])  # global norm larger: no noise signal


def test_predicted_epochs_ratio():
    # E(B) ~ 1 + B/B_crit: far below B_crit doubling the batch costs no epochs
    assert predicted_epochs_ratio(75, 150, 1e9) == pytest.approx(1.0)
    assert predicted_epochs_ratio(1000, 2000, 1000) == pytest.approx(2 / 3)
    assert math.isnan(predicted_epochs_ratio(75, 150, math.nan))


def test_the_predicted_epochs_ratio_has_the_interval_of_the_critical_batch():
    lo, hi = predicted_epochs_interval(75, 150, 500.0, 2500.0)
    assert (lo, hi) == pytest.approx((115 / 130, 103 / 106))
    assert lo < predicted_epochs_ratio(75, 150, 1200.0) < hi
    # open ends: no critical batch above 0 gives the noise-free limit B_1/B_n, none below inf 1
    assert predicted_epochs_interval(75, 150, -3.0, math.inf) == pytest.approx((0.5, 1.0))
    for no_interval in ((math.nan, 2500.0), (None, None)):
        assert all(math.isnan(v) for v in predicted_epochs_interval(75, 150, *no_interval))


def test_implied_critical_batch_inverts_the_prediction():
    for b_crit in (3.0, 75.0, 632.0, 1e4):
        r = predicted_epochs_ratio(1000, 2000, b_crit)
        assert implied_critical_batch(1000, 2000, r) == pytest.approx(b_crit, rel=1e-9)
    assert implied_critical_batch(75, 150, 1.0) == math.inf  # no epoch cost at all
    assert implied_critical_batch(75, 150, 0.4) == 0.0  # below B_1/B_n: outside the model
    assert math.isnan(implied_critical_batch(75, 75, 0.9))
    assert math.isnan(implied_critical_batch(75, 150, math.nan))


# ---------------------------------------------------------------- issue 30 item 9


def _expected(g2, trace, b, n=math.inf):
    """E|G_B|^2 for a batch of b drawn without replacement from n samples."""
    return g2 + trace * (1.0 / b - 1.0 / n)


def test_finite_shard_correction_changes_the_estimate_by_the_expected_factor():
    """Both batch sizes' noise terms carry (1 - B/N): S is unchanged, |G|^2 gains S/N, so
    1/B_simple(corrected) = 1/B_simple(uncorrected) + 1/N."""
    g2, trace, n = 0.01, 20.0, 6000  # B_simple 2000, a third of the epoch's samples
    gl, gg = _expected(g2, trace, 75, n), _expected(g2, trace, 150, n)
    assert estimate(75, 150, gl, gg, n_samples=n) == pytest.approx((g2, trace, 2000.0))
    _, s_u, b_u = estimate(75, 150, gl, gg)  # the paper's estimator ignores the finite N
    assert s_u == pytest.approx(trace)
    assert b_u == pytest.approx(1 / (1 / 2000 - 1 / n))  # 3000: 50 % too high
    assert estimate(75, 150, gl, gg, n_samples=n)[2] == pytest.approx(b_u * n / (n + b_u))
    # N infinite (or not given) is the paper's estimator; N below the global batch: NaN
    assert estimate(75, 150, gl, gg, n_samples=math.inf) == pytest.approx(
        (*estimate(75, 150, gl, gg),)
    )
    assert math.isnan(estimate(75, 150, gl, gg, n_samples=100)[2])


def test_finite_shard_correction_recovers_sampling_without_replacement():
    """Simulated epochs: a fixed population of N per-example gradients, every epoch a
    fresh permutation cut into global batches of 2 x 75 (one local batch per rank). The
    corrected estimate recovers the population's tr(Sigma)/|G|^2; the uncorrected one
    is biased by the factor 1 / (1 - B_simple/N)."""
    rng = np.random.default_rng(7)
    n, dim, b_local, workers, epochs = 600, 6, 75, 2, 1500
    g = np.full(dim, 1.0)
    x = rng.normal(0.0, 1.0, (n, dim))
    x = x - x.mean(axis=0)  # population mean exactly g after the shift
    x *= math.sqrt(300.0 * (g @ g) / np.trace(np.cov(x.T, ddof=1)))
    x += g
    b_true = np.trace(np.cov(x.T, ddof=1)) / (g @ g)  # 300: half of N
    order = rng.permuted(np.tile(np.arange(n), (epochs, 1)), axis=1)
    batches = x[order].reshape(epochs, n // (workers * b_local), workers, b_local, dim)
    local = batches.mean(axis=3)  # (epochs, steps, workers, dim)
    gl = (local**2).sum(-1).mean(-1).ravel()
    gg = (local.mean(axis=2) ** 2).sum(-1).ravel()
    b_big = workers * b_local
    assert estimate(b_local, b_big, gl, gg, n_samples=n)[2] == pytest.approx(b_true, rel=0.1)
    b_u = estimate(b_local, b_big, gl, gg)[2]
    assert b_u == pytest.approx(b_true / (1 - b_true / n), rel=0.1)  # about 600, not 300


def _epochs_frame(run_id, g2_by_epoch, trace=20.0, warmup=1, steps=10, n=30000, b=75, w=2):
    """epochs.csv rows of one run whose epoch e has the exact expectations of |G|^2 =
    g2_by_epoch[e] (None: no noise-scale sums in that epoch)."""
    rows = []
    for e, g2 in enumerate(g2_by_epoch):
        has = g2 is not None and e >= warmup
        rows.append(
            {
                "run_id": run_id,
                "epoch": e,
                "warmup": e < warmup,
                "samples": n,
                "noise_steps": steps if has else 0,
                "g_local_sq": _expected(g2, trace, b, n) if has else np.nan,
                "g_global_sq": _expected(g2, trace, w * b, n) if has else np.nan,
            }
        )
    return pd.DataFrame(rows)


def _run_row(run_id, target_epoch, status="completed"):
    reached = target_epoch is not None
    return {
        "run_id": run_id,
        "status": status,
        "reached_target": reached,
        "target_epoch": float(target_epoch) if reached else np.nan,
    }


def test_near_target_window_is_the_last_three_non_warmup_epochs_up_to_the_target():
    assert NEAR_TARGET_EPOCHS == 3
    eps, warm = list(range(10)), [e < 1 for e in range(10)]
    assert near_target_window(eps, warm, 6) == [4, 5, 6]
    assert near_target_window(eps, warm, 6.0) == [4, 5, 6]  # runs.csv holds floats
    assert near_target_window(eps, warm, math.nan) == [7, 8, 9]  # never reached: the last 3
    assert near_target_window(eps, warm, None) == [7, 8, 9]
    assert near_target_window(eps, warm, 2) == [1, 2]  # warm-up epochs never count
    assert near_target_window(eps, warm, 0) == []  # met in the warm-up epoch: nothing
    assert near_target_window(list(reversed(eps)), list(reversed(warm)), 6) == [4, 5, 6]


def test_window_sums_take_the_documented_epochs_from_epochs_csv():
    """The noise scale falls during training (|G|^2 shrinks); the estimate near the
    target recovers the value of the epochs before the target, not the whole-run mean."""
    g2 = [0.2, 0.2, 0.2, 0.1, 0.01, 0.01, 0.01, 0.005, 0.005]  # B_simple 100 -> 2000 -> 4000
    epochs = pd.concat(
        [
            _epochs_frame("reach", g2),  # target met in epoch 6: window 4, 5, 6
            _epochs_frame("never", g2[:7]),  # censored after 7 epochs: window 4, 5, 6
            _epochs_frame("diverged", g2),  # not completed: no sums
            _epochs_frame("warm", g2),  # met in the warm-up epoch: no window
        ]
    )
    runs = pd.DataFrame(
        [
            _run_row("reach", 6),
            _run_row("never", None),
            _run_row("diverged", 6, status="nan_loss"),
            _run_row("warm", 0),
        ]
    )
    sums = window_sums(runs, epochs).set_index("run_id")
    assert list(sums.index) == ["never", "reach"]
    assert list(sums.columns) == WINDOW_COLUMNS
    for rid in ("reach", "never"):
        r = sums.loc[rid]
        assert r.nsw_steps == 30 and r.nsw_samples == 30000
        b = estimate(75, 150, r.nsw_g_local / r.nsw_steps, r.nsw_g_global / r.nsw_steps, 30000)
        assert b[2] == pytest.approx(2000.0)
    # epochs.csv without the noise columns (written before them): no sums
    old = epochs.drop(columns=["noise_steps", "g_local_sq", "g_global_sq"])
    assert window_sums(runs, old).empty


def _repeat_sums(seed, steps=400, g2=0.01, trace=20.0, b=75, w=2, n=30000):
    """One run's window sums from per-step norms drawn around their expectations
    (per-step relative noise as a local gradient of 75 samples has)."""
    rng = np.random.default_rng(seed)
    gl = _expected(g2, trace, b, n) * rng.gamma(20.0, 1 / 20.0, steps)
    gg = _expected(g2, trace, w * b, n) * rng.gamma(40.0, 1 / 40.0, steps)
    return {"nsw_steps": steps, "nsw_g_local": gl.sum(), "nsw_g_global": gg.sum(), "nsw_samples": n}


def test_interval_over_repeats_covers_the_true_value_and_needs_three_runs():
    true = 2000.0
    for first in (0, 10, 20):
        sums = pd.DataFrame([_repeat_sums(first + r) for r in range(5)])
        b, lo, hi, note = configuration_estimate(75, 150, sums, f"test/{first}")
        assert lo < b < hi and lo <= true <= hi, (b, lo, hi)
        assert hi / lo < 3  # an interval, not everything
        assert note == ""
    b, lo, hi, note = configuration_estimate(75, 150, sums.iloc[:3], "test/3")
    assert lo <= b <= hi and "fewer than 5 runs: coverage below 95 %" in note
    b, lo, hi, note = configuration_estimate(75, 150, sums.iloc[:2], "test/2")
    assert math.isfinite(b) and math.isnan(lo) and math.isnan(hi)
    assert note == "noise scale: no interval, fewer than 3 runs with noise-scale sums (2)"
    b, lo, hi, note = configuration_estimate(75, 150, sums.iloc[:0], "test/0")
    assert math.isnan(b) and math.isnan(lo) and note == "no noise-scale sums near the target"


def test_interval_has_an_open_end_where_a_resample_does_not_resolve_the_signal():
    """|G|^2 near zero: some resamples give it non-positive, B_simple +inf there, and the
    interval's upper end is open (inf), never NaN."""
    sums = pd.DataFrame([_repeat_sums(r, steps=20, g2=1e-5) for r in range(5)])
    _, lo, hi, _ = configuration_estimate(75, 150, sums, "test/open")
    assert lo > 0 and hi == math.inf


def test_agrees_reads_the_implied_critical_batch_against_the_interval():
    assert agrees(500.0, 2500.0, implied_critical_batch(75, 150, 0.90))  # 600
    assert not agrees(900.0, 1500.0, implied_critical_batch(75, 150, 0.90))
    # an interval with an open end bounds the critical batch on one side only: no limit
    assert not agrees(700.0, math.inf, implied_critical_batch(75, 150, 1.02))
    assert not agrees(0.0, math.inf, 600.0)
    assert not agrees(700.0, math.inf, 900.0)
    assert not agrees(700.0, 5000.0, math.inf)
    assert not agrees(0.0, 10.0, implied_critical_batch(75, 150, 0.4))  # 0, open lower end
    assert not agrees(0.0, 2500.0, 600.0)
    assert not agrees(math.nan, math.nan, 600.0)  # no interval: never
    assert not agrees(500.0, 2500.0, math.nan)  # no measured ratio
