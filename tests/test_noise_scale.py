"""The gradient noise scale estimator (hvdscale.analysis.noise_scale, McCandlish et al. 2018)."""

import math

import numpy as np
import pytest

from hvdscale.analysis.noise_scale import estimate, implied_critical_batch, predicted_epochs_ratio


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


def test_implied_critical_batch_inverts_the_prediction():
    for b_crit in (3.0, 75.0, 632.0, 1e4):
        r = predicted_epochs_ratio(1000, 2000, b_crit)
        assert implied_critical_batch(1000, 2000, r) == pytest.approx(b_crit, rel=1e-9)
    assert implied_critical_batch(75, 150, 1.0) == math.inf  # no epoch cost at all
    assert implied_critical_batch(75, 150, 0.4) == 0.0  # below B_1/B_n: outside the model
    assert math.isnan(implied_critical_batch(75, 75, 0.9))
    assert math.isnan(implied_critical_batch(75, 150, math.nan))
