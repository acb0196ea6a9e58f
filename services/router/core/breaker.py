"""Circuit breaker: take a dependency out of rotation after repeated failures, probe it back in.

    CLOSED --(failure_threshold consecutive failures)--> OPEN
    OPEN   --(open_s elapsed; the next dispatch is the one probe)--> HALF_OPEN
    HALF_OPEN --(probe succeeds)--> CLOSED          (open_s back to its initial value)
    HALF_OPEN --(probe fails)--> OPEN for 2 * open_s (capped at max_open_s)
    HALF_OPEN --(probe abandoned: the caller went away)--> OPEN, probe due at once

While OPEN (and while its one probe is in flight) `available` is False: callers route around it.
A result that arrives for a call dispatched before the breaker opened changes nothing. The router
keeps one breaker per worker (failures: refused, reset, 5xx, first-token and inter-token timeouts)
and one for the scheduler (threshold 1: an unanswered Admit fails every turn open until a probe
answers). Pure: the caller passes `now` (monotonic seconds) and logs the transitions returned.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from services.common.settings.config import require


class CircuitState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class TransitionReason(enum.Enum):
    FAILURES = "failures"  # CLOSED -> OPEN
    PROBE = "probe"  # OPEN -> HALF_OPEN
    PROBE_OK = "probe_ok"  # HALF_OPEN -> CLOSED
    PROBE_FAILED = "probe_failed"  # HALF_OPEN -> OPEN (longer)
    PROBE_ABANDONED = "probe_abandoned"  # HALF_OPEN -> OPEN (probe due at once)


@dataclass(frozen=True)
class BreakerParams:
    failure_threshold: int = 3
    """Consecutive failures that open the circuit; 0 = never open (breaker off)."""
    open_s: float = 5.0
    """Time out of rotation before the first probe."""
    max_open_s: float = 60.0
    """Cap of the doubling after failed probes."""

    def __post_init__(self) -> None:
        require(self.failure_threshold >= 0, "failure_threshold", self.failure_threshold, "failure_threshold >= 0")
        require(self.open_s > 0, "open_s", self.open_s, "open_s > 0")
        require(self.max_open_s >= self.open_s, "max_open_s", self.max_open_s, "max_open_s >= open_s")


@dataclass(frozen=True)
class Transition:
    old: CircuitState
    new: CircuitState
    reason: TransitionReason
    open_s: float  # how long it stays OPEN (0 unless new is OPEN)
    failures: int  # consecutive failures when it happened


class CircuitBreaker:
    def __init__(self, params: BreakerParams) -> None:
        self.params = params
        self.state = CircuitState.CLOSED
        self.failures = 0
        self._open_s = params.open_s
        self._open_until = 0.0

    def available(self, now: float) -> bool:
        """May a call be dispatched now (CLOSED, or OPEN with its probe due)?"""
        if self.state is CircuitState.CLOSED:
            return True
        return self.state is CircuitState.OPEN and now >= self._open_until

    def retry_after(self, now: float) -> float:
        """Seconds until `available` may turn True (0 when it is)."""
        if self.state is CircuitState.OPEN:
            return max(0.0, self._open_until - now)
        return 0.0

    def on_dispatch(self, now: float) -> Transition | None:
        """A call was dispatched; when the probe was due it is the probe (OPEN -> HALF_OPEN)."""
        if self.state is CircuitState.OPEN and now >= self._open_until:
            return self._move(CircuitState.HALF_OPEN, TransitionReason.PROBE)
        return None

    def on_success(self, now: float) -> Transition | None:
        if self.state is CircuitState.HALF_OPEN:
            self._open_s = self.params.open_s
            self.failures = 0
            return self._move(CircuitState.CLOSED, TransitionReason.PROBE_OK)
        if self.state is CircuitState.CLOSED:
            self.failures = 0
        return None

    def on_failure(self, now: float) -> Transition | None:
        if self.state is CircuitState.CLOSED:
            self.failures += 1
            threshold = self.params.failure_threshold
            if threshold and self.failures >= threshold:
                self._open_until = now + self._open_s
                return self._move(CircuitState.OPEN, TransitionReason.FAILURES, self._open_s)
            return None
        if self.state is CircuitState.HALF_OPEN:
            self.failures += 1
            self._open_s = min(self._open_s * 2, self.params.max_open_s)
            self._open_until = now + self._open_s
            return self._move(CircuitState.OPEN, TransitionReason.PROBE_FAILED, self._open_s)
        return None  # OPEN: a call dispatched before it opened

    def on_abandon(self, now: float) -> Transition | None:
        """The call ended with no verdict on the dependency (the client went away)."""
        if self.state is CircuitState.HALF_OPEN:
            self._open_until = now
            return self._move(CircuitState.OPEN, TransitionReason.PROBE_ABANDONED)
        return None

    def _move(self, new: CircuitState, reason: TransitionReason, open_s: float = 0.0) -> Transition:
        old, self.state = self.state, new
        return Transition(old, new, reason, open_s, self.failures)
