"""What of the scheduler core survives a restart: plain records, exported and restored by the core.

Persisted: the program table (ids, parents, token totals and whether they are estimates, turns,
admission epochs, status, lifecycle, placement and last placement, the paused queue's order, the
aging quantum, timestamps), the admitted turns (tickets) that were running, the tail-protection
history (turn counts of the last released programs) and the totals. Not persisted, because the
next tick recomputes them: pause marks and soft-demotion windows. Reconstructed from outside: the
capacity snapshot (re-streamed by the capacity service) and the pause policy's online estimates
(tool time, prefill rate), which start again from their priors.

Times are the core's monotonic seconds of the process that exported them; the shell converts them
to wall-clock time when it stores them and back when it loads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.scheduler.core.model import Lifecycle, ReplicaKey, Status

STATE_FORMAT = 1
"""Version of the records' layout; a store written by a newer format is refused, not misread."""

TOTAL_NAMES = (
    "pauses_total",
    "resumes_total",
    "forced_resumes_total",
    "marks_total",
    "expired_total",
    "released_total",
    "admissions_total",
    "admissions_cancelled_total",
    "completes_ignored_total",
    "tickets_expired_total",
)


@dataclass(frozen=True, slots=True)
class ProgramRecord:
    session_id: str
    parent_session_id: str
    created_at: float
    seq: int
    status: Status
    lifecycle: Lifecycle
    token_total: int
    tokens_estimated: bool
    replica: ReplicaKey | None
    last_replica: ReplicaKey | None
    pause_protected_until: float
    admission_epoch: int
    turns: int
    last_activity: float
    acting_since: float | None
    paused_since: float | None
    paused_seq: int | None  # position in the global paused queue (PAUSED programs only)


@dataclass(frozen=True, slots=True)
class TicketRecord:
    """An admitted turn not yet completed. `session_id` empty = a passthrough request."""

    request_id: str
    session_id: str
    epoch: int
    started_at: float
    was_paused: bool = False
    tokens: int = 0  # passthrough: its charge
    replica: ReplicaKey | None = None  # passthrough: where it was bound
    # Its router reported that the client received something: the turn counts whatever happens next.
    confirmed: bool = False


@dataclass(frozen=True, slots=True)
class CoreMeta:
    next_seq: int = 0
    next_pause_seq: int = 0
    released_turns: tuple[int, ...] = ()
    totals: dict[str, int] = field(default_factory=dict)
    format: int = STATE_FORMAT


@dataclass(frozen=True, slots=True)
class CoreState:
    programs: tuple[ProgramRecord, ...] = ()
    tickets: tuple[TicketRecord, ...] = ()
    meta: CoreMeta = field(default_factory=CoreMeta)


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since the previous `take_changes`: ids to write again (or delete, when the
    program or ticket no longer exists)."""

    programs: frozenset[str] = frozenset()
    tickets: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.programs or self.tickets)
