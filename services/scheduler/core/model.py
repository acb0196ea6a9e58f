"""Domain types of the scheduler core: replicas, capacity snapshots, programs, events and log records.

Everything here is plain data. Times are monotonic seconds passed in by the caller; the shell
turns them into wall-clock timestamps when it builds protos.
"""

from __future__ import annotations

import enum
import logging
import math
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Iterable, Iterator, NamedTuple


class ReplicaKey(NamedTuple):
    """One schedulable unit: a worker and one of its data-parallel ranks."""

    worker_id: str
    dp_rank: int

    def label(self) -> str:
        return f"{self.worker_id}:{self.dp_rank}"


class Status(enum.Enum):
    REASONING = "reasoning"  # a turn is in flight or waiting for admission
    ACTING = "acting"  # the last turn finished; the agent is in a tool


class Lifecycle(enum.Enum):
    ACTIVE = "active"
    PAUSED = "paused"


class Band(enum.Enum):
    NORMAL = "normal"
    SOFT_DEMOTE = "soft_demote"
    PAUSE = "pause"


class TurnOutcome(enum.Enum):
    OK = "ok"
    CANCELLED = "cancelled"  # the client went away
    FAILED = "failed"  # the worker failed
    NOT_STARTED = "not_started"  # answered, never sent to a worker: the admission is rolled back


class EventKind(enum.Enum):
    ADMITTED = "admitted"
    PAUSED = "paused"
    MARKED = "marked"
    SOFT_DEMOTED = "soft_demoted"
    RESUMED = "resumed"
    FORCED_RESUME = "forced_resume"
    RELEASED = "released"
    EXPIRED = "expired"


class Verdict(enum.Enum):
    PLACED = "placed"  # go now; `replica` None means "any worker" (router picks by KV cost)
    WAIT = "wait"  # the program is in the paused queue; a later tick resolves the admission


@dataclass(frozen=True)
class ReplicaCapacity:
    """One replica of the capacity snapshot (built by the shell from capacity.v1.Replica)."""

    worker_id: str
    dp_rank: int
    retention_tokens: int
    max_programs: int = 0  # 0 = no limit published
    cache_report: bool = True
    """The worker reports cached prompt tokens on every completion (SGLang --enable-cache-report).
    False: a Complete's cached_tokens of 0 means "not reported", not "nothing was cached"."""

    @property
    def key(self) -> ReplicaKey:
        return ReplicaKey(self.worker_id, self.dp_rank)


@dataclass(frozen=True)
class CapacitySnapshot:
    """The capacity service's view at `version`. Replicas with no retention budget are ignored."""

    version: int
    replicas: tuple[ReplicaCapacity, ...] = ()


@dataclass(slots=True)
class Program:
    """One agent program. Mutable, owned by the scheduler core; callers see `ProgramView`s."""

    session_id: str
    parent_session_id: str
    created_at: float
    seq: int  # creation order; breaks ties like the reference's table insertion order
    status: Status = Status.REASONING
    lifecycle: Lifecycle = Lifecycle.ACTIVE
    token_total: int = 0
    tokens_estimated: bool = True  # True until a Complete reports real counts
    replica: ReplicaKey | None = None
    last_replica: ReplicaKey | None = None  # where its KV last lived; preferred on resume
    marked: bool = False
    soft_demoted_until: float = 0.0
    pause_protected_until: float = 0.0  # resumed by aging: not paused again for pressure before this
    admission_epoch: int = 0
    turns: int = 0
    last_activity: float = 0.0
    acting_since: float | None = None
    paused_since: float | None = None

    def snapshot(self) -> Program:
        """A copy of the row (what `dataclasses.replace(self)` gives): an admission keeps one before
        and one after, to roll back to. One C call reads every field, where `replace` looks the
        fields up anew each time (about 4x the cost)."""
        return Program(*_PROGRAM_VALUES(self))


# The values of every field of a `Program`, in order (all are `__init__` parameters): `Program.snapshot`.
_PROGRAM_VALUES = attrgetter(*(f.name for f in fields(Program)))


@dataclass(frozen=True)
class ProgramView:
    session_id: str
    parent_session_id: str
    status: Status
    lifecycle: Lifecycle
    token_total: int
    tokens_estimated: bool
    replica: ReplicaKey | None
    marked: bool
    soft_demoted: bool
    turns: int
    admission_epoch: int
    created_at: float
    last_activity: float
    paused_since: float | None
    children: tuple[str, ...]


class ProgramEvent(NamedTuple):
    """One transition of one program, for WatchEvents. A named tuple rather than a frozen dataclass:
    a tick builds one per pause, resume and mark (thousands at fleet size), and a tuple is built
    several times faster."""

    kind: EventKind
    session_id: str
    replica: ReplicaKey | None
    tokens: int
    at: float
    reason: str = ""  # e.g. "pressure", "marked", "admission_full", "final", "idle_ttl"


