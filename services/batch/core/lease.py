"""The drain lease as the batch service holds it, and what it reports back. Pure: the clock is passed in."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DrainLease:
    """The planner's lease: at most `max_admission_rps` batch requests per second until `valid_until_mono_s`.

    Expiry is judged on this process's monotonic clock (`from_wire` converts the planner's wall-clock
    expiry once, on receipt), so a later wall-clock jump cannot extend it. 0 rps is an explicit pause."""

    pool_id: str
    max_admission_rps: float
    valid_until_mono_s: float
    decision_id: str = ""

    def rate_at(self, now_mono_s: float) -> float:
        """The admissible rate now: an expired lease is zero."""
        return self.max_admission_rps if now_mono_s < self.valid_until_mono_s else 0.0

    def valid_at(self, now_mono_s: float) -> bool:
        return now_mono_s < self.valid_until_mono_s

    @classmethod
    def from_wire(
        cls,
        pool_id: str,
        max_admission_rps: float,
        valid_until_unix_ms: int,
        decision_id: str,
        *,
        now_wall_s: float,
        now_mono_s: float,
    ) -> "DrainLease":
        """The lease as received: its remaining validity (wall clock, as published) moved onto the monotonic
        clock. A rate that is not a finite number >= 0 is read as a pause; an expired lease stays expired."""
        rate = max_admission_rps if math.isfinite(max_admission_rps) and max_admission_rps >= 0 else 0.0
        remaining_s = valid_until_unix_ms / 1000.0 - now_wall_s
        return cls(pool_id, rate, now_mono_s + remaining_s, decision_id)


@dataclass(frozen=True)
class DispatchFeedback:
    """What the dispatcher reports to the planner: backlog, in flight, actual send rate, the cap it applied."""

    queued_requests: int
    inflight_requests: int
    actual_dispatch_rps: float
    applied_max_admission_rps: float | None
    """None = no valid lease held (missing or expired); 0.0 = an explicit pause."""
