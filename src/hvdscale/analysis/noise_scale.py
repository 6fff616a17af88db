"""The gradient noise scale of McCandlish et al. 2018 ("An Empirical Model of
Large-Batch Training", Appendix A), from what data parallelism gives for free.

With per-example gradients of mean G and covariance Sigma, the squared norm of a
mini-batch gradient of batch B has expectation E|G_B|^2 = |G|^2 + tr(Sigma)/B. Two batch
sizes (a worker's local batch and the allreduced global batch of the same step) give
unbiased estimates of both terms:

    |G|^2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    S     = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)        (S estimates tr(Sigma))

and the simple noise scale B_simple = S / |G|^2, the critical batch size: up to about
B_simple a larger batch needs proportionally fewer steps, beyond it barely fewer. Both
estimates are noisy per step, so ``estimate`` takes their means over many steps first
(the ratio of means, as the paper advises, not the mean of ratios).

The epochs-to-target model the report compares with: steps S(B) = S_min (1 + B_crit/B)
and so epochs E(B) proportional to 1 + B/B_crit; the predicted ratio of epochs to target
of 1 worker (global batch B_1) to n workers (B_n) is (1 + B_1/B_crit) / (1 + B_n/B_crit).

Pure numpy (no TensorFlow): the train env computes the squared norms, the workflow env
the estimate.
"""

from __future__ import annotations

import math

import numpy as np


def estimate(b_small, b_big, g_small_sq, g_big_sq) -> tuple[float, float, float]:
    """(|G|^2, S, B_simple) from squared gradient norms at two batch sizes.

    ``g_small_sq``/``g_big_sq`` are numbers or sequences (one value per step: their
    means are used). NaN where the batches are equal or |G|^2 is not positive (too few
    steps for the noise to average out)."""
    b_small, b_big = float(b_small), float(b_big)
    gs = float(np.mean(np.asarray(g_small_sq, dtype=float)))
    gb = float(np.mean(np.asarray(g_big_sq, dtype=float)))
    if not (b_big > b_small > 0) or not (math.isfinite(gs) and math.isfinite(gb)):
        return math.nan, math.nan, math.nan
    g2 = (b_big * gb - b_small * gs) / (b_big - b_small)
    s = (gs - gb) / (1.0 / b_small - 1.0 / b_big)
    b_simple = s / g2 if g2 > 0 and s > 0 else math.nan
    return float(g2), float(s), float(b_simple)


def predicted_epochs_ratio(b_1: float, b_n: float, b_crit: float) -> float:
    """E(B_1)/E(B_n) with E(B) proportional to 1 + B/B_crit (NaN without a B_crit)."""
    if not (b_crit and math.isfinite(b_crit) and b_crit > 0):
        return math.nan
    return (1.0 + b_1 / b_crit) / (1.0 + b_n / b_crit)


def implied_critical_batch(b_1: float, b_n: float, ratio: float) -> float:
    """The B_crit for which the model gives the measured epochs ratio E(B_1)/E(B_n)
    (predicted_epochs_ratio solved for B_crit): (ratio B_n - B_1) / (1 - ratio).
    inf when ratio >= 1 (no epoch cost at B_n: the critical batch is beyond it); 0 when
    ratio <= B_1/B_n (more epochs than even a noise-free gradient needs, outside the
    model); NaN without a ratio or with B_n <= B_1."""
    if not (math.isfinite(ratio) and ratio > 0 and b_n > b_1 > 0):
        return math.nan
    if ratio >= 1:
        return math.inf
    return max(0.0, (ratio * b_n - b_1) / (1.0 - ratio))
