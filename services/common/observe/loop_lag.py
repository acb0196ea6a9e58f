"""Event-loop lag: how late a service's own loop runs what is due.

Every deadline a service keeps (the router's Admit decision window, lease renewals, poll timeouts) is
measured on its event loop. When the loop itself is blocked (a long synchronous step, a full garbage
collection, the process not scheduled on a saturated machine) a timer fires late, and a peer's answer
that arrived meanwhile may be judged missing. This module measures that lateness so it can be seen
(a histogram per service, one WARNING per stall episode) and so deadline owners can tell "the peer was
slow" from "we were not running": `stalled_within` for one long stall, `lag_clock` for the total.

A saturated loop (hundreds of streams on a busy core) is never idle and never stalls for long, yet every
loop turn is slow, and an answer that needs a few turns to arrive takes seconds of wall time. The
sampler then wakes about once a loop turn, so the wall time minus `lag_clock` (the loop's on-time
clock) advances about one sampling interval per loop turn however slow the turn: a deadline kept on it
expires after a number of loop turns, which lag cannot shorten.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from prometheus_client import CollectorRegistry, Histogram

log = logging.getLogger(__name__)

LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopLag:
    """Samples the loop every `interval_s` and keeps the recent stalls.

    A sample's lag is how much later than asked the loop woke the sampler. `stalled_within(window_s)`
    is the longest lag seen over the last `window_s` seconds (including a stall still under way when
    the caller runs: the time since the sampler last ran beyond its interval). `lag_clock()` is the
    total lag so far (the stall under way included once the sampler runs).
    """

    def __init__(
        self,
        service: str,
        registry: CollectorRegistry | None,
        *,
        interval_s: float = 0.1,
        warn_s: float = 1.0,
        warn_every_s: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.interval_s = interval_s
        self.warn_s = warn_s
        self.warn_every_s = warn_every_s
        self._now = monotonic
        self._last_wake = monotonic()
        self._stalls: list[tuple[float, float]] = []  # (ended at, lag), lags >= interval only
        self._lag_total_s = 0.0
        self._last_warning = float("-inf")
        self._suppressed = 0
        self._task: asyncio.Task | None = None
        self.histogram = Histogram(
            "bandmaster_event_loop_lag_seconds",
            "How late the service's event loop ran a timer (sampled every "
            f"{interval_s:g}s); a late loop makes every deadline it keeps late too",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    def observe(self, lag_s: float) -> None:
        """Record one sample (the sampler, or a test, calls this after each wake)."""
        now = self._now()
        self._last_wake = now
        lag_s = max(0.0, lag_s)
        self._lag_total_s += lag_s
        self.histogram.observe(lag_s)
        if lag_s >= self.interval_s:
            self._stalls.append((now, lag_s))
            horizon = now - 600.0
            while self._stalls and self._stalls[0][0] < horizon:
                self._stalls.pop(0)
        if lag_s >= self.warn_s:
            if now - self._last_warning >= self.warn_every_s:
                extra = f" ({self._suppressed} more since the last warning)" if self._suppressed else ""
                log.warning("%s: event loop blocked for %.2fs%s; its deadlines fired late", self.service, lag_s, extra)
                self._last_warning = now
                self._suppressed = 0
            else:
                self._suppressed += 1

    def stalled_within(self, window_s: float) -> float:
        """The longest stall of the loop that overlapped the last `window_s` seconds (0 when none)."""
        now = self._now()
        ongoing = max(0.0, now - self._last_wake - self.interval_s)
        worst = ongoing
        for ended, lag in reversed(self._stalls):
            if ended < now - window_s:
                break
            worst = max(worst, lag)
        return worst

    def lag_clock(self) -> float:
        """Seconds the loop has run late since this sampler was made, a stall under way included (only
        while the sampler runs: without it there is nothing to measure, and this stays at the total
        observed). Wall time minus this is the loop's on-time clock; see the module docstring."""
        if self._task is None:
            return self._lag_total_s
        return self._lag_total_s + max(0.0, self._now() - self._last_wake - self.interval_s)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.observe(loop.time() - asked)

    def start(self) -> None:
        if self._task is None:
            self._last_wake = self._now()
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.service}-loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
