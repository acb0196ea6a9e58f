"""Domain <-> protobuf for the scheduler, and validation of what callers send.

Protobuf types stop here: the core sees `ReplicaKey`, `TurnOutcome` and plain values. Core times
are monotonic seconds; `WallTime` turns them into wall-clock timestamps for other processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from bandmaster.capacity.v1 import capacity_pb2 as cap_pb
from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.common.clock import Clock
from services.common.web.session_ids import MAX_ID_BYTES, id_too_long, printable_ascii
from services.scheduler.core import (
    Band,
    CapacitySnapshot,
    Decision,
    EventKind,
    Lifecycle,
    ProgramEvent,
    ProgramView,
    ReplicaCapacity,
    ReplicaKey,
    ReplicaStats,
    Stats,
    Status,
    TurnOutcome,
)
from services.scheduler.core.defaults import KvRouterConfig

_INT32_MAX = 2**31 - 1
MAX_TOKENS = _INT32_MAX
"""Bound on every token count a caller sends (no context is two billion tokens long); sums of them
stay far inside int64, so no figure the scheduler reports can overflow its proto field."""
MAX_TTFT_SECONDS = 86_400.0


class InvalidArgument(ValueError):
    """A request field breaks the protocol (gRPC: INVALID_ARGUMENT)."""


# ---------------------------------------------------------------------- validation


def validate_session_id(value: str, field_name: str = "session_id") -> str:
    """Normalised ids only: trimmed, at most 256 bytes of printable ASCII. Empty is allowed (passthrough)."""
    if value != value.strip():
        raise InvalidArgument(f"{field_name} must be trimmed (no leading or trailing whitespace)")
    _check_printable(value, field_name)
    return value


def validate_request_id(value: str, field_name: str = "request_id") -> str:
    if not value:
        raise InvalidArgument(f"{field_name} is required")
    _check_printable(value, field_name)
    return value


def validate_tokens(**counts: int) -> None:
    for name, value in counts.items():
        if value < 0:
            raise InvalidArgument(f"{name} must be >= 0, got {value}")
        if value > MAX_TOKENS:
            raise InvalidArgument(f"{name} must be <= {MAX_TOKENS}, got {value}")


def validate_ttft(value: float) -> float:
    if not (0.0 <= value <= MAX_TTFT_SECONDS):  # also false for NaN
        raise InvalidArgument(f"ttft_seconds must be a finite number in [0, {MAX_TTFT_SECONDS:g}]")
    return value


def replica_from_fields(worker_id: str, dp_rank: int, field_name: str = "worker_id") -> ReplicaKey | None:
    """(worker_id, dp_rank) -> ReplicaKey; empty worker_id means "unknown"."""
    if dp_rank < 0:
        raise InvalidArgument(f"dp_rank must be >= 0, got {dp_rank}")
    if not worker_id:
        return None
    _check_printable(worker_id, field_name)
    return ReplicaKey(worker_id, dp_rank)


def outcome_from_proto(value: int) -> TurnOutcome:
    if value in (pb.TURN_OUTCOME_UNSPECIFIED, pb.TURN_OUTCOME_OK):
        return TurnOutcome.OK
    if value == pb.TURN_OUTCOME_CANCELLED:
        return TurnOutcome.CANCELLED
    if value == pb.TURN_OUTCOME_FAILED:
        return TurnOutcome.FAILED
    if value == pb.TURN_OUTCOME_NOT_STARTED:
        return TurnOutcome.NOT_STARTED
    raise InvalidArgument(f"outcome {value} is not a TurnOutcome")


def _check_printable(value: str, field_name: str) -> None:
    if id_too_long(value):
        raise InvalidArgument(f"{field_name} must be at most {MAX_ID_BYTES} bytes")
    if not printable_ascii(value):
        raise InvalidArgument(f"{field_name} must be printable ASCII")


# ---------------------------------------------------------------------- capacity in


def capacity_from_proto(snapshot: cap_pb.WorkersSnapshot) -> CapacitySnapshot:
    """HEALTHY workers' replicas only; everyone else contributes no budget. A replica reports cached
    tokens unless its worker's card says cache reports are off (an older capacity service, which
    sends no degradations, is taken at its word)."""
    replicas = tuple(
        ReplicaCapacity(
            r.worker_id or w.worker_id,
            r.dp_rank,
            r.retention_tokens,
            max(0, r.max_programs),
            cache_report=cap_pb.DEGRADATION_CACHE_REPORT_OFF not in w.card.degraded,
        )
        for w in snapshot.workers
        if w.health == cap_pb.WORKER_HEALTH_HEALTHY
        for r in w.replicas
    )
    return CapacitySnapshot(snapshot.version, replicas)


# ---------------------------------------------------------------------- scheduler out


@dataclass(frozen=True)
class WallTime:
    """Maps the core's monotonic seconds onto wall-clock timestamps (read both clocks once per call)."""

    offset_s: float

    @classmethod
    def now(cls, clock: Clock) -> "WallTime":
        return cls(clock.wall() - clock.monotonic())

    def stamp(self, target, monotonic_s: float) -> None:
        target.FromNanoseconds(int((monotonic_s + self.offset_s) * 1e9))


