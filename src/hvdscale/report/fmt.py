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