class LogRecord(NamedTuple):
    """A log line the shell emits verbatim (`logger.log(level, message)`). The per-transition DEBUG
    lines are not records: `transition_logs` renders them from the events."""

    level: int
    message: str


def nearest_rank(n: int, q: float) -> int:
    """The index of the q-quantile among n sorted values (n > 0), by nearest rank: the value below which
    a fraction q of them lies, the largest at q = 1. The one rule of the core's learnt quantiles (tail
    protection, the prefill rate, the pause margin)."""
    return min(n - 1, math.floor(q * n))


def transition_logs(events: Iterable[ProgramEvent]) -> Iterator[LogRecord]:
    """The reference's DEBUG line for each pause and resume among `events` ("Paused program ...",
    "Resumed program ... -> worker=..."), for a shell that logs DEBUG. They are rendered from the
    events rather than recorded beside them: a tick at fleet size pauses and resumes thousands of
    programs, and a second record of the same fields for each doubled what the tick allocates (and
    what the garbage collector then walks) for lines that are not logged at the default level."""
    for e in events:
        if e.kind is EventKind.PAUSED:
            yield LogRecord(logging.DEBUG, "Paused program %s (tokens=%d)" % (e.session_id, e.tokens))
        elif e.kind is EventKind.RESUMED or e.kind is EventKind.FORCED_RESUME:
            worker = e.replica.worker_id if e.replica else "any"
            yield LogRecord(
                logging.DEBUG, "Resumed program %s -> worker=%s (tokens=%d)" % (e.session_id, worker, e.tokens)
            )


@dataclass(frozen=True)
class Decision:
    """The answer to one admission (immediate, or resolved later by a tick)."""

    request_id: str
    session_id: str  # empty for passthrough
    verdict: Verdict
    replica: ReplicaKey | None  # None = any worker
    priority: int  # SGLang `priority` (larger first)
    priority_seconds: float  # the reference's priority_jump before mapping
    admission_epoch: int
    was_paused: bool = False
    was_soft_demoted: bool = False
    forced_resume: bool = False
    held_seconds: float = 0.0
    program_gone: bool = False  # released or expired while the admission waited

    @property
    def pinned(self) -> bool:
        return self.replica is not None


@dataclass(frozen=True)
class ReplicaStats:
    replica: ReplicaKey
    retention_tokens: int
    max_programs: int
    used_tokens: int
    used_decayed_tokens: int
    utilization: float
    band: Band
    active_programs: int  # REASONING programs placed here (turns in flight)
    resident_programs: int  # every ACTIVE program placed here
    passthrough_requests: int


@dataclass(frozen=True)
class Stats:
    programs_active: int
    programs_paused: int
    programs_reasoning: int
    programs_acting: int
    pauses_total: int
    resumes_total: int
    forced_resumes_total: int
    marks_total: int
    expired_total: int
    released_total: int
    admissions_total: int
    admissions_cancelled_total: int
    waiting_admissions: int
    passthrough_in_flight: int
    capacity_version: int
    replicas: tuple[ReplicaStats, ...]
    completes_ignored_total: int = 0  # Complete for a request id with no ticket: ignored, table unchanged
    tickets_in_flight: int = 0  # admitted turns not yet completed (held ones included)
    tickets_expired_total: int = 0  # turns ended because their lease lapsed
    dispatched_while_paused_total: int = 0  # dispatched Admits (router fast path) of a program paused meanwhile


@dataclass(frozen=True)
class Effects:
    """What a call changed, for the shell to publish: events (WatchEvents), log lines, and
    admissions that the call resolved (held Admit RPCs to answer)."""

    events: tuple[ProgramEvent, ...] = ()
    logs: tuple[LogRecord, ...] = ()
    resolutions: tuple[Decision, ...] = ()


@dataclass
class Acc:
    """The effects collected during one call of the core, frozen into `Effects` at its end."""

    events: list[ProgramEvent] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    resolutions: list[Decision] = field(default_factory=list)

    def effects(self) -> Effects:
        return Effects(tuple(self.events), tuple(self.logs), tuple(self.resolutions))


@dataclass(frozen=True)
class AdmitResult:
    decision: Decision
    effects: Effects = field(default_factory=Effects)


@dataclass(frozen=True)
class TickResult:
    events: tuple[ProgramEvent, ...]
    logs: tuple[LogRecord, ...]
    resolutions: tuple[Decision, ...]
    replicas: tuple[ReplicaStats, ...]
    paused: int
    marked: int
    resumed: int
    forced: int
    expired: int


DEBUG = logging.DEBUG
INFO = logging.INFO
WARNING = logging.WARNING
