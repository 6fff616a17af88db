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

Finite shards (sampling without replacement, ``n_samples``). An epoch draws its batches
without replacement from the N samples it trains on (N = samples per epoch, all ranks:
epochs.csv ``samples``, the record's ``config.samples_per_epoch``). The mean of B
gradients drawn without replacement from N has covariance Sigma/B x (1 - B/N) (finite
population correction, Sigma with the N - 1 denominator), so E|G_B|^2 = |G|^2 +
tr(Sigma) (1/B - 1/N). ``estimate`` applies the factor (1 - B/N) to both batch sizes:
the local batch (drawn from the rank's shard of N/n samples, a random split of the
train split: in expectation over the split the shards' differing means add tr(Sigma)
(n-1)/N, which gives the same 1/B_small - 1/N) and the global batch. The 1/N terms cancel
in S, and |G|^2 gains S/N: 1/B_simple(corrected) = 1/B_simple(uncorrected) + 1/N. It
matters where B_simple is not small against N (a noise scale near the train split).

Near the target (``near_target_window``). The noise scale changes during training
(|G|^2 shrinks as the loss falls), and the epochs to target depend on the critical batch
near the target, not on its mean over training. A run's estimate uses the last
``NEAR_TARGET_EPOCHS`` = 3 non-warm-up epochs up to and including its target epoch (the
first epoch whose validation loss reached the target: runs.csv ``target_epoch``); a run
that never reached the target its last 3 non-warm-up epochs. Warm-up epochs never count;
an epoch without noise-scale sums in the window contributes nothing. Only completed runs
count (a diverged run's last epochs are not near any target).
``window_sums`` gives every run's sums over its window from epochs.csv
(``noise_steps``, ``g_local_sq``, ``g_global_sq``: means per instrumented update).

A configuration's estimate (``configuration_estimate``) pools its runs' window sums
(step-weighted means of the squared norms: a ratio of means) and estimates once. Its
95 % interval resamples the runs (a run's sums stay together) and recomputes B_simple
from the resampled sums, a percentile bootstrap with the project's one bootstrap
(analysis/stats.py ``paired_interval``); a resample whose |G|^2 is not positive has
B_simple +inf (an open upper end), one whose S is not positive 0. Fewer than
``stats.MIN_REPEATS`` runs with sums: no interval, and a note says so.

The epochs-to-target model the report compares with: steps S(B) = S_min (1 + B_crit/B)
and so epochs E(B) proportional to 1 + B/B_crit; the predicted ratio of epochs to target
of 1 worker (global batch B_1) to n workers (B_n) is (1 + B_1/B_crit) / (1 + B_n/B_crit).
A global-batch limit is read from the estimate only where the critical batch the measured
epochs ratio implies (``implied_critical_batch``) lies inside the B_simple interval
(``agrees``); elsewhere the estimate does not predict the epochs to target.

numpy and pandas (no TensorFlow): the train env computes the squared norms, the workflow
env the estimate.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: how many non-warm-up epochs up to the target epoch a run's estimate uses (module doc)
NEAR_TARGET_EPOCHS = 3
#: the per-run window sums ``window_sums`` adds to runs.csv rows (headline input only)
WINDOW_COLUMNS = ["nsw_steps", "nsw_g_local", "nsw_g_global", "nsw_samples"]


def _inverse_batches(b_small: float, b_big: float, n_samples) -> tuple[float, float] | None:
    """(1/B_small - 1/N, 1/B_big - 1/N): the variance factors of both batch sizes with the
    finite population correction (1/N = 0 without ``n_samples``); None where invalid."""
    if not (b_big > b_small > 0):
        return None
    n, inv_n = _number(n_samples), 0.0
    if not math.isnan(n):
        if not (n >= b_big):  # a batch larger than the epoch's samples: not this model
            return None
        inv_n = 0.0 if math.isinf(n) else 1.0 / n
    return 1.0 / b_small - inv_n, 1.0 / b_big - inv_n


def estimate(b_small, b_big, g_small_sq, g_big_sq, n_samples=None) -> tuple[float, float, float]:
    """(|G|^2, S, B_simple) from squared gradient norms at two batch sizes.

    ``g_small_sq``/``g_big_sq`` are numbers or sequences (one value per step: their
    means are used). ``n_samples``: the samples an epoch draws its batches from without
    replacement (None: with replacement, the paper's estimator); both batch sizes'
    noise terms get the factor (1 - B/N) (module doc). NaN where the batches are equal,
    N is below the global batch, or |G|^2 or S is not positive (too few steps for the
    noise to average out)."""
    b_small, b_big = float(b_small), float(b_big)
    gs = float(np.mean(np.asarray(g_small_sq, dtype=float)))
    gb = float(np.mean(np.asarray(g_big_sq, dtype=float)))
    c = _inverse_batches(b_small, b_big, n_samples)
    if c is None or not (math.isfinite(gs) and math.isfinite(gb)):
        return math.nan, math.nan, math.nan
    s = (gs - gb) / (c[0] - c[1])
    g2 = gs - s * c[0]
    b_simple = s / g2 if g2 > 0 and s > 0 else math.nan
    return float(g2), float(s), float(b_simple)


def b_simple_values(b_small, b_big, g_small_sq, g_big_sq, n_samples=None) -> np.ndarray:
    """B_simple of arrays of (already averaged) squared norms, elementwise, as
    ``estimate`` computes it, but +inf where |G|^2 is not positive (the signal is not
    resolved: no finite critical batch bounds it) and 0 where S is not positive (no
    noise); for the bootstrap replicates. NaN where the batch sizes are invalid."""
    gs = np.asarray(g_small_sq, dtype=float)
    gb = np.asarray(g_big_sq, dtype=float)
    c = _inverse_batches(float(b_small), float(b_big), n_samples)
    if c is None:
        return np.full(np.broadcast(gs, gb).shape, np.nan)
    s = (gs - gb) / (c[0] - c[1])
    g2 = gs - s * c[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(g2 > 0, s / g2, np.inf)
    out = np.where(s > 0, out, 0.0)
    return np.where(np.isfinite(gs) & np.isfinite(gb), out, np.nan)


def near_target_window(epochs, warmup, target_epoch, k: int = NEAR_TARGET_EPOCHS) -> list:
    """The epochs of one run whose sums estimate its noise scale near the target: the
    last ``k`` non-warm-up epochs up to and including ``target_epoch`` (the epoch in
    which the validation loss reached the target); with no target epoch (NaN/None: the
    run never reached it) the last ``k`` non-warm-up epochs. ``epochs``/``warmup``: the
    run's epoch numbers and warm-up flags, in any order."""
    t = _number(target_epoch)
    reached = math.isfinite(t)
    kept = sorted(e for e, w in zip(epochs, warmup) if not w and (not reached or e <= t))
    return kept[-k:] if k > 0 else []


def _flag(values: pd.Series) -> pd.Series:
    """Warm-up flags as booleans (True/False, 1/0 or their text)."""
    return values.astype(str).str.strip().str.lower().isin(["true", "1", "1.0"])


def window_sums(runs: pd.DataFrame, epochs: pd.DataFrame, k: int = NEAR_TARGET_EPOCHS):
    """Every completed run's noise-scale sums over its near-target window
    (``near_target_window``) from epochs.csv: one row per run_id with ``nsw_steps``
    (instrumented updates), ``nsw_g_local``/``nsw_g_global`` (sums over those updates of
    the squared norms) and ``nsw_samples`` (N, samples per epoch). Runs without sums in
    their window are absent. An epochs table without the noise columns (written before
    them) gives no rows."""
    need = ["run_id", "epoch", "warmup", "samples", "noise_steps", "g_local_sq", "g_global_sq"]
    out = pd.DataFrame(columns=["run_id", *WINDOW_COLUMNS])
    if epochs is None or runs is None or epochs.empty or runs.empty:
        return out
    if any(c not in epochs for c in need) or "run_id" not in runs:
        return out
    done = runs if "status" not in runs else runs[runs["status"] == "completed"]
    reached = (
        done["reached_target"].astype(bool)
        if "reached_target" in done
        else pd.Series(False, index=done.index)
    )
    target = pd.Series(math.nan, index=done.index)
    if "target_epoch" in done:
        target = pd.to_numeric(done["target_epoch"], errors="coerce").where(reached)
    targets = pd.DataFrame({"run_id": done["run_id"].to_numpy(), "_target": target.to_numpy()})
    e = epochs[need].merge(targets, on="run_id", how="inner")
    for c in ("epoch", "samples", "noise_steps", "g_local_sq", "g_global_sq"):
        e[c] = pd.to_numeric(e[c], errors="coerce")
    e = e[~_flag(e["warmup"]) & (e["_target"].isna() | (e["epoch"] <= e["_target"]))]
    e = e.sort_values(["run_id", "epoch"], ascending=[True, False], kind="stable")
    e = e[e.groupby("run_id").cumcount() < k]
    ok = (e["noise_steps"] > 0) & np.isfinite(e["g_local_sq"]) & np.isfinite(e["g_global_sq"])
    e = e[ok]
    if e.empty:
        return out
    n = e["noise_steps"].astype(float)
    e = e.assign(
        nsw_steps=n,
        nsw_g_local=n * e["g_local_sq"],
        nsw_g_global=n * e["g_global_sq"],
        nsw_samples=e["samples"],
    )
    agg = {"nsw_steps": "sum", "nsw_g_local": "sum", "nsw_g_global": "sum"}
    agg["nsw_samples"] = "min"
    return e.groupby("run_id", sort=True).agg(agg).reset_index()[out.columns]


def configuration_estimate(
    b_small: float, b_big: float, sums: pd.DataFrame, name: str
) -> tuple[float, float, float, str]:
    """(B_simple, lo, hi, note) of one configuration from its runs' window sums
    (``window_sums`` rows): the pooled step-weighted means (a ratio of means) with the
    finite-shard correction at the runs' samples per epoch, and the 95 % percentile
    bootstrap interval over the runs (``stats.paired_interval``; NaN with fewer than
    ``stats.MIN_REPEATS`` runs, the note says why)."""
    from hvdscale.analysis.stats import FEW_REPEATS, MIN_REPEATS, paired_interval

    nan = math.nan
    if sums is None or sums.empty or any(c not in sums for c in WINDOW_COLUMNS):
        return nan, nan, nan, "no noise-scale sums near the target"
    s = sums[WINDOW_COLUMNS].apply(pd.to_numeric, errors="coerce").dropna()
    s = s[s["nsw_steps"] > 0]
    if s.empty:
        return nan, nan, nan, "no noise-scale sums near the target"
    n_samples = float(s["nsw_samples"].min())
    steps, gl, gg = (s[c].to_numpy(float) for c in WINDOW_COLUMNS[:3])
    b = estimate(b_small, b_big, gl.sum() / steps.sum(), gg.sum() / steps.sum(), n_samples)[2]
    if len(s) < MIN_REPEATS:
        note = (
            f"noise scale: no interval, fewer than {MIN_REPEATS} runs with noise-scale "
            f"sums ({len(s)})"
        )
        return b, nan, nan, note

    def stat(st, l_, g_, axis=-1):
        tot = st.sum(axis=axis)
        return b_simple_values(
            b_small, b_big, l_.sum(axis=axis) / tot, g_.sum(axis=axis) / tot, n_samples
        )

    lo, hi = paired_interval([steps, gl, gg], stat, name=name)
    note = ""
    if len(s) < FEW_REPEATS:
        note = f"noise-scale interval from fewer than {FEW_REPEATS} runs: coverage below 95 %"
    return b, lo, hi, note


def agrees(b_lo: float, b_hi: float, implied: float) -> bool:
    """Whether the critical batch a measured epochs ratio implies lies inside the
    B_simple interval [b_lo, b_hi]. False without an interval or an implied value, and
    for an interval with an open end (lower end 0, upper end inf: the data bound the
    critical batch on one side only, so no limit can be read from it)."""
    lo, hi, x = (_number(v) for v in (b_lo, b_hi, implied))
    if math.isnan(lo) or math.isnan(hi) or math.isnan(x):
        return False
    if not (lo > 0 and math.isfinite(hi) and math.isfinite(x)):
        return False
    return lo <= x <= hi


def _number(v) -> float:
    """``v`` as a float; NaN for None, pd.NA and anything not a number."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def predicted_epochs_ratio(b_1: float, b_n: float, b_crit: float) -> float:
    """E(B_1)/E(B_n) with E(B) proportional to 1 + B/B_crit (NaN without a B_crit)."""
    if not (b_crit and math.isfinite(b_crit) and b_crit > 0):
        return math.nan
    return (1.0 + b_1 / b_crit) / (1.0 + b_n / b_crit)


def predicted_epochs_interval(b_1: float, b_n: float, b_lo, b_hi) -> tuple[float, float]:
    """The interval of predicted_epochs_ratio over B_crit's interval [b_lo, b_hi] (the
    bootstrap interval of B_simple): the ratio rises with B_crit, so its ends are the
    ratios at the interval's ends (b_1/b_n, the limit, where b_lo is not above 0; 1 where
    b_hi is infinite). (NaN, NaN) without an interval."""
    lo, hi = _number(b_lo), _number(b_hi)
    if math.isnan(lo) or math.isnan(hi) or not b_n > 0:
        return math.nan, math.nan
    low = predicted_epochs_ratio(b_1, b_n, lo) if lo > 0 else b_1 / b_n
    high = predicted_epochs_ratio(b_1, b_n, hi) if math.isfinite(hi) else 1.0
    return (low, high) if math.isfinite(low) and math.isfinite(high) else (math.nan, math.nan)


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
