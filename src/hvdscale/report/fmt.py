"""Number formatting for the report tables (one place, so the tests can format a value
exactly as the report prints it). The reference study's numbers are the config's
``references`` (hvdscale.analysis.references.references_of)."""

from __future__ import annotations

import math

MISSING = "-"
EN_DASH = "\u2013"


def isnum(x) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def speedup(x) -> str:
    """Speedup and efficiency: two decimals (1.87)."""
    return f"{float(x):.2f}" if isnum(x) else MISSING


efficiency = speedup
slope = speedup


def has_interval(lo, hi) -> bool:
    """An interval exists: both ends are numbers (an open end, 0 or +inf, included)."""
    try:
        return (
            lo is not None
            and hi is not None
            and not (math.isnan(float(lo)) or math.isnan(float(hi)))
        )
    except (TypeError, ValueError):
        return False


def interval(lo, hi) -> str:
    """A speedup's 95 % interval: '[1.20-1.70]' (en dash); an open end as such: '[0.80,
    inf)' where the upper end is unbounded (a resampled baseline median was censored),
    '(0, 1.20]' where the lower end is (this side's); '' without an interval."""
    if not has_interval(lo, hi):
        return ""
    lo, hi = float(lo), float(hi)
    left = "(0" if lo <= 0 else f"[{speedup(lo)}"
    right = "inf)" if math.isinf(hi) else f"{speedup(hi)}]"
    if lo <= 0 or math.isinf(hi):
        return f"{left}, {right}"
    return f"{left}{EN_DASH}{right}"


def direction(lo, hi) -> str:
    """'faster' where the whole interval lies above 1, 'slower' where it lies below 1,
    '' where it holds 1 or there is none: the only words an interval supports."""
    if not has_interval(lo, hi):
        return ""
    if float(lo) > 1:
        return "faster"
    if float(hi) < 1:
        return "slower"
    return ""


def percent(x, digits: int = 1) -> str:
    """A share (0.281) as a percentage ('28.1 %')."""
    return f"{100 * float(x):.{digits}f} %" if isnum(x) else MISSING


def loss(x) -> str:
    """Test loss: four significant digits (0.02345)."""
    return f"{float(x):.4g}" if isnum(x) else MISSING


def seconds(x) -> str:
    """A time in seconds with three significant digits (25.1, 0.412, 1230)."""
    if not isnum(x):
        return MISSING
    x = float(x)
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def millis(x) -> str:
    """Seconds shown as milliseconds (0.00123 -> '1.23')."""
    return f"{1e3 * float(x):.3g}" if isnum(x) else MISSING


def micros(x) -> str:
    return f"{1e6 * float(x):.3g}" if isnum(x) else MISSING


def rate(x) -> str:
    """Throughput in samples/s, thousands separated."""
    return f"{float(x):,.0f}" if isnum(x) else MISSING


def gbps(x) -> str:
    return f"{float(x) / 1e9:.3g}" if isnum(x) else MISSING


def spread(mid: str, lo: str, hi: str) -> str:
    """'25.1 (24.7-25.4)' with an en dash; just the median if the range is empty or one value."""
    if mid == MISSING:
        return MISSING
    if lo == MISSING or hi == MISSING or lo == hi:
        return mid
    return f"{mid} ({lo}{EN_DASH}{hi})"


def rel_error(x) -> str:
    """A signed relative error as a percentage ('+12.3 %')."""
    return f"{100 * float(x):+.1f} %" if isnum(x) else MISSING


def not_reached(reached, total, diverged) -> str:
    """Why runs did not reach the target: '2 diverged (non-finite loss), 1 hit the
    budget'; '' where every run reached it."""
    total, reached = int(total) if isnum(total) else 0, int(reached) if isnum(reached) else 0
    div = int(diverged) if isnum(diverged) else 0
    budget = max(total - reached - div, 0)
    parts = []
    if div:
        parts.append(f"{div} diverged (non-finite loss)")
    if budget:
        parts.append(f"{budget} hit the budget")
    return ", ".join(parts)


def counts(reached, total, diverged=0) -> str:
    """'3/5 reached' with the reasons of the others: '3/5 reached: 1 diverged
    (non-finite loss), 1 hit the budget'."""
    r = int(reached) if isnum(reached) else 0
    head = f"{r}/{int(total) if isnum(total) else 0} reached"
    why = not_reached(reached, total, diverged)
    return f"{head}: {why}" if why else head