_STATUS = {Status.REASONING: pb.PROGRAM_STATUS_REASONING, Status.ACTING: pb.PROGRAM_STATUS_ACTING}
_LIFECYCLE = {Lifecycle.ACTIVE: pb.LIFECYCLE_ACTIVE, Lifecycle.PAUSED: pb.LIFECYCLE_PAUSED}
_BAND = {Band.NORMAL: pb.BAND_NORMAL, Band.SOFT_DEMOTE: pb.BAND_SOFT_DEMOTE, Band.PAUSE: pb.BAND_PAUSE}
_EVENT = {
    EventKind.ADMITTED: pb.EVENT_KIND_ADMITTED,
    EventKind.PAUSED: pb.EVENT_KIND_PAUSED,
    EventKind.MARKED: pb.EVENT_KIND_MARKED,
    EventKind.SOFT_DEMOTED: pb.EVENT_KIND_SOFT_DEMOTED,
    EventKind.RESUMED: pb.EVENT_KIND_RESUMED,
    EventKind.FORCED_RESUME: pb.EVENT_KIND_FORCED_RESUME,
    EventKind.RELEASED: pb.EVENT_KIND_RELEASED,
    EventKind.EXPIRED: pb.EVENT_KIND_EXPIRED,
}
_EVENT_FROM_PROTO = {value: kind for kind, value in _EVENT.items()}


def event_kinds_from_proto(values) -> frozenset[EventKind]:
    """A WatchEvents request's `exclude_kinds` as core kinds (UNSPECIFIED and values this scheduler does not
    know name nothing it sends, so they exclude nothing)."""
    return frozenset(_EVENT_FROM_PROTO[v] for v in values if v in _EVENT_FROM_PROTO)


def decision_to_proto(d: Decision, lease_ttl_seconds: float = 0.0) -> pb.AdmitResponse:
    replica = d.replica
    return pb.AdmitResponse(
        worker_id=replica.worker_id if replica else "",
        dp_rank=replica.dp_rank if replica else 0,
        pinned=replica is not None,
        priority=d.priority,
        held_seconds=max(0.0, d.held_seconds),
        forced_resume=d.forced_resume,
        admission_epoch=d.admission_epoch,
        was_paused=d.was_paused,
        was_soft_demoted=d.was_soft_demoted,
        priority_seconds=d.priority_seconds,
        lease_ttl_seconds=lease_ttl_seconds,
    )


def program_to_proto(view: ProgramView, wall: WallTime) -> pb.Program:
    msg = pb.Program(
        session_id=view.session_id,
        parent_session_id=view.parent_session_id,
        status=_STATUS[view.status],
        lifecycle=_LIFECYCLE[view.lifecycle],
        token_total=view.token_total,
        tokens_estimated=view.tokens_estimated,
        worker_id=view.replica.worker_id if view.replica else "",
        dp_rank=view.replica.dp_rank if view.replica else 0,
        marked=view.marked,
        soft_demoted=view.soft_demoted,
        turns=view.turns,
        children=list(view.children),
    )
    wall.stamp(msg.created_at, view.created_at)
    wall.stamp(msg.last_activity, view.last_activity)
    if view.paused_since is not None:
        wall.stamp(msg.paused_since, view.paused_since)
    return msg


def replica_stats_to_proto(r: ReplicaStats) -> pb.ReplicaUtilization:
    return pb.ReplicaUtilization(
        worker_id=r.replica.worker_id,
        dp_rank=r.replica.dp_rank,
        retention_tokens=r.retention_tokens,
        used_tokens=r.used_tokens,
        used_decayed_tokens=r.used_decayed_tokens,
        utilization=r.utilization,
        band=_BAND[r.band],
        active_programs=min(r.active_programs, _INT32_MAX),
        passthrough_requests=min(r.passthrough_requests, _INT32_MAX),
        resident_programs=min(r.resident_programs, _INT32_MAX),
        max_programs=min(r.max_programs, _INT32_MAX),
    )


def event_to_proto(e: ProgramEvent, wall: WallTime) -> pb.ProgramEvent:
    msg = pb.ProgramEvent(
        kind=_EVENT[e.kind],
        session_id=e.session_id,
        worker_id=e.replica.worker_id if e.replica else "",
        dp_rank=e.replica.dp_rank if e.replica else 0,
        tokens=e.tokens,
        reason=e.reason,
    )
    wall.stamp(msg.at, e.at)
    return msg


def stats_to_proto(s: Stats) -> pb.Stats:
    return pb.Stats(
        programs_active=s.programs_active,
        programs_paused=s.programs_paused,
        programs_reasoning=s.programs_reasoning,
        programs_acting=s.programs_acting,
        pauses_total=s.pauses_total,
        resumes_total=s.resumes_total,
        forced_resumes_total=s.forced_resumes_total,
        waiting_admissions=s.waiting_admissions,
        replicas=[replica_stats_to_proto(r) for r in s.replicas],
        capacity_version=s.capacity_version,
        marks_total=s.marks_total,
        expired_total=s.expired_total,
        released_total=s.released_total,
        admissions_total=s.admissions_total,
        admissions_cancelled_total=s.admissions_cancelled_total,
        passthrough_in_flight=s.passthrough_in_flight,
        completes_ignored_total=s.completes_ignored_total,
        tickets_expired_total=s.tickets_expired_total,
        tickets_in_flight=min(s.tickets_in_flight, _INT32_MAX),
    )


def router_config_to_proto(kv: KvRouterConfig) -> pb.RouterConfig:
    return pb.RouterConfig(
        router_temperature=kv.router_temperature,
        kv_overlap_score_weight=kv.kv_overlap_score_weight,
        use_kv_events=kv.use_kv_events,
        router_track_active_blocks=kv.router_track_active_blocks,
        router_track_output_blocks=kv.router_track_output_blocks,
        router_track_prefill_tokens=kv.router_track_prefill_tokens,
        router_ttl_secs=kv.router_ttl_secs,
        router_block_size=kv.router_block_size,
    )
