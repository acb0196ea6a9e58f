"""The scheduler core: program table, per-replica working sets, admission, tick.

Pure and synchronous: no I/O, no clock reads (`now` is monotonic seconds passed in), no locks
(the shell serialises calls). Every mutating call returns the `Effects` it caused (events for
WatchEvents, log records, and held admissions it resolved) so that a thin async shell can
publish them.

Accounting is kept incrementally through one function, `_recharge`: after any change to a
program, its old charge is removed from its replica and its current charge (w(p) + B when it is
ACTIVE and placed on a replica of the snapshot, else nothing) is added. The decayed (resume-side)
working set is time-dependent and is computed on demand.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from services.scheduler.core.errors import DuplicateRequest, MissingRequestId, RequestMismatch
from services.scheduler.core.model import (
    DEBUG,
    INFO,
    WARNING,
    AdmitResult,
    Band,
    CapacitySnapshot,
    Decision,
    Effects,
    EventKind,
    Lifecycle,
    LogRecord,
    Program,
    ProgramEvent,
    ProgramView,
    ReplicaCapacity,
    ReplicaKey,
    ReplicaStats,
    Stats,
    Status,
    TickResult,
    TurnOutcome,
    Verdict,
)
from services.scheduler.core.params import (
    TAIL_MIN_RELEASES,
    TAIL_WINDOW_RELEASES,
    ControlParams,
    to_sglang_priority,
)
from services.scheduler.core.policies import PauseContext, PausePolicy, make_pause_policy
from services.scheduler.core.state import (
    STATE_FORMAT,
    TOTAL_NAMES,
    Changes,
    CoreMeta,
    CoreState,
    ProgramRecord,
    TicketRecord,
)
from services.scheduler.core.weights import decayed_weight_tokens, raw_weight_tokens

# Exponent range kept in the running decayed sums (2^512 is far from float overflow).
_REBASE_EXPONENT = 512.0

_PROGRAM_FIELDS = tuple(f.name for f in dataclasses.fields(Program))


def normalise_session_id(session_id: str | None) -> str:
    """Trimmed id; empty means "no program" (passthrough)."""
    return (session_id or "").strip()


@dataclass(slots=True)
class _Turn:
    """An admitted (or waiting) turn, kept until Complete or cancellation."""

    request_id: str
    session_id: str
    program: Program  # identity check: a rollback never touches a replacement program
    epoch: int
    started_at: float
    before: Program | None  # field copy taken before the admission; None = created by it
    paused_seq_before: int | None
    waiting: bool = False
    was_paused: bool = False
    unpinned: bool = False  # answered "any" while placed: Bind may move the program
    lease_until: float | None = None  # placed and not renewed by then: ended as if Complete(CANCELLED)


@dataclass(slots=True)
class _Passthrough:
    request_id: str
    tokens: int
    replica: ReplicaKey | None
    started_at: float
    lease_until: float | None = None


@dataclass
class _Acc:
    """Effects collected during one call."""

    events: list[ProgramEvent] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    resolutions: list[Decision] = field(default_factory=list)

    def effects(self) -> Effects:
        return Effects(tuple(self.events), tuple(self.logs), tuple(self.resolutions))


class SchedulerCore:
    """The program table and control law. See docs/scheduler.md for the semantics."""

    def __init__(self, params: ControlParams | None = None, policy: PausePolicy | None = None, *,
                 ticket_lease_seconds: float = 0.0) -> None:
        self.params = params or ControlParams()
        self.policy = policy or make_pause_policy()
        if not (0.0 <= ticket_lease_seconds < math.inf):
            raise ValueError(f"ticket_lease_seconds must be finite and >= 0, got {ticket_lease_seconds}")
        # A placed turn (ticket) lives until its Complete, or until its lease lapses unrenewed (its
        # router died mid-turn): see renew_leases / expire_leases. 0 = tickets never expire.
        self.ticket_lease_seconds = ticket_lease_seconds
        # Optional policy hooks (see policies/base.py): a per-program pause-side weight,
        # observations of tool times and prefills, and a once-per-tick refresh of the
        # estimates behind that weight. A policy without them (threshold) gets the raw weight.
        self._policy_weight = getattr(self.policy, "weight_tokens", None)
        self._observe_tool = getattr(self.policy, "observe_tool", None)
        self._observe_prefill = getattr(self.policy, "observe_prefill", None)
        self._refresh_policy = getattr(self.policy, "refresh", None)
        self._programs: dict[str, Program] = {}
        self._paused: dict[str, int] = {}  # session id -> pause sequence (resume tie-break: oldest first)
        self._children: dict[str, dict[str, None]] = {}
        self._caps: dict[ReplicaKey, ReplicaCapacity] = {}
        self._capacity_version = 0
        # Incremental raw accounting, per replica of the snapshot.
        self._used: dict[ReplicaKey, int] = {}
        self._inflight: dict[ReplicaKey, int] = {}  # REASONING programs + passthrough requests
        self._resident: dict[ReplicaKey, dict[str, None]] = {}
        self._charge: dict[str, tuple[ReplicaKey, int, bool, int]] = {}
        # Resume-side (decayed) accounting in O(1) per replica: the ACTING part is
        # 2^(-(now - anchor)/tau) * sum(T_i * 2^((acting_since_i - anchor)/tau)).
        self._decay_base: dict[ReplicaKey, int] = {}  # REASONING tokens + every buffer + passthrough
        self._acting_sum: dict[ReplicaKey, float] = {}
        self._acting_anchor: dict[ReplicaKey, float] = {}
        self._acting_members: dict[ReplicaKey, dict[str, tuple[int, float, float]]] = {}
        self._pt_charge: dict[str, tuple[ReplicaKey, int]] = {}
        self._pt_count: dict[ReplicaKey, int] = {}
        # Turns and admissions.
        self._turns: dict[str, _Turn] = {}
        self._waiting: dict[str, dict[str, None]] = {}  # session id -> waiting request ids
        self._passthrough: dict[str, _Passthrough] = {}
        self._next_seq = 0
        self._next_pause_seq = 0
        # Tail protection: turn counts of recently released programs and the quantile of them
        # above which a live program counts as a tail program (None: protection not active).
        self._released_turns: deque[int] = deque(maxlen=TAIL_WINDOW_RELEASES)
        self._tail_turns: int | None = None
        # Totals (not table state: a rolled-back admission does not un-count them).
        self.pauses_total = 0
        self.resumes_total = 0
        self.forced_resumes_total = 0
        self.marks_total = 0
        self.expired_total = 0
        self.released_total = 0
        self.admissions_total = 0
        self.admissions_cancelled_total = 0
        self.completes_ignored_total = 0
        self.tickets_expired_total = 0
        # Durable state (core/state.py): change tracking is off until the shell turns it on.
        self._tracking = False
        self._dirty_programs: set[str] = set()
        self._dirty_tickets: set[str] = set()
        self._flushed_tickets: set[str] = set()
        # Restored programs and passthrough requests placed on a replica that no capacity snapshot
        # has shown since the restart: charged there when it appears (see _settle).
        self._unsettled: set[str] = set()
        self._unsettled_pt: set[str] = set()

    # ------------------------------------------------------------------ admission

    def admit(self, now: float, session_id: str, parent_session_id: str, estimated_prompt_tokens: int,
              request_id: str) -> AdmitResult:
        """Start a turn. PLACED: go now (replica None = any worker). WAIT: the program is in the
        paused queue; a later tick (resume) or `force_resume` resolves the admission."""
        if not request_id:
            raise MissingRequestId("request_id is required")
        if request_id in self._turns or request_id in self._passthrough:
            raise DuplicateRequest(f"request {request_id!r} is already in flight")
        acc = _Acc()
        self.admissions_total += 1
        estimate = max(0, int(estimated_prompt_tokens))
        sid = normalise_session_id(session_id)
        if not sid:
            self._passthrough[request_id] = _Passthrough(request_id, estimate, None, now, self._lease(now))
            return AdmitResult(Decision(request_id, "", Verdict.PLACED, None, 0, 0.0, 0), acc.effects())

        program = self._programs.get(sid)
        before = dataclasses.replace(program) if program is not None else None
        paused_seq_before = self._paused.get(sid)
        created = program is None
        if program is None:
            program = self._create(now, sid, parent_session_id)
        if (self._observe_tool is not None and program is not None and program.status is Status.ACTING
                and program.acting_since is not None):
            self._observe_tool(now - program.acting_since)  # the tool call that just ended
        program.turns += 1
        program.admission_epoch += 1
        if estimate > 0:
            program.token_total = estimate
            program.tokens_estimated = True
        program.status = Status.REASONING
        program.acting_since = None
        program.last_activity = now
        turn = _Turn(request_id, sid, program, program.admission_epoch, now, before, paused_seq_before)
        self._turns[request_id] = turn

        if program.lifecycle is Lifecycle.ACTIVE:
            if program.replica is not None and program.replica not in self._caps:
                program.replica = None  # stale pin: its replica left the snapshot
            if program.replica is None and self._caps:
                target = self._choose_admission_replica(now, program, gate=created and self._any_waiting())
                if target is not None:
                    self._place(program, target)
                elif created:
                    # Nothing fits a brand-new program: it queues before its first turn runs.
                    self._pause(now, program, "admission_full", acc)
                # else: a live session is never parked; it runs unpinned (bound later).
        self._recharge(program)

        if program.lifecycle is Lifecycle.PAUSED:
            turn.waiting = True
            turn.was_paused = True
            self._waiting.setdefault(sid, {})[request_id] = None
            decision = Decision(request_id, sid, Verdict.WAIT, None, 0, 0.0, program.admission_epoch,
                                was_paused=True)
            return AdmitResult(decision, acc.effects())
        decision = self._decision(now, turn, program)
        turn.lease_until = self._lease(now)
        acc.events.append(ProgramEvent(EventKind.ADMITTED, sid, program.replica, program.token_total, now))
        return AdmitResult(decision, acc.effects())

    def cancel_admission(self, now: float, request_id: str) -> Effects:
        """Roll back an admission (client gone while held, or before its turn started) to the exact
        table state it found. Idempotent. Skipped if the program was replaced or a later admission
        moved its epoch on (a later turn owns it)."""
        acc = _Acc()
        pt = self._passthrough.pop(request_id, None)
        if pt is not None:
            self._recharge_passthrough(request_id, None)
            return acc.effects()
        turn = self._turns.pop(request_id, None)
        if turn is None:
            return acc.effects()
        self.admissions_cancelled_total += 1
        self._drop_waiter(turn.session_id, request_id)
        program = self._programs.get(turn.session_id)
        if program is not turn.program:
            return acc.effects()
        if program.admission_epoch != turn.epoch:
            # A later admission of the same program captured its `before` after this one; it now
            # inherits ours, so cancelling it too restores the state before both (turns serialise).
            later = [t for t in self._turns.values() if t.program is program and t.epoch > turn.epoch]
            if later:
                successor = min(later, key=lambda t: t.epoch)
                successor.before = turn.before
                successor.paused_seq_before = turn.paused_seq_before
            return acc.effects()
        if turn.before is None:
            self._remove(program)
            retained = False
        else:
            for name in _PROGRAM_FIELDS:
                setattr(program, name, getattr(turn.before, name))
            self._paused.pop(program.session_id, None)
            if turn.paused_seq_before is not None:
                self._paused[program.session_id] = turn.paused_seq_before
            self._recharge(program)
            retained = True
        acc.logs.append(LogRecord(INFO, "thunderagent.program admission_cancelled program=%s retained=%s "
                                  "active=%d paused=%d" % (turn.session_id, retained,
                                                            len(self._programs) - len(self._paused),
                                                            len(self._paused))))
        return acc.effects()

    def bind_request(self, request_id: str, replica: ReplicaKey) -> bool:
        """Record the replica the router chose for an unpinned turn (passthrough, cold start, or a
        live session nothing could take). Admission placement stays authoritative."""
        if replica not in self._caps:
            return False
        pt = self._passthrough.get(request_id)
        if pt is not None:
            pt.replica = replica
            self._recharge_passthrough(request_id, pt)
            if self._tracking:
                self._dirty_tickets.add(request_id)
            return True
        turn = self._turns.get(request_id)
        if turn is None:
            return False
        program = self._programs.get(turn.session_id)
        if (program is not turn.program or program.admission_epoch != turn.epoch
                or program.lifecycle is not Lifecycle.ACTIVE):
            return False
        if program.replica is not None and not turn.unpinned:
            return False  # pinned by admission: placement stays authoritative
        if program.replica != replica:
            self._place(program, replica)
            self._recharge(program)
        return True

    def complete(self, now: float, session_id: str, request_id: str, replica: ReplicaKey | None,
                 prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
                 outcome: TurnOutcome = TurnOutcome.OK, ttft_s: float | None = None) -> Effects:
        """A turn ended: the program is at a tool boundary (ACTING). token_total becomes
        prompt + completion when the worker reported them. A marked program is paused here.
        `ttft_s` (dispatch to first token, when the caller knows it) feeds the policy's prefill
        estimate; the whole context stays resident whether or not it was cached.

        The ticket (the admitted turn) is authoritative: a request id with none (never admitted,
        already completed, expired, or still held) is ignored and counted, and never changes the
        table; a `session_id` other than the admitted one is a RequestMismatch."""
        acc = _Acc()
        turn = self._turns.get(request_id)
        sid = normalise_session_id(session_id)
        if request_id in self._passthrough:
            if sid:
                raise RequestMismatch(f"session_id {sid!r} does not match request {request_id!r} "
                                      "(admitted as a passthrough request)")
        elif turn is None or turn.waiting:
            self.completes_ignored_total += 1
            return acc.effects()
        elif sid and sid != turn.session_id:
            raise RequestMismatch(f"session_id {sid!r} does not match request {request_id!r} "
                                  f"(admitted for {turn.session_id!r})")
        if (self._observe_prefill is not None and ttft_s is not None and outcome is TurnOutcome.OK
                and prompt_tokens > cached_tokens >= 0):
            self._observe_prefill(int(prompt_tokens) - int(cached_tokens), float(ttft_s))
        pt = self._passthrough.pop(request_id, None)
        if pt is not None:
            self._recharge_passthrough(request_id, None)
            return acc.effects()
        assert turn is not None
        del self._turns[request_id]
        program = self._programs.get(turn.session_id)
        if program is not turn.program:
            return acc.effects()  # released (and perhaps re-created) meanwhile: nothing to account
        reported = max(0, int(prompt_tokens)) + max(0, int(completion_tokens))
        if reported > 0:
            program.token_total = reported
            program.tokens_estimated = False
        elif outcome is TurnOutcome.OK:
            program.tokens_estimated = False
        program.status = Status.ACTING
        program.acting_since = now
        program.last_activity = now
        if (program.lifecycle is Lifecycle.ACTIVE and program.replica is None
                and replica is not None and replica in self._caps):
            self._place(program, replica)  # its KV now lives where the turn ran
        if program.marked and program.lifecycle is Lifecycle.ACTIVE:
            program.marked = False
            self._pause(now, program, "marked", acc)
        self._recharge(program)
        return acc.effects()

    # ------------------------------------------------------------------ ticket leases

    def _lease(self, now: float) -> float | None:
        return now + self.ticket_lease_seconds if self.ticket_lease_seconds > 0 else None

    def renew_leases(self, now: float, request_ids: Iterable[str]) -> tuple[str, ...]:
        """Extend the lease of each named ticket to now + ticket_lease_seconds; return the ids that
        have no ticket (completed, expired, never admitted), which the caller may stop renewing. A
        held admission's ticket is known but has no lease: its Admit call is its liveness."""
        until = self._lease(now)
        unknown = []
        for rid in request_ids:
            ticket = self._turns.get(rid) or self._passthrough.get(rid)
            if ticket is None:
                unknown.append(rid)
            elif until is not None and not getattr(ticket, "waiting", False):
                ticket.lease_until = until
        return tuple(unknown)

    def expire_leases(self, now: float) -> Effects:
        """End every placed turn whose lease lapsed, as if Complete(outcome=CANCELLED, no counts)
        had arrived: the program goes to ACTING (paused there if marked) and its token_total stays
        the last known one, so idle expiry and pauses see it again. A passthrough request stops being
        charged. A lapsed ticket of an older turn (a newer one is in flight) is only dropped. A ticket
        placed by a resume starts its lease at the first call after it. O(tickets in flight)."""
        acc = _Acc()
        if self.ticket_lease_seconds <= 0:
            return acc.effects()
        for rid, pt in list(self._passthrough.items()):
            if pt.lease_until is None:
                pt.lease_until = self._lease(now)
            elif pt.lease_until <= now:
                del self._passthrough[rid]
                self._recharge_passthrough(rid, None)
                self.tickets_expired_total += 1
                acc.logs.append(LogRecord(INFO, "thunderagent.program lease_expired passthrough request=%s "
                                          "age=%.1fs" % (rid, now - pt.started_at)))
        for rid, turn in list(self._turns.items()):
            if turn.waiting:
                continue
            if turn.lease_until is None:
                turn.lease_until = self._lease(now)
                continue
            if turn.lease_until > now:
                continue
            self.tickets_expired_total += 1
            program = self._programs.get(turn.session_id)
            if (program is turn.program and program.admission_epoch == turn.epoch
                    and program.status is Status.REASONING):
                effects = self.complete(now, "", rid, None, 0, 0, 0, TurnOutcome.CANCELLED)
                acc.events.extend(effects.events)
                acc.logs.extend(effects.logs)
            else:
                del self._turns[rid]
            acc.logs.append(LogRecord(INFO, "thunderagent.program lease_expired program=%s request=%s age=%.1fs"
                                      % (turn.session_id, rid, now - turn.started_at)))
        return acc.effects()

    def release(self, now: float, session_id: str) -> tuple[bool, Effects]:
        """Final request: remove every trace of the program. Held admissions go unpinned."""
        acc = _Acc()
        program = self._programs.get(normalise_session_id(session_id))
        if program is None:
            return False, acc.effects()
        self._end(now, program, EventKind.RELEASED, "final", acc)
        self.released_total += 1
        self._note_release(program.turns)
        acc.logs.append(LogRecord(INFO, "thunderagent.program terminated program=%s remaining=%d"
                                  % (program.session_id, len(self._programs))))
        return True, acc.effects()

    def force_resume(self, now: float, request_id: str) -> Effects:
        """Resume the program a held admission waits on, ignoring thresholds (starvation bound).
        The shell may call this at the exact deadline; `tick` also does it for overdue waits."""
        acc = _Acc()
        turn = self._turns.get(request_id)
        if turn is not None and turn.waiting:
            program = self._programs.get(turn.session_id)
            if program is not None and program.lifecycle is Lifecycle.PAUSED:
                self._forced_resume(now, program, now - turn.started_at, acc)
        return acc.effects()

    # ------------------------------------------------------------------ tick

    def tick(self, now: float, snapshot: CapacitySnapshot | None = None) -> TickResult:
        """One control step: apply capacity -> expire idle -> soft demote -> resume -> forced
        resume -> pause. Cost O(P log P) in the number of programs P."""
        acc = _Acc()
        if snapshot is not None:
            self._apply_capacity(now, snapshot, acc)
        if self._refresh_policy is not None and self._refresh_policy():
            # The policy's estimates moved: re-charge the placed programs (their weight depends on them).
            for program in list(self._programs.values()):
                if program.session_id in self._charge:
                    self._recharge(program, touched=False)
        expired = self._expire_idle(now, acc)
        resumed = paused = marked = forced = 0
        if self._caps:
            self._soft_demote(now, acc)
            resumed = self._resume(now, acc)
        if self._caps and self.params.resume_aging_seconds > 0:
            resumed += self._resume_aged(now, acc)
        forced = self._force_overdue(now, acc)
        if self._caps:
            paused, marked = self._pause_over_threshold(now, acc)
        if resumed:
            acc.logs.append(LogRecord(INFO, "scheduler.tick resumed=%d still_paused=%d"
                                      % (resumed, len(self._paused))))
        return TickResult(tuple(acc.events), tuple(acc.logs), tuple(acc.resolutions),
                          self.replica_stats(now), paused, marked, resumed, forced, expired)

    def apply_capacity(self, now: float, snapshot: CapacitySnapshot) -> Effects:
        """Take a new capacity snapshot without running the control law (e.g. between ticks)."""
        acc = _Acc()
        self._apply_capacity(now, snapshot, acc)
        return acc.effects()

    def _apply_capacity(self, now: float, snapshot: CapacitySnapshot, acc: _Acc) -> None:
        caps: dict[ReplicaKey, ReplicaCapacity] = {}
        for replica in snapshot.replicas:
            # A replica without a positive budget is invisible, as in the reference.
            if replica.retention_tokens > 0 and replica.key not in caps:
                caps[replica.key] = replica
        removed = [key for key in self._caps if key not in caps]
        self._caps = caps
        self._capacity_version = snapshot.version
        for key in removed:
            unplaced = 0
            for sid in list(self._resident.get(key, {})):
                program = self._programs[sid]
                program.replica = None  # re-placed on its next turn
                if program.last_replica == key:
                    program.last_replica = None
                self._recharge(program)
                unplaced += 1
            for rid, pt in self._passthrough.items():
                if pt.replica == key:
                    pt.replica = None
                    self._recharge_passthrough(rid, pt)
            for table in (self._used, self._inflight, self._resident, self._pt_count, self._decay_base,
                          self._acting_sum, self._acting_anchor, self._acting_members):
                table.pop(key, None)
            acc.logs.append(LogRecord(INFO, "scheduler.capacity replica_removed worker=%s dp_rank=%s unplaced=%d"
                                      % (key.worker_id, key.dp_rank, unplaced)))
        for key in caps:
            self._used.setdefault(key, 0)
            self._inflight.setdefault(key, 0)
            self._resident.setdefault(key, {})
            self._pt_count.setdefault(key, 0)
            self._decay_base.setdefault(key, 0)
            self._acting_sum.setdefault(key, 0.0)
            self._acting_anchor.setdefault(key, 0.0)
            self._acting_members.setdefault(key, {})
        if self._unsettled or self._unsettled_pt:
            self._settle()

    def _expire_idle(self, now: float, acc: _Acc) -> int:
        ttl = self.params.program_idle_ttl_seconds
        if ttl <= 0:
            return 0
        due = [p for p in self._programs.values()
               if p.status is Status.ACTING and p.acting_since is not None
               and now - p.acting_since >= ttl and not self._waiting.get(p.session_id)]
        for program in due:
            idle_s = now - (program.acting_since or now)
            self._end(now, program, EventKind.EXPIRED, "idle_ttl", acc)
            self.expired_total += 1
            acc.logs.append(LogRecord(INFO, "thunderagent.program expired program=%s idle=%.0fs tokens=%d "
                                      "remaining=%d" % (program.session_id, idle_s, program.token_total,
                                                        len(self._programs))))
        return len(due)

    def _soft_demote(self, now: float, acc: _Acc) -> None:
        until = now + self.params.soft_demote_window_seconds
        for key in self._caps:
            if self._band(key) is not Band.SOFT_DEMOTE:
                continue
            for sid in self._resident[key]:
                program = self._programs[sid]
                if program.marked:
                    continue
                if program.soft_demoted_until <= now:
                    acc.events.append(ProgramEvent(EventKind.SOFT_DEMOTED, sid, key, program.token_total, now))
                program.soft_demoted_until = max(program.soft_demoted_until, until)

    def _resume(self, now: float, acc: _Acc) -> int:
        """Greedy best-fit-decreasing from the one global paused queue onto any replica.

        Resume-side headroom R(r) = floor(capacity * c) - used_d(r), c = max(0, theta_p - h), where
        used_d decays ACTING tokens by 2^(-idle/tau). A replica takes resumes while R(r) > B. A
        candidate needs req = token_total + B of headroom, and its raw charge must keep the replica
        below the pause threshold (so a resume never triggers a pause in the same tick).
        """
        if not self._paused:
            return 0
        p = self.params
        buffer = p.buffer_per_program_tokens
        c = p.resume_ceiling
        room: dict[ReplicaKey, int] = {}
        slots: dict[ReplicaKey, int | None] = {}
        used_d = self._decayed_used(now)
        for key, cap in self._caps.items():
            r = math.floor(cap.retention_tokens * c) - used_d[key]
            if r > buffer:
                room[key] = r
                slots[key] = (max(0, math.floor(cap.max_programs * c) - self._inflight[key])
                              if cap.max_programs > 0 else None)
        if not room:
            return 0
        candidates = sorted((self._programs[sid] for sid in self._paused),
                            key=lambda q: (self._resume_group(q), q.token_total, self._paused[q.session_id]))
        # Selection: a global knapsack over the summed headroom, in priority order.
        budget = sum(room.values())
        limited = all(s is not None for s in slots.values())
        total_slots = sum(s for s in slots.values() if s is not None) if limited else None
        selected: list[Program] = []
        cumulative = slots_needed = 0
        for program in candidates:
            req = program.token_total + buffer
            takes_slot = program.status is Status.REASONING
            if takes_slot and total_slots is not None and slots_needed >= total_slots:
                continue
            if cumulative + req <= budget:
                selected.append(program)
                cumulative += req
                slots_needed += takes_slot
        if not selected:
            return 0
        # Placement: largest first onto the replica with most headroom (its previous one if it fits).
        selected.sort(key=lambda q: q.token_total, reverse=True)
        min_req = min(q.token_total for q in selected) + buffer
        order = sorted(room, key=lambda k: room[k], reverse=True)
        resumed = 0
        for program in selected:
            if not order or min_req > room[order[0]]:
                break
            target = self._resume_target(program, order, room, slots)
            if target is None:
                continue
            req = program.token_total + buffer
            self._resume_onto(now, program, target, acc, forced=False, held_s=None)
            resumed += 1
            room[target] -= req
            if program.status is Status.REASONING and slots[target] is not None:
                slots[target] -= 1
            order.remove(target)
            if room[target] > buffer:
                # Keep the list sorted by headroom (descending); it is short (one entry per replica).
                idx = 0
                while idx < len(order) and room[order[idx]] >= room[target]:
                    idx += 1
                order.insert(idx, target)
        return resumed

    def _resume_target(self, program: Program, order: list[ReplicaKey], room: dict[ReplicaKey, int],
                       slots: dict[ReplicaKey, int | None]) -> ReplicaKey | None:
        req = program.token_total + self.params.buffer_per_program_tokens
        buffer = self.params.buffer_per_program_tokens
        takes_slot = program.status is Status.REASONING

        def fits(key: ReplicaKey) -> bool:
            cap = self._caps[key]
            return (req <= room[key]
                    and self._used[key] + self._weight(program, key) + buffer
                    < cap.retention_tokens * self.params.pause_threshold
                    and not (takes_slot and slots[key] == 0))

        last = program.last_replica
        if last is not None and last in room and last in order and fits(last):
            return last  # its KV may still be in the HiCache host tier there
        for key in order:
            if room[key] < req:
                break  # sorted by headroom: nothing further fits
            if fits(key):
                return key
        return None

    def _resume_aged(self, now: float, acc: _Acc) -> int:
        """Bound the wait of large programs that best-fit resume keeps passing over.

        Shortest-first resume starves a large paused program while smaller ones keep taking the
        room it needs; the reference bounds that only by forced resume after
        resume_timeout_seconds (30 min). Here a held admission that has waited
        resume_aging_seconds makes room: on the replica where pausing its ACTING programs frees
        the most (room_r = capacity * pause_threshold - (used - sum of unmarked ACTING weights)),
        those programs are paused shortest first until the aged one fits below the pause
        threshold, and it resumes there. Oldest first, at most one per replica per tick, so
        memory rotates between waiting programs instead of starving the largest; a program resumed
        this way is not paused for pressure for the next resume_aging_seconds / 2 (its quantum). A program that
        cannot fit even an emptied replica is resumed, pausing nobody, where the most is free: it
        thrashes wherever it runs, and holding it only adds latency.
        """
        age = self.params.resume_aging_seconds
        buffer = self.params.buffer_per_program_tokens
        threshold = self.params.pause_threshold
        aged: list[tuple[float, Program]] = []
        for sid, request_ids in self._waiting.items():
            program = self._programs[sid]
            if program.lifecycle is not Lifecycle.PAUSED:
                continue
            started = min(self._turns[rid].started_at for rid in request_ids)
            if now - started >= age:
                aged.append((started, program))
        aged.sort(key=lambda item: (item[0], item[1].seq))
        used_targets: set[ReplicaKey] = set()
        resumed = 0
        for started, program in aged:
            best: tuple[float, ReplicaKey, list[Program]] | None = None
            for key, cap in self._caps.items():
                if key in used_targets:
                    continue
                movable = sorted((q for sid in self._resident[key]
                                  if (q := self._programs[sid]).status is Status.ACTING and not q.marked
                                  and not self._is_tail(q)),
                                 key=lambda q: (q.token_total, q.seq))
                reclaimable = sum(self._weight(q, key) + buffer for q in movable)
                room = cap.retention_tokens * threshold - (self._used[key] - reclaimable)
                if best is None or room > best[0]:
                    best = (room, key, movable)
            if best is None:
                break
            room, target, movable = best
            need = self._weight(program, target) + buffer
            if need >= room:
                # It cannot fit even an emptied replica: pausing others would not help it, so it
                # goes where the most is free now and pauses nobody.
                free = [k for k in self._caps if k not in used_targets]
                target = max(free, key=lambda k: self._caps[k].retention_tokens - self._used[k])
                movable = []
            limit = self._caps[target].retention_tokens * threshold
            for victim in movable:
                if self._used[target] + need < limit:
                    break
                self._pause(now, victim, "aging", acc)
            used_targets.add(target)
            # Its quantum: a pause cycle may not send it straight back to the queue (a program too
            # large to share a replica would otherwise bounce between pause and aging every turn).
            program.pause_protected_until = now + age / 2
            self._resume_onto(now, program, target, acc, forced=False, held_s=now - started)
            acc.logs.append(LogRecord(INFO, "thunderagent.program resumed program=%s reason=aging waited=%.1fs "
                                      "worker=%s tokens=%d" % (program.session_id, now - started,
                                                               target.worker_id, program.token_total)))
            resumed += 1
        return resumed

    def _force_overdue(self, now: float, acc: _Acc) -> int:
        timeout = self.params.resume_timeout_seconds
        overdue: list[tuple[Program, float]] = []
        seen: set[str] = set()
        for sid, request_ids in self._waiting.items():
            for rid in request_ids:
                waited_s = now - self._turns[rid].started_at
                if waited_s >= timeout and sid not in seen:
                    overdue.append((self._programs[sid], waited_s))
                    seen.add(sid)
        for program, waited_s in overdue:
            if program.lifecycle is Lifecycle.PAUSED:
                self._forced_resume(now, program, waited_s, acc)
        return len(overdue)

    def _forced_resume(self, now: float, program: Program, waited_s: float, acc: _Acc) -> None:
        """Onto argmax(capacity - used_d) over the whole snapshot; None (any worker) when empty."""
        target = None
        if self._caps:
            used_d = self._decayed_used(now)
            target = max(self._caps, key=lambda k: self._caps[k].retention_tokens - used_d[k])
        acc.logs.append(LogRecord(WARNING, "Forced resume for %s after %.1fs" % (program.session_id, waited_s)))
        self.forced_resumes_total += 1
        self._resume_onto(now, program, target, acc, forced=True, held_s=waited_s)

    def _pause_over_threshold(self, now: float, acc: _Acc) -> tuple[int, int]:
        p = self.params
        buffer = p.buffer_per_program_tokens
        target_frac = min(p.pause_target, p.pause_threshold)
        paused_total = marked_total = 0
        for key, cap in self._caps.items():
            token_target = cap.retention_tokens * target_frac
            count_target = cap.max_programs * target_frac if cap.max_programs > 0 else None
            if self._band(key) is not Band.PAUSE:
                if self._used[key] <= token_target and (count_target is None or self._inflight[key] <= count_target):
                    self._unmark(key)  # pressure is gone: marks are not sticky
                continue
            programs = sorted((q for sid in self._resident[key]
                               if (q := self._programs[sid]).pause_protected_until <= now
                               and not self._is_tail(q)), key=lambda q: q.seq)
            before = self._used[key]
            plan = self.policy.plan(PauseContext(
                replica=key, programs=programs, used_tokens=before, target_tokens=token_target,
                reasoning_count=self._inflight[key], count_target=count_target, buffer_tokens=buffer,
                weight_tokens=lambda q, key=key: self._weight(q, key), now=now))
            for sid in plan.pause:
                program = self._programs[sid]
                if program.replica != key or program.status is not Status.ACTING or program.marked:
                    raise ValueError(f"pause policy {self.policy.name!r} chose an invalid program {sid!r}")
                self._pause(now, program, "pressure", acc)
                self._recharge(program)
            for sid in plan.mark:
                program = self._programs[sid]
                if program.replica != key or program.status is not Status.REASONING or program.marked:
                    raise ValueError(f"pause policy {self.policy.name!r} chose an invalid mark {sid!r}")
                program.marked = True
                self.marks_total += 1
                acc.events.append(ProgramEvent(EventKind.MARKED, sid, key, program.token_total, now, "pressure"))
            if plan.pause or plan.mark:
                acc.logs.append(LogRecord(INFO, "scheduler.tick worker=%s dp_rank=%s paused=%d marked=%d "
                                          "util=%.4f -> %.4f" % (key.worker_id, key.dp_rank, len(plan.pause),
                                                                 len(plan.mark), before / cap.retention_tokens,
                                                                 self._used[key] / cap.retention_tokens)))
            paused_total += len(plan.pause)
            marked_total += len(plan.mark)
        return paused_total, marked_total

    # ------------------------------------------------------------------ durable state

    def track_changes(self) -> None:
        """Start recording which programs and tickets change (for `take_changes`)."""
        self._tracking = True

    def take_changes(self) -> Changes:
        """The programs and tickets changed, created or removed since the last call (export each id:
        None means delete it). O(changed programs + tickets in flight)."""
        programs, self._dirty_programs = self._dirty_programs, set()
        current = set(self._turns)
        current.update(self._passthrough)
        tickets = (current ^ self._flushed_tickets) | (self._dirty_tickets & current)
        self._flushed_tickets = current
        self._dirty_tickets = set()
        return Changes(frozenset(programs), frozenset(tickets))

    def export_program(self, session_id: str) -> ProgramRecord | None:
        p = self._programs.get(session_id)
        if p is None:
            return None
        return ProgramRecord(p.session_id, p.parent_session_id, p.created_at, p.seq, p.status, p.lifecycle,
                             p.token_total, p.tokens_estimated, p.replica, p.last_replica, p.pause_protected_until,
                             p.admission_epoch, p.turns, p.last_activity, p.acting_since, p.paused_since,
                             self._paused.get(session_id))

    def export_ticket(self, request_id: str) -> TicketRecord | None:
        turn = self._turns.get(request_id)
        if turn is not None:
            return TicketRecord(request_id, turn.session_id, turn.epoch, turn.started_at, turn.was_paused)
        pt = self._passthrough.get(request_id)
        if pt is not None:
            return TicketRecord(request_id, "", 0, pt.started_at, tokens=pt.tokens, replica=pt.replica)
        return None

    def export_meta(self) -> CoreMeta:
        return CoreMeta(self._next_seq, self._next_pause_seq, tuple(self._released_turns),
                        {name: getattr(self, name) for name in TOTAL_NAMES})

    def export_state(self) -> CoreState:
        """Everything `restore` needs; also resets change tracking (the export is the new baseline)."""
        self.take_changes()
        tickets = [self.export_ticket(rid) for rid in (*self._turns, *self._passthrough)]
        return CoreState(tuple(self.export_program(sid) for sid in self._programs),  # type: ignore[misc]
                         tuple(t for t in tickets if t is not None), self.export_meta())

    def restore(self, now: float, state: CoreState) -> Effects:
        """Rebuild the table from `state` (times already on this process's clock) into an empty core.

        A turn whose program waited in the paused queue had its Admit call end with the old process,
        and a turn whose ticket was not stored cannot be completed: a REASONING program without a
        stored ticket for its current turn is at a tool boundary as far as anyone can tell, so it is
        ACTING from `now`. Stored tickets of running turns get a fresh lease: their router renews
        them, or they lapse. Placements wait for the capacity snapshot (see _settle)."""
        if self._programs or self._turns or self._passthrough:
            raise RuntimeError("restore needs an empty core")
        if state.meta.format > STATE_FORMAT:
            raise ValueError(f"state format {state.meta.format} is newer than this scheduler's ({STATE_FORMAT})")
        acc = _Acc()
        meta = state.meta
        next_seq, next_pause_seq = meta.next_seq, meta.next_pause_seq
        for rec in state.programs:
            program = Program(
                session_id=rec.session_id, parent_session_id=rec.parent_session_id, created_at=rec.created_at,
                seq=rec.seq, status=rec.status, lifecycle=rec.lifecycle, token_total=max(0, rec.token_total),
                tokens_estimated=rec.tokens_estimated, replica=rec.replica, last_replica=rec.last_replica,
                pause_protected_until=rec.pause_protected_until, admission_epoch=rec.admission_epoch,
                turns=rec.turns, last_activity=rec.last_activity, acting_since=rec.acting_since,
                paused_since=rec.paused_since)
            sid = program.session_id
            self._programs[sid] = program
            next_seq = max(next_seq, program.seq + 1)
            if program.lifecycle is Lifecycle.PAUSED:
                program.replica = None
                seq = rec.paused_seq if rec.paused_seq is not None else next_pause_seq
                self._paused[sid] = seq
                next_pause_seq = max(next_pause_seq, seq + 1)
            if program.parent_session_id:
                self._children.setdefault(program.parent_session_id, {})[sid] = None
            if program.replica is not None:
                self._unsettled.add(sid)
        self._next_seq, self._next_pause_seq = next_seq, next_pause_seq
        running: dict[str, int] = {}
        for rec in state.tickets:
            if not rec.session_id:
                self._passthrough[rec.request_id] = _Passthrough(rec.request_id, max(0, rec.tokens), rec.replica,
                                                                 rec.started_at, self._lease(now))
                if rec.replica is not None:
                    self._unsettled_pt.add(rec.request_id)
                continue
            program = self._programs.get(rec.session_id)
            if (program is None or rec.epoch > program.admission_epoch
                    or (program.lifecycle is Lifecycle.PAUSED and rec.epoch == program.admission_epoch)):
                continue  # its program is gone, or it was held: its Admit call ended with the old process
            self._turns[rec.request_id] = _Turn(
                rec.request_id, rec.session_id, program, rec.epoch, rec.started_at, dataclasses.replace(program),
                self._paused.get(rec.session_id), was_paused=rec.was_paused, lease_until=self._lease(now))
            running[rec.session_id] = max(running.get(rec.session_id, 0), rec.epoch)
        ended = 0
        for program in self._programs.values():
            if program.status is Status.REASONING and running.get(program.session_id) != program.admission_epoch:
                program.status = Status.ACTING
                program.acting_since = now
                ended += 1
        self._released_turns.extend(meta.released_turns[-TAIL_WINDOW_RELEASES:])
        self._refresh_tail()
        for name in TOTAL_NAMES:
            setattr(self, name, int(meta.totals.get(name, 0)))
        for program in self._programs.values():
            self._recharge(program)
        if self._caps:
            self._settle()
        acc.logs.append(LogRecord(INFO, "scheduler.recovered programs=%d paused=%d tickets=%d ended_turns=%d"
                                  % (len(self._programs), len(self._paused),
                                     len(self._turns) + len(self._passthrough), ended)))
        return acc.effects()

    def _settle(self) -> None:
        """Charge restored placements whose replica the snapshot now has; forget the settled ones."""
        for sid in list(self._unsettled):
            program = self._programs.get(sid)
            if program is None or program.replica is None:
                self._unsettled.discard(sid)
            elif program.replica in self._caps:
                self._unsettled.discard(sid)
                self._recharge(program, touched=False)
        for rid in list(self._unsettled_pt):
            pt = self._passthrough.get(rid)
            if pt is None or pt.replica is None:
                self._unsettled_pt.discard(rid)
            elif pt.replica in self._caps:
                self._unsettled_pt.discard(rid)
                self._recharge_passthrough(rid, pt)

    # ------------------------------------------------------------------ views

    def program(self, session_id: str) -> ProgramView | None:
        program = self._programs.get(normalise_session_id(session_id))
        return None if program is None else self._view(program, None)

    def programs(self, now: float | None = None) -> tuple[ProgramView, ...]:
        return tuple(self._view(p, now) for p in self._programs.values())

    def paused_ids(self) -> tuple[str, ...]:
        """The global paused queue, oldest pause first."""
        return tuple(sorted(self._paused, key=self._paused.__getitem__))

    def waiting_request_ids(self) -> tuple[str, ...]:
        return tuple(rid for rids in self._waiting.values() for rid in rids)

    def resume_deadline(self, request_id: str) -> float | None:
        """When a held admission is force-resumed (for the shell's timer)."""
        turn = self._turns.get(request_id)
        if turn is None or not turn.waiting:
            return None
        return turn.started_at + self.params.resume_timeout_seconds

    @property
    def capacity(self) -> tuple[ReplicaCapacity, ...]:
        return tuple(self._caps.values())

    def replica_stats(self, now: float) -> tuple[ReplicaStats, ...]:
        used_d = self._decayed_used(now)
        out = []
        for key, cap in self._caps.items():
            resident = self._resident[key]
            reasoning = sum(1 for sid in resident if self._programs[sid].status is Status.REASONING)
            out.append(ReplicaStats(key, cap.retention_tokens, cap.max_programs, self._used[key], used_d[key],
                                    self._used[key] / cap.retention_tokens, self._band(key), reasoning,
                                    len(resident), self._pt_count[key]))
        return tuple(out)

    def stats(self, now: float) -> Stats:
        reasoning = sum(1 for p in self._programs.values() if p.status is Status.REASONING)
        return Stats(
            programs_active=len(self._programs) - len(self._paused), programs_paused=len(self._paused),
            programs_reasoning=reasoning, programs_acting=len(self._programs) - reasoning,
            pauses_total=self.pauses_total, resumes_total=self.resumes_total,
            forced_resumes_total=self.forced_resumes_total, marks_total=self.marks_total,
            expired_total=self.expired_total, released_total=self.released_total,
            admissions_total=self.admissions_total, admissions_cancelled_total=self.admissions_cancelled_total,
            completes_ignored_total=self.completes_ignored_total,
            tickets_in_flight=len(self._turns) + len(self._passthrough),
            tickets_expired_total=self.tickets_expired_total,
            waiting_admissions=sum(len(r) for r in self._waiting.values()),
            passthrough_in_flight=len(self._passthrough), capacity_version=self._capacity_version,
            replicas=self.replica_stats(now))

    # ------------------------------------------------------------------ internals

    def _create(self, now: float, sid: str, parent_session_id: str) -> Program:
        parent = normalise_session_id(parent_session_id)
        if parent == sid:
            parent = ""  # a program is not its own parent
        program = Program(session_id=sid, parent_session_id=parent, created_at=now, seq=self._next_seq,
                          last_activity=now)
        self._next_seq += 1
        self._programs[sid] = program
        if parent:
            self._children.setdefault(parent, {})[sid] = None
        return program

    def _remove(self, program: Program) -> None:
        sid = program.session_id
        del self._programs[sid]
        self._paused.pop(sid, None)
        self._recharge(program)
        parent = program.parent_session_id
        if parent and parent in self._children:
            self._children[parent].pop(sid, None)
            if not self._children[parent]:
                del self._children[parent]

    def _end(self, now: float, program: Program, kind: EventKind, reason: str, acc: _Acc) -> None:
        """Release or expire: held admissions proceed unpinned with priority 0."""
        sid = program.session_id
        for rid in list(self._waiting.pop(sid, {})):
            turn = self._turns[rid]
            turn.waiting = False
            acc.resolutions.append(Decision(rid, sid, Verdict.PLACED, None, 0, 0.0, turn.epoch,
                                            was_paused=True, held_seconds=now - turn.started_at,
                                            program_gone=True))
        replica = program.replica
        self._remove(program)
        acc.events.append(ProgramEvent(kind, sid, replica, program.token_total, now, reason))

    def _place(self, program: Program, replica: ReplicaKey) -> None:
        program.replica = replica
        program.last_replica = replica

    def _pause(self, now: float, program: Program, reason: str, acc: _Acc) -> None:
        replica = program.replica
        program.lifecycle = Lifecycle.PAUSED
        program.replica = None  # a paused program is never placed
        program.paused_since = now
        self._paused[program.session_id] = self._next_pause_seq
        self._next_pause_seq += 1
        self.pauses_total += 1
        self._recharge(program)
        acc.events.append(ProgramEvent(EventKind.PAUSED, program.session_id, replica, program.token_total, now, reason))
        acc.logs.append(LogRecord(DEBUG, "Paused program %s (tokens=%d)" % (program.session_id, program.token_total)))
        if reason == "admission_full":
            acc.logs.append(LogRecord(INFO, "thunderagent.program paused program=%s reason=admission_full tokens=%d "
                                      "paused=%d" % (program.session_id, program.token_total, len(self._paused))))

    def _resume_onto(self, now: float, program: Program, target: ReplicaKey | None, acc: _Acc, *,
                     forced: bool, held_s: float | None) -> None:
        sid = program.session_id
        program.lifecycle = Lifecycle.ACTIVE
        program.paused_since = None
        self._paused.pop(sid, None)
        program.replica = None
        if target is not None:
            self._place(program, target)
        self._recharge(program)
        self.resumes_total += 1
        kind = EventKind.FORCED_RESUME if forced else EventKind.RESUMED
        acc.events.append(ProgramEvent(kind, sid, target, program.token_total, now))
        acc.logs.append(LogRecord(DEBUG, "Resumed program %s -> worker=%s (tokens=%d)"
                                  % (sid, target.worker_id if target else "any", program.token_total)))
        for rid in list(self._waiting.pop(sid, {})):
            turn = self._turns[rid]
            turn.waiting = False
            decision = self._decision(now, turn, program, forced=forced)
            acc.resolutions.append(decision)
            acc.events.append(ProgramEvent(EventKind.ADMITTED, sid, target, program.token_total, now))

    def _decision(self, now: float, turn: _Turn, program: Program, *, forced: bool = False) -> Decision:
        demoted = program.soft_demoted_until > now
        jump_s = ((self.params.resume_priority_boost if turn.was_paused else 0.0)
                  + (self.params.soft_demote_priority_jump if demoted else 0.0))
        replica = program.replica
        if replica is not None and not forced and (self._may_leave_placement_to_router()
                                                   or self._let_go(program, replica)):
            # Nothing is under pressure, or the policy does not hold this context anyway: the
            # router's KV cost (overlap and live load) picks, and Bind moves the program if it
            # chose elsewhere. Pinning here only costs balance.
            replica = None
            turn.unpinned = True
        return Decision(turn.request_id, turn.session_id, Verdict.PLACED, replica,
                        to_sglang_priority(jump_s), jump_s, turn.epoch, was_paused=turn.was_paused,
                        was_soft_demoted=demoted, forced_resume=forced, held_seconds=now - turn.started_at)

    def _let_go(self, program: Program, replica: ReplicaKey) -> bool:
        """A program whose context the policy does not hold (weight 0: recomputing it is cheaper
        than holding it through its tools) gains nothing from a pin: its KV is the engine's to
        evict, as under plain KV routing, so with soft pinning its turns are routed like KV
        routing's."""
        return (self.params.soft_pinning and self._policy_weight is not None and replica in self._caps
                and self._weight(program, replica) == 0 and not self._paused and not self._waiting)

    def _may_leave_placement_to_router(self) -> bool:
        if not self.params.soft_pinning or self._paused or self._waiting:
            return False
        return all(self._band(key) is Band.NORMAL for key in self._caps)

    def _drop_waiter(self, sid: str, request_id: str) -> None:
        waiting = self._waiting.get(sid)
        if waiting is not None:
            waiting.pop(request_id, None)
            if not waiting:
                del self._waiting[sid]

    def _any_waiting(self) -> bool:
        return bool(self._waiting)

    def _choose_admission_replica(self, now: float, program: Program, *, gate: bool) -> ReplicaKey | None:
        """Feasible: the raw working set stays below the pause threshold and a request slot is free.
        Among those, the most headroom by the decayed working set (in-flight load, not idle
        residents). A new program queues behind held admissions (`gate`)."""
        if gate:
            return None
        buffer = self.params.buffer_per_program_tokens
        if self._policy_weight is None:
            charge = program.token_total + buffer
            charges = dict.fromkeys(self._caps, charge)
        else:
            charges = {key: self._weight(program, key) + buffer for key in self._caps}
        feasible = [key for key, cap in self._caps.items()
                    if self._used[key] + charges[key] < cap.retention_tokens * self.params.pause_threshold
                    and (cap.max_programs <= 0 or self._inflight[key] < cap.max_programs)]
        if not feasible:
            return None
        decayed = {key: self._decayed_used_one(now, key) for key in feasible}
        return max(feasible, key=lambda k: self._caps[k].retention_tokens - decayed[k])

    def _resume_group(self, program: Program) -> int:
        """-1: a tail program whose next turn waits; 0: an existing program whose next turn waits;
        1: a new program queued at admission; 2: a paused ACTING program with no turn waiting."""
        if program.status is Status.REASONING and self._is_tail(program):
            return -1
        if program.turns > 1 and program.status is Status.REASONING:
            return 0
        if program.turns <= 1 and program.status is Status.REASONING:
            return 1
        return 2

    def _note_release(self, turns: int) -> None:
        q = self.params.tail_protection_quantile
        if q <= 0:
            return
        self._released_turns.append(turns)
        self._refresh_tail()

    def _refresh_tail(self) -> None:
        q = self.params.tail_protection_quantile
        if q > 0 and len(self._released_turns) >= TAIL_MIN_RELEASES:
            ordered = sorted(self._released_turns)
            self._tail_turns = ordered[min(len(ordered) - 1, math.floor(q * len(ordered)))]

    def _is_tail(self, program: Program) -> bool:
        """A program that has run more turns than most released programs ran in all (see
        ControlParams.tail_protection_quantile)."""
        return self._tail_turns is not None and program.turns > self._tail_turns

    def _band(self, key: ReplicaKey) -> Band:
        cap = self._caps[key]
        p = self.params
        util = self._used[key] / cap.retention_tokens
        count_util = self._inflight[key] / cap.max_programs if cap.max_programs > 0 else 0.0
        if util >= p.pause_threshold or (cap.max_programs > 0 and count_util > p.pause_threshold):
            return Band.PAUSE
        if max(util, count_util) >= p.soft_demote_threshold:
            return Band.SOFT_DEMOTE
        return Band.NORMAL

    def _unmark(self, key: ReplicaKey) -> None:
        for sid in self._resident[key]:
            self._programs[sid].marked = False

    def _recharge(self, program: Program, *, touched: bool = True) -> None:
        """Re-account `program` after a change (`touched`: a change worth persisting)."""
        sid = program.session_id
        if touched and self._tracking:
            self._dirty_programs.add(sid)
        old = self._charge.pop(sid, None)
        if old is not None:
            key, amount, in_flight, base = old
            self._used[key] -= amount
            self._inflight[key] -= in_flight
            self._decay_base[key] -= base
            del self._resident[key][sid]
            member = self._acting_members[key].pop(sid, None)
            if member is not None:
                self._acting_sum[key] -= member[2]
                if not self._acting_members[key]:
                    self._acting_sum[key] = 0.0  # drop accumulated rounding
        key = program.replica
        if (key is None or key not in self._caps or program.lifecycle is not Lifecycle.ACTIVE
                or self._programs.get(sid) is not program):
            return
        buffer = self.params.buffer_per_program_tokens
        amount = self._weight(program, key) + buffer
        in_flight = program.status is Status.REASONING
        base = buffer + (program.token_total if in_flight else 0)
        self._charge[sid] = (key, amount, in_flight, base)
        self._used[key] += amount
        self._inflight[key] += in_flight
        self._decay_base[key] += base
        self._resident[key][sid] = None
        if not in_flight and program.token_total > 0:
            self._add_acting(key, sid, program.token_total, program.acting_since)

    def _add_acting(self, key: ReplicaKey, sid: str, tokens: int, acting_since: float | None) -> None:
        tau = self.params.acting_decay_tau_seconds
        members = self._acting_members[key]
        if not members:
            self._acting_anchor[key] = acting_since if acting_since is not None else 0.0
            self._acting_sum[key] = 0.0
        anchor = self._acting_anchor[key]
        since = anchor if acting_since is None else acting_since
        if (since - anchor) / tau > _REBASE_EXPONENT:
            # Keep the running sum finite: move the anchor forward and recompute the terms.
            anchor = self._acting_anchor[key] = since
            total = 0.0
            for other, (t, s0, _) in list(members.items()):
                term = t * 2.0 ** max(-_REBASE_EXPONENT * 2, (s0 - anchor) / tau)
                members[other] = (t, s0, term)
                total += term
            self._acting_sum[key] = total
        term = tokens * 2.0 ** max(-_REBASE_EXPONENT * 2, (since - anchor) / tau)
        members[sid] = (tokens, since, term)
        self._acting_sum[key] += term

    def _weight(self, program: Program, key: ReplicaKey) -> int:
        """w(p) on the pause side: raw, or the policy's weight given the raw one and the budget."""
        raw = raw_weight_tokens(program, self.params.acting_token_weight)
        if self._policy_weight is None:
            return raw
        return self._policy_weight(program, raw, self._caps[key].retention_tokens)

    def _recharge_passthrough(self, request_id: str, pt: _Passthrough | None) -> None:
        old = self._pt_charge.pop(request_id, None)
        if old is not None:
            key, amount = old
            self._decay_base[key] -= amount
            self._used[key] -= amount
            self._inflight[key] -= 1
            self._pt_count[key] -= 1
        if pt is None or pt.replica is None or pt.replica not in self._caps:
            return
        amount = pt.tokens + self.params.buffer_per_program_tokens
        self._pt_charge[request_id] = (pt.replica, amount)
        self._decay_base[pt.replica] += amount
        self._used[pt.replica] += amount
        self._inflight[pt.replica] += 1
        self._pt_count[pt.replica] += 1

    def _decayed_used(self, now: float) -> dict[ReplicaKey, int]:
        return {key: self._decayed_used_one(now, key) for key in self._caps}

    def _decayed_used_one(self, now: float, key: ReplicaKey) -> int:
        """used_d(r) = base + floor(2^(-(now - anchor)/tau) * S): O(1). The floor applies to the
        replica's acting sum rather than per program (differs by < 1 token per program)."""
        acting = 0
        if self._acting_members[key]:
            exponent = -max(0.0, now - self._acting_anchor[key]) / self.params.acting_decay_tau_seconds
            acting = max(0, math.floor(self._acting_sum[key] * 2.0 ** max(exponent, -1074.0)))
        return self._decay_base[key] + acting

    def _view(self, program: Program, now: float | None) -> ProgramView:
        at = program.last_activity if now is None else now
        return ProgramView(
            session_id=program.session_id, parent_session_id=program.parent_session_id, status=program.status,
            lifecycle=program.lifecycle, token_total=program.token_total, tokens_estimated=program.tokens_estimated,
            replica=program.replica, marked=program.marked, soft_demoted=program.soft_demoted_until > at,
            turns=program.turns, admission_epoch=program.admission_epoch, created_at=program.created_at,
            last_activity=program.last_activity, paused_since=program.paused_since,
            children=tuple(self._children.get(program.session_id, ())))

    def check_invariants(self, now: float | None = None) -> None:
        """Recompute the accounting from scratch and compare (used by tests and debug builds)."""
        used = {k: 0 for k in self._caps}
        inflight = {k: 0 for k in self._caps}
        for program in self._programs.values():
            assert program.token_total >= 0, program
            if program.lifecycle is Lifecycle.PAUSED:
                assert program.replica is None and program.session_id in self._paused, program
            else:
                assert program.session_id not in self._paused, program
                if program.replica in self._caps:
                    used[program.replica] += (self._weight(program, program.replica)
                                              + self.params.buffer_per_program_tokens)
                    inflight[program.replica] += program.status is Status.REASONING
        for rid, (key, amount) in self._pt_charge.items():
            used[key] += amount
            inflight[key] += 1
        assert used == self._used, (used, self._used)
        assert inflight == self._inflight, (inflight, self._inflight)
        assert set(self._paused) <= set(self._programs)
        if now is not None:
            p = self.params
            for key in self._caps:
                members = [self._programs[sid] for sid in self._resident[key]]
                exact = sum(decayed_weight_tokens(q, now, p.acting_decay_tau_seconds) + p.buffer_per_program_tokens
                            for q in members)
                exact += sum(amount for k, amount in self._pt_charge.values() if k == key)
                fast = self._decayed_used_one(now, key)
                assert abs(fast - exact) <= len(members) + 1, (key, fast, exact)
        for sid, rids in self._waiting.items():
            assert sid in self._programs and self._programs[sid].lifecycle is Lifecycle.PAUSED
            assert all(self._turns[r].waiting for r in rids)


def iter_events(effects: Iterable[Effects]) -> list[ProgramEvent]:
    return [e for eff in effects for e in eff.events]
