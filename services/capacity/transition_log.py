"""Transition log lines, rate-limited per worker and kind so that a flapping worker cannot flood the log.

Lifecycle lines (`added`, `removed`) are always written. For every other kind (health,
card_changed, card_rejected, mismatch, and degraded: WARNING while something is off, INFO when
it ends) at most one line per `(worker_id, kind)` is written per
`interval_s` (for health, per target health: the first `-> UNHEALTHY` is never held back by a
recent `-> HEALTHY`); later ones are counted, and once the interval has passed the latest of them is
written with the count, by the next transition of that kind or by `flush` (called every poll
round), so the log always ends on the worker's real state. `card_held` is DEBUG and never limited.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services.capacity.core.registry import Transition, TransitionKind

_ALWAYS = (TransitionKind.ADDED, TransitionKind.REMOVED)


def level_of(t: Transition) -> int:
    if t.kind is TransitionKind.CARD_HELD:
        return logging.DEBUG
    if (
        t.kind in (TransitionKind.CARD_REJECTED, TransitionKind.MISMATCH)
        or (t.kind is TransitionKind.HEALTH and t.new == "UNHEALTHY")
        or (t.kind is TransitionKind.DEGRADED and t.new != "none")
    ):
        return logging.WARNING
    return logging.INFO


@dataclass
class _Window:
    logged_at: float
    suppressed: int = 0
    latest: Transition | None = None
    seq: int = 0  # order of `latest`, so summaries come out in the order things happened


class TransitionLog:
    def __init__(self, logger: logging.Logger, interval_s: float) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._windows: dict[tuple[str, TransitionKind, str], _Window] = {}
        self.suppressed_total = 0
        self._seq = 0

    def emit(self, transitions: list[Transition], now: float) -> None:
        for t in transitions:
            if t.kind is TransitionKind.REMOVED:
                self._summarise_all([self._windows.pop(k) for k in list(self._windows) if k[0] == t.worker_id])
            if t.kind in _ALWAYS or t.kind is TransitionKind.CARD_HELD or self._interval_s <= 0:
                self._log.log(level_of(t), "%s", t.message())
                continue
            key = (t.worker_id, t.kind, t.new if t.kind is TransitionKind.HEALTH else "")
            window = self._windows.get(key)
            if window is not None and now - window.logged_at < self._interval_s:
                self._seq += 1
                window.suppressed += 1
                window.latest = t
                window.seq = self._seq
                self.suppressed_total += 1
                continue
            if window is not None:
                self._summarise(window)
            self._log.log(level_of(t), "%s", t.message())
            self._windows[key] = _Window(logged_at=now)

    def flush(self, now: float) -> None:
        """Write the latest suppressed transition of every window that has run out; forget quiet ones."""
        expired = {key[:2] for key, window in self._windows.items() if now - window.logged_at >= self._interval_s}
        # Sibling windows (the other target health) go out with it, in order, so the last line is the real state.
        self._summarise_all([self._windows.pop(key) for key in list(self._windows) if key[:2] in expired])

    def _summarise_all(self, windows: list[_Window]) -> None:
        for window in sorted(windows, key=lambda w: w.seq):
            self._summarise(window)

    def _summarise(self, window: _Window) -> None:
        if window.latest is not None:
            self._log.log(
                level_of(window.latest),
                "%s (latest of %d %s transitions not logged in the last %gs)",
                window.latest.message(),
                window.suppressed,
                window.latest.kind.value,
                self._interval_s,
            )
