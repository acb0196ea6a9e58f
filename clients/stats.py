"""Small helpers every benchmark shares: percentiles, latency summaries, waiting for a ready file."""

from __future__ import annotations

import math
import statistics
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank over the sorted values; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def interpolated_percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0-1) with linear interpolation between ranks; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary_ms(values_s: Sequence[float]) -> dict:
    """p50/p90/p99/mean in milliseconds of durations given in seconds."""
    ms = [v * 1000 for v in values_s]
    return {
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "mean": statistics.fmean(ms) if ms else float("nan"),
        "n": len(ms),
    }
