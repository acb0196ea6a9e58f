"""Observation and decision types of one planner tick.

Every observation carries the monotonic time it was taken at (`observed_at_s`, the planner
process's monotonic clock), so freshness is judged without trusting the wall clock. Deadlines are
wall-clock seconds (they come from people and other processes). Every optional field distinguishes
*unknown* (`None`) from *zero*: a missing observation is never read as idle.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

TERMINAL_JOB_STATUSES = frozenset(
    {"canceled", "cancelled", "cancelling", "completed", "expired", "failed", "finalizing"}
)


def _finite_nonneg(value: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _count(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _ident(value: str, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class JobDemand:
    """One batch job's progress as the registry (or an external gateway) reports it."""

    job_id: str
    status: str
    total_requests: int
    completed_requests: int
    failed_requests: int
    deadline_wall_s: float | None
    """Absolute wall-clock deadline; None = best effort (no deadline)."""
    observed_at_s: float
    work_class: str = "default"
    pool_id: str = "default"

    def __post_init__(self) -> None:
        _ident(self.job_id, "job_id")
        _ident(self.pool_id, "pool_id")
        _ident(self.work_class, "work_class")
        for name in ("total_requests", "completed_requests", "failed_requests"):
            _count(getattr(self, name), name)
        if self.completed_requests + self.failed_requests > self.total_requests:
            raise ValueError("completed_requests + failed_requests must be <= total_requests")

    @property
    def remaining_requests(self) -> int:
        return self.total_requests - self.completed_requests - self.failed_requests

    @property
    def active(self) -> bool:
        return self.remaining_requests != 0 and self.status.strip().lower() not in TERMINAL_JOB_STATUSES


@dataclass(frozen=True)
class OnlineTraffic:
    """Online (non-batch) traffic of the pool: offered rate, requests in flight, TTFT."""

    observed_at_s: float
    offered_rps: float
    active_requests: int | None = None
    """None = the gauge is unknown (blocks the idle target); 0 = observed idle."""
    ttft_s: float | None = None
    """Recent time to first token, when a source reports it; diagnostic."""

    def __post_init__(self) -> None:
        _finite_nonneg(self.offered_rps, "offered_rps")
        if self.active_requests is not None:
            _count(self.active_requests, "active_requests")
        if self.ttft_s is not None:
            _finite_nonneg(self.ttft_s, "ttft_s")


@dataclass(frozen=True)
class DispatcherFeedback:
    """What the batch dispatcher reports: backlog, in flight, actual rate and the cap it applied."""

    observed_at_s: float
    window_s: float
    queued_requests: int
    inflight_requests: int
    actual_dispatch_rps: float
    applied_max_admission_rps: float | None
    """None = no valid lease seen by the dispatcher; 0.0 = an explicit pause."""

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError("window_s must be > 0")
        _count(self.queued_requests, "queued_requests")
        _count(self.inflight_requests, "inflight_requests")
        _finite_nonneg(self.actual_dispatch_rps, "actual_dispatch_rps")
        if self.applied_max_admission_rps is not None:
            _finite_nonneg(self.applied_max_admission_rps, "applied_max_admission_rps")


@dataclass(frozen=True)
class Inventory:
    """Worker replicas of the pool.

    `expected` is the verified desired count when the fleet is stable (None while a change is in
    flight or unverified). `pending` > 0 only for verified start-up capacity (replicas that were
    asked for and are starting, nothing else moving); then ready + pending is the desired count.
    """

    observed_at_s: float
    ready: int
    expected: int | None
    scaling_in_progress: bool = False
    pending: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.ready, bool) or not isinstance(self.ready, int):
            raise ValueError("ready must be an integer")
        if self.expected is not None:
            _count(self.expected, "expected")
        _count(self.pending, "pending")

    @property
    def startup_in_progress(self) -> bool:
        return self.pending > 0

    @property
    def signature(self) -> tuple:
        return (self.ready, self.expected, self.scaling_in_progress, self.pending)


@dataclass(frozen=True)
class ReplicaLoad:
    """One engine's load as the capacity service last saw it (for reactive load scaling)."""

    worker_id: str
    running_requests: int
    queued_requests: int
    token_usage: float
    """KV usage fraction of the GPU pool, 0..1 (SGLang's token_usage)."""


@dataclass(frozen=True)
class ProgramSignal:
    """The scheduler's view: paused programs and retention utilisation of the replicas."""

    observed_at_s: float
    paused_programs: int
    longest_pause_s: float | None
    """How long the longest-paused program has been paused; None when none is paused."""
    utilization: float | None
    """Mean retention utilisation over replicas (used / retention tokens); None = no replicas."""
    replicas: int = 0


@dataclass(frozen=True)
class Observation:
    """One snapshot per tick. `jobs is None` means the job snapshot failed (fail closed)."""

    now_s: float
    """Monotonic time the snapshot completed (after the I/O)."""
    now_wall_s: float
    jobs: tuple[JobDemand, ...] | None
    traffic: OnlineTraffic | None = None
    feedback: DispatcherFeedback | None = None
    inventory: Inventory | None = None
    loads: tuple[ReplicaLoad, ...] | None = None
    programs: ProgramSignal | None = None
    errors: tuple[str, ...] = ()
    """Why optional sources are missing (diagnostic only)."""


class TargetKind(enum.Enum):
    SET = "SET"
    AT_LEAST = "AT_LEAST"
    AT_MOST = "AT_MOST"
    REJECT = "REJECT"


class Stage(enum.Enum):
    PROPOSE = "PROPOSE"
    RECONCILE = "RECONCILE"
    CONSTRAIN = "CONSTRAIN"


@dataclass(frozen=True)
class Opinion:
    """One source's opinion on the worker replica count, at one stage of the merge."""

    source: str
    stage: Stage
    kind: TargetKind
    replicas: int | None
    reason: str
    priority: int = 100
    """Smaller wins among SETs of one stage."""
    replayed: bool = False
    """A held-over result of a source not evaluated this tick (does not count as fresh evidence)."""


@dataclass(frozen=True)
class LeaseDecision:
    """What the tick wants published: a maximum admission rate valid for `duration_s` from publication."""

    pool_id: str
    max_admission_rps: float
    duration_s: float
    decision_id: str

    def __post_init__(self) -> None:
        _ident(self.pool_id, "pool_id")
        _ident(self.decision_id, "decision_id")
        _finite_nonneg(self.max_admission_rps, "max_admission_rps")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError("duration_s must be > 0")


@dataclass(frozen=True)
class Lease:
    """A published lease. `valid_until_unix_ms` is for other processes; this process judges
    expiry on its monotonic clock (`valid_until_mono_s`), so a wall-clock jump cannot extend it."""

    pool_id: str
    max_admission_rps: float
    valid_until_unix_ms: int
    decision_id: str
    writer_epoch: int
    writer_sequence: int
    valid_until_mono_s: float = field(default=0.0, compare=False)

    def rate_at(self, now_mono_s: float) -> float:
        """The admissible rate now: an expired lease is zero."""
        return self.max_admission_rps if now_mono_s < self.valid_until_mono_s else 0.0
