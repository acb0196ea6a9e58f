"""A process's resident set from /proc, and the trend of a series of samples: the one copy the memory
benchmarks share (bench/soak.py, bench/scheduler_bench.py's soak, bench/router_memory.py).

`rss_kb` reads the live process; `slope_kb_per_min` and `rss_trend` are pure (samples in, figures out).
"""

from __future__ import annotations

import statistics
from typing import Sequence

from clients.stats import percentile


def rss_kb(pid: int) -> int | None:
    """VmRSS of a live process in kB; None once it has exited."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def slope_kb_per_min(samples: Sequence[tuple[float, int]], start_s: float, end_s: float) -> float | None:
    """Least-squares slope of the samples in [start_s, end_s], kB per minute; None with fewer than 3."""
    inside = [(t, v) for t, v in samples if start_s <= t <= end_s]
    if len(inside) < 3 or len({t for t, _ in inside}) < 2:
        return None
    slope = statistics.linear_regression([t for t, _ in inside], [v for _, v in inside]).slope
    return round(slope * 60.0, 1)


def rss_trend(samples: Sequence[tuple[float, int]], settle_s: float) -> dict:
    """Whether a series of (seconds, RSS kB) samples is flat once settled: over the samples from `settle_s` on
    (all of them when none is that late; the first ones warm buffers and allocator arenas up), the least-squares
    slope, the medians of the two halves and the band (min, max) that RSS's own noise moves in. A leak shows
    as a slope whose growth over the settled span exceeds the band's width, and as a second half above the
    first; a swing that happens to straddle a window does not."""
    settled = [(t, v) for t, v in samples if t >= settle_s] or list(samples)
    values = [v for _, v in settled]
    half = len(values) // 2
    return {
        "settle_s": settle_s,
        "samples_settled": len(settled),
        "rss_kb_slope_per_min": slope_kb_per_min(settled, float("-inf"), float("inf")),
        "rss_kb_median_first_half": percentile(values[:half], 50) if half else (values[0] if values else None),
        "rss_kb_median_second_half": percentile(values[half:], 50) if values else None,
        "rss_kb_band_settled": [min(values), max(values)] if values else None,
    }
