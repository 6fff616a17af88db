"""95 % bootstrap confidence intervals of speedups over repeats (Hoefler & Belli).

S = median(T_baseline) / median(T_n). One bootstrap replicate resamples, with
replacement, the baseline's repeats and the configuration's repeats independently, so
the baseline's own spread is part of the interval; the interval is the 2.5 and 97.5
percentiles of the replicates. The random generator is seeded from a fixed seed and the
configuration's name, so the interval does not depend on row order and is the same on
every run. Fewer than ``MIN_REPEATS`` completed repeats on either side: no interval,
and a note that says why.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

SEED = 20240601
N_BOOT = 2000
LEVEL = 0.95
MIN_REPEATS = 3


def rng_for(name: str, seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def bootstrap_ratio(
    base,
    values,
    *,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    rng: np.random.Generator | None = None,
) -> tuple[float, float]:
    """(lo, hi) of the percentile bootstrap interval of median(base) / median(values)."""
    base = np.asarray(base, dtype=float)
    values = np.asarray(values, dtype=float)
    rng = rng if rng is not None else rng_for("ratio")
    b = np.median(base[rng.integers(0, base.size, (n_boot, base.size))], axis=1)
    v = np.median(values[rng.integers(0, values.size, (n_boot, values.size))], axis=1)
    ratio = b / v
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratio, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def speedup_interval(
    base, values, name: str, *, what: str = "repeats", min_repeats: int = MIN_REPEATS
) -> tuple[float, float, str]:
    """(lo, hi, note) of the speedup median(base)/median(values); NaN and a note saying
    why where either side has fewer than ``min_repeats`` finite values."""
    base = [x for x in base if x is not None and math.isfinite(x)]
    values = [x for x in values if x is not None and math.isfinite(x)]
    if len(values) < min_repeats or len(base) < min_repeats:
        return (
            math.nan,
            math.nan,
            f"no interval: fewer than {min_repeats} {what} "
            f"(this configuration {len(values)}, 1-worker baseline {len(base)})",
        )
    lo, hi = bootstrap_ratio(base, values, rng=rng_for(name))
    return lo, hi, ""
