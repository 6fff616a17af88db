"""A small percentile bootstrap for the study checks (references, compare).

Resamples every group of repeats independently (the baseline's repeats included, as
Hoefler & Belli ask) and recomputes the statistic; a fixed seed makes the interval,
and so every file built from it, reproducible. Fewer than ``MIN_REPEATS`` values in
any group: no interval (None).

(analysis/stats.py on another branch adds the project-wide bootstrap; this one can
then delegate to it.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

MIN_REPEATS = 3
N_RESAMPLES = 2000
SEED = 20240601


def bootstrap_ci(
    groups: Sequence[Sequence[float]],
    stat: Callable[[list[np.ndarray]], float],
    *,
    level: float = 0.95,
    n: int = N_RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float] | None:
    """Percentile interval of ``stat(groups)`` with each group resampled with replacement.

    ``stat`` is vectorised: it gets one (n, len(group)) array per group (row i = the
    i-th resample; reduce with ``axis=-1``) and returns n values. The same function
    applied to the 1-D groups gives the point estimate.
    """
    arrays = [np.asarray([v for v in g if math.isfinite(v)], dtype=float) for g in groups]
    if not arrays or min(len(a) for a in arrays) < MIN_REPEATS:
        return None
    rng = np.random.default_rng(seed)
    resampled = [a[rng.integers(0, len(a), (n, len(a)))] for a in arrays]
    values = np.asarray(stat(resampled), dtype=float).reshape(-1)
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    alpha = (1 - level) / 2
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha))


def intervals_overlap(a: tuple | None, b: tuple | None) -> bool | None:
    """Whether two intervals overlap (None when either is missing)."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]
