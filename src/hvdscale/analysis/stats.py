"""The project's one bootstrap: 95 % intervals over repeats on ``scipy.stats.bootstrap``.

Used by the summary and tuning tables, the reference checks (analysis/references.py),
the study comparison (study/compare.py) and the benchmarks; every interval comes from
one call of ``scipy.stats.bootstrap`` (``_percentile``).

Speedup S = median(T_baseline) / median(T_n) (Hoefler & Belli). One bootstrap replicate
resamples the baseline's repeats too. Where both sides hold the same repeat indices the
repeats are paired (the same seeds per repeat index: contract of issue 16) and the pairs
are resampled together; otherwise each side is resampled independently.

Method (``CI_METHOD``): percentile interval of the log speedup (the same as of the speedup:
medians of an odd count commute with the logarithm), 9999 resamples, seeded from a fixed
seed and the configuration's name so every file built from it is reproducible. We chose
it by simulation (1,000 trials of lognormal times with a known ratio, n = 5 per side):
paired percentile covers 94 % whatever the correlation of the pairs, independent
percentile 96-98 %; BCa covers only 80-89 % on pairs, and Hesterberg's expanded
percentile does not change the paired coverage at n = 5 (the median of 5 resampled
values takes only 5 values) and over-covers (99 %) independently. At n = 3 nothing
reaches 95 % (paired 75 %, independent 90 %), so intervals from 3 or 4 repeats carry a
note. Fewer than ``MIN_REPEATS`` repeats on either side: no interval, and a note says why.

Censoring: a run that never reached the target (its budget ran out, or its loss
diverged: analysis.columns.ttt_runs) has time to target +inf. Medians count it
(``censored_median``: a median exists while fewer than half the repeats are censored,
else NaN and the note "3/5 censored: no median"). It is the median with every run that
did not reach the target counted as never reaching it. Where every such run hit the
budget, and the budget is the same for every run of a study, this is the Kaplan-Meier
median (each of those runs censored after the last observed time; tests/test_stats.py
checks the two against scipy.stats.ecdf on CensoredData). A diverged run is not censored
in Kaplan-Meier's sense: it stopped early, and Kaplan-Meier would let it reach the target
later; here it never does (its loss is not finite). With diverged runs the median is
therefore not Kaplan-Meier's: it is at least as large, the honest figure for a
configuration that can diverge. In a bootstrap replicate a median can be +inf: the
speedup is then +inf (baseline censored) or 0 (this side censored), and the interval
gets an open end ([0.8, inf), printed as such). Where both medians are +inf the
replicate says nothing about the ratio: it counts as 0 for the lower end and as +inf for
the upper end (the interval widens; it never narrows towards 1).
"""

from __future__ import annotations

import copy
import math
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from hvdscale.errors import UserError

SEED = 20240601
N_RESAMPLES = 9999
LEVEL = 0.95
MIN_REPEATS = 3
FEW_REPEATS = 5  # below this the interval under-covers (see the module doc)
#: what the simulation of the module doc says about intervals from fewer than FEW_REPEATS
#: repeats, in the words the report uses (page 1 states it where they occur)
COVERAGE_FEW = (
    f"an interval from fewer than {FEW_REPEATS} repeats covers the true speedup less often "
    "than 95 %: by this project's simulation (1,000 trials of lognormal times with a known "
    "ratio) about 75 % with 3 paired repeats per side and about 90 % with 3 independent ones"
)
CI_METHOD = (
    "percentile bootstrap (scipy.stats.bootstrap, 9999 resamples; paired repeats "
    "resampled as pairs, else each side independently; a run that did not reach the "
    "target counts as +inf, so an interval may have an open end)"
)
_BIG = 1e6  # a log speedup standing for +-inf inside the percentile computation


