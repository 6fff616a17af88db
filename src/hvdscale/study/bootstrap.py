"""The study checks' bootstrap (references, compare): the project's one bootstrap,
hvdscale.analysis.stats (scipy.stats.bootstrap, percentile; ``CI_METHOD``).

Every group of repeats is resampled independently (the baseline's repeats included, as
Hoefler & Belli ask); a fixed seed makes the interval, and so every file built from
it, reproducible. Fewer than ``MIN_REPEATS`` values in any group: no interval (None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hvdscale.analysis import stats
from hvdscale.analysis.stats import CI_METHOD, MIN_REPEATS  # noqa: F401 (re-exported)


def bootstrap_ci(
    groups: Sequence[Sequence[float]],
    stat: Callable[[list[np.ndarray]], float],
    *,
    level: float = stats.LEVEL,
) -> tuple[float, float] | None:
    """Percentile interval of ``stat(groups)`` with each group resampled with replacement.

    ``stat`` is vectorised: it gets one array per group whose last axis holds the
    group's values (reduce with ``axis=-1``)."""
    return stats.bootstrap_ci(groups, stat, level=level, rng=stats.rng_for("study"))


def intervals_overlap(a: tuple | None, b: tuple | None) -> bool | None:
    """Whether two intervals overlap (None when either is missing)."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]