def rng_for(name: str, seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _clean(values) -> np.ndarray:
    """Floats without missing values (None/NaN); +inf (censored) is kept."""
    out = [float(v) for v in values if v is not None and not _isnan(v)]
    return np.asarray(out, dtype=float)


def _isnan(v) -> bool:
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return True


def censored_median(values) -> tuple[float, int, int]:
    """(median, reached, total) of times where +inf marks a censored run; the median is
    NaN unless fewer than half of the repeats are censored (and when there are none)."""
    x = _clean(values)
    total, reached = int(x.size), int(np.isfinite(x).sum())
    if total == 0 or 2 * (total - reached) >= total:
        return math.nan, reached, total
    return float(np.median(x)), reached, total


def censor_note(reached: int, total: int) -> str:
    """Why a censored median is missing ('' when it exists)."""
    if total == 0:
        return "no completed repeats"
    if 2 * (total - reached) >= total:
        return f"{total - reached}/{total} censored: no median"
    return ""


def _log_ratio_as(undefined: float):
    """The log speedup of a replicate, with ``undefined`` where both medians are +inf
    (both sides censored: the replicate does not bound the ratio)."""

    def stat(b: np.ndarray, v: np.ndarray, axis: int = -1) -> np.ndarray:
        mb, mv = np.median(b, axis=axis), np.median(v, axis=axis)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(mb) - np.log(mv)
        r = np.where(np.isinf(mb) & np.isinf(mv), undefined, r)
        return np.clip(r, -_BIG, _BIG)

    return stat


def _from_log(x: float) -> float:
    if x >= _BIG / 2:
        return math.inf
    if x <= -_BIG / 2:
        return 0.0
    return float(math.exp(min(x, 700.0)))  # exp(709.8) overflows a float


def _percentile(
    data,
    statistic,
    *,
    rng: np.random.Generator,
    paired: bool = False,
    n_resamples: int = N_RESAMPLES,
    level: float = LEVEL,
):
    """(lo, hi) of the percentile bootstrap interval of the vectorised ``statistic`` over
    the samples ``data`` (last axis), resampled as pairs with ``paired``; the project's
    one call of scipy.stats.bootstrap."""
    from scipy import stats  # lazy: slow to import, and most importers never bootstrap

    res = stats.bootstrap(
        data,
        statistic,
        paired=paired,
        vectorized=True,
        axis=-1,
        n_resamples=n_resamples,
        confidence_level=level,
        method="percentile",
        rng=rng,
    )
    return res.confidence_interval


def bootstrap_ratio(
    base,
    values,
    *,
    paired: bool = False,
    n_resamples: int = N_RESAMPLES,
    level: float = LEVEL,
    rng: np.random.Generator | None = None,
) -> tuple[float, float]:
    """(lo, hi) of the percentile bootstrap interval of median(base) / median(values)
    (arrays; with ``paired`` of equal length, element i of each from the same seed).
    Works on a batch too: arrays of shape (trials, n) give arrays of intervals."""
    base = np.asarray(base, dtype=float)
    values = np.asarray(values, dtype=float)
    rng = rng if rng is not None else rng_for("ratio")
    again = copy.deepcopy(rng)  # the same resamples for the second end
    kw = dict(paired=paired, n_resamples=n_resamples, level=level)
    # the lower end counts a replicate with both sides censored as ratio 0, the upper
    # end as +inf; without such replicates both calls give the same interval
    lo, _ = _percentile((base, values), _log_ratio_as(-_BIG), rng=rng, **kw)
    _, hi = _percentile((base, values), _log_ratio_as(_BIG), rng=again, **kw)
    if np.ndim(lo):
        return np.vectorize(_from_log)(lo), np.vectorize(_from_log)(hi)
    return _from_log(float(lo)), _from_log(float(hi))


def best_of_interval(
    bases: Sequence[Sequence[float]], values, name: str, *, min_repeats: int = MIN_REPEATS
) -> tuple[float, float, str]:
    """(lo, hi, note) of the speedup of ``values`` against the fastest of several
    baselines (``bases``: the time samples of each candidate, the chosen one first),
    where the choice is made on the same runs: every replicate resamples each candidate
    independently and takes the smallest median of that replicate, so the interval
    carries the choice (a fastest chosen by luck is not credited twice). Candidates with
    fewer than ``min_repeats`` values take no part; without the chosen one: no interval."""
    v = _clean(values)
    bs = [_clean(b) for b in bases]
    if not bs or len(bs[0]) < min_repeats or len(v) < min_repeats:
        return math.nan, math.nan, f"no interval: fewer than {min_repeats} repeats"
    bs = [b for b in bs if len(b) >= min_repeats]

    def stat_as(undefined: float):
        def stat(*xs, axis=-1):
            mb = np.minimum.reduce([np.median(x, axis=axis) for x in xs[:-1]])
            mv = np.median(xs[-1], axis=axis)
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.log(mb) - np.log(mv)
            r = np.where(np.isinf(mb) & np.isinf(mv), undefined, r)
            return np.clip(r, -_BIG, _BIG)

        return stat

    rng = rng_for(name)
    again = copy.deepcopy(rng)
    lo, _ = _percentile((*bs, v), stat_as(-_BIG), rng=rng)
    _, hi = _percentile((*bs, v), stat_as(_BIG), rng=again)
    note = f"the fastest of {len(bs)} 1-worker configurations, the choice resampled"
    return _from_log(float(lo)), _from_log(float(hi)), note


def _pairs(base, values, base_ids, ids) -> tuple[np.ndarray, np.ndarray, bool]:
    """Align both sides by repeat index when they hold the same indices (paired). A side
    that holds one index twice mixes runs that are not like (two settings, two kinds of
    run: analysis/like.py): a UserError naming the index, never one run dropped."""
    if base_ids is None or ids is None:
        return _clean(base), _clean(values), False
    for side, xs in (("1-worker baseline", base_ids), ("this configuration", ids)):
        seen: set[int] = set()
        for i in xs:
            if int(i) in seen:
                raise UserError(
                    f"bootstrap pairs: the {side} holds two runs of seed id {int(i)}; a "
                    "comparison must group runs of one setting and one kind only "
                    "(analysis/like.py)"
                )
            seen.add(int(i))
    b = {int(i): v for i, v in zip(base_ids, base) if v is not None and not _isnan(v)}
    g = {int(i): v for i, v in zip(ids, values) if v is not None and not _isnan(v)}
    if set(b) != set(g):
        return _clean(b.values()), _clean(g.values()), False
    keys = sorted(b)
    return _clean([b[k] for k in keys]), _clean([g[k] for k in keys]), True


def speedup_interval(
    base,
    values,
    name: str,
    *,
    what: str = "repeats",
    min_repeats: int = MIN_REPEATS,
    base_repeats: Sequence[int] | None = None,
    repeats: Sequence[int] | None = None,
) -> tuple[float, float, str]:
    """(lo, hi, note) of the speedup median(base)/median(values) over repeats (+inf =
    censored). NaN and a note saying why where either side has fewer than ``min_repeats``
    values or has no median (half or more censored). With the repeat indices of both
    sides given, identical index sets are resampled as pairs."""
    b, v, paired = _pairs(base, values, base_repeats, repeats)
    if len(v) < min_repeats or len(b) < min_repeats:
        return (
            math.nan,
            math.nan,
            f"no interval: fewer than {min_repeats} {what} "
            f"(this configuration {len(v)}, 1-worker baseline {len(b)})",
        )
    for side, x in (("this configuration", v), ("1-worker baseline", b)):
        note = censor_note(int(np.isfinite(x).sum()), len(x))
        if note:
            return math.nan, math.nan, f"no interval: {side} {note}"
    lo, hi = bootstrap_ratio(b, v, paired=paired, rng=rng_for(name))
    note = ""
    if min(len(b), len(v)) < FEW_REPEATS:
        note = f"interval from fewer than {FEW_REPEATS} repeats: coverage below 95 %"
    return lo, hi, note


def median_interval(
    values, *, name: str = "median", min_repeats: int = MIN_REPEATS
) -> tuple[float, float | None, float | None]:
    """(median, lo, hi) of one sample with the percentile bootstrap interval of the
    median (lo, hi None with fewer than ``min_repeats`` values)."""
    x = _clean(values)
    if x.size == 0:
        return math.nan, None, None
    m = float(np.median(x))
    if x.size < min_repeats:
        return m, None, None
    ci = bootstrap_ci([x], lambda g: np.median(g[0], axis=-1), rng=rng_for(name))
    return (m, None, None) if ci is None else (m, ci[0], ci[1])


def censored_median_interval(
    values, *, name: str = "median", min_repeats: int = MIN_REPEATS
) -> tuple[float, float, float]:
    """(median, lo, hi) of one sample of times where +inf marks a run that did not reach
    the target: ``censored_median`` with the percentile bootstrap interval of the median
    computed with those runs kept (on the logarithm, clipped like the speedups, so the
    upper end can be inf: an open end). NaN ends with fewer than ``min_repeats`` values or
    without a median."""
    x = _clean(values)
    m = censored_median(x)[0]
    if x.size < min_repeats or not math.isfinite(m):
        return m, math.nan, math.nan

    def log_median(v, axis=-1):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(np.median(v, axis=axis))
        return np.clip(r, -_BIG, _BIG)

    lo, hi = _percentile((x,), log_median, rng=rng_for(name))
    return m, _from_log(float(lo)), _from_log(float(hi))


def bootstrap_ci(
    groups: Sequence[Sequence[float]],
    stat: Callable[[list[np.ndarray]], np.ndarray],
    *,
    level: float = LEVEL,
    n_resamples: int = N_RESAMPLES,
    rng: np.random.Generator | None = None,
    min_repeats: int = MIN_REPEATS,
) -> tuple[float, float] | None:
    """Percentile interval of ``stat(groups)``, each group resampled independently.

    ``stat`` is vectorised: it gets one array per group whose last axis holds the
    group's (resampled) values (reduce with ``axis=-1``). None where a group has fewer
    than ``min_repeats`` finite values or the interval is not finite."""
    arrays = [np.asarray([v for v in g if math.isfinite(v)], dtype=float) for g in groups]
    if not arrays or min(len(a) for a in arrays) < min_repeats:
        return None
    ci = _percentile(
        arrays,
        lambda *gs, axis=-1: stat(list(gs)),
        n_resamples=n_resamples,
        level=level,
        rng=rng if rng is not None else rng_for("ci"),
    )
    lo, hi = (float(x) for x in ci)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return lo, hi


def paired_interval(
    columns: Sequence[Sequence[float]],
    stat: Callable[..., np.ndarray],
    *,
    name: str,
    n_resamples: int = N_RESAMPLES,
    level: float = LEVEL,
) -> tuple[float, float]:
    """(lo, hi) of the percentile bootstrap interval of a positive statistic of repeats
    whose i-th values in every column belong together (one run's sums: resampled as
    one, ``paired``). ``stat(*columns, axis=-1)`` is vectorised over the last axis; its
    values may be 0 or +inf (computed on their logarithm, clipped like the speedups, so
    an end can be 0 or inf: an open end). The noise-scale interval over runs
    (analysis/noise_scale.configuration_estimate) uses it; the caller checks the count."""
    arrays = [np.asarray(c, dtype=float) for c in columns]

    def log_stat(*xs, axis=-1):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.log(stat(*xs, axis=axis))
        return np.clip(r, -_BIG, _BIG)  # NaN stays NaN: no interval

    lo, hi = _percentile(
        arrays,
        log_stat,
        paired=True,
        n_resamples=n_resamples,
        level=level,
        rng=rng_for(name),
    )
    return _from_log(float(lo)), _from_log(float(hi))


def intervals_overlap(a: tuple | None, b: tuple | None) -> bool | None:
    """Whether two intervals overlap (None when either is missing)."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]
