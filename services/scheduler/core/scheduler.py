"""The scheduler core: admission, turns, leases, release, tick, the transitions and the views.

It holds the two concerns it composes as public attributes: the accounting (`ledger`, an
`accounting.Ledger`: the program table, tickets, per-replica token sums and release statistics,
with their invariants) and the control law (`control`, a `control.ControlLaw`: bands, admission
placement, and the tick's soft demote, resume, aging, forced resume and pause choices, which it
returns as plans that `apply` carries out through this core's transitions). Export and restore of
the durable state are in durable.py.

Pure and synchronous: no I/O, no clock reads (`now` is monotonic seconds passed in), no locks
(the shell serialises calls). Every mutating call returns the `Effects` it caused (events for
WatchEvents, log records, and held admissions it resolved) so that a thin async shell can
publish them.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
from typing import Iterable

from services.scheduler.core.accounting import (
    Ledger,
    Passthrough,
    Turn,
    normalise_session_id,
)
from services.scheduler.core.calibration import EstimateCalibration
from services.scheduler.core.control import (
    ControlLaw,
    ForceResume,
    Mark,
    Pause,
    Plan,
    Resume,
    SoftDemote,
    Unmark,
)
from services.scheduler.core.errors import (
    DuplicateRequest,
    MissingRequestId,
    RequestMismatch,
)
from services.scheduler.core.model import (
    INFO,
    WARNING,
    Acc,
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
    ControlParams,
    to_sglang_priority,
)
from services.scheduler.core.policies import PausePolicy, make_pause_policy

__all__ = ["SchedulerCore"]

_new_event = functools.partial(tuple.__new__, ProgramEvent)
"""`ProgramEvent` from its six fields as one tuple, with no Python-level call (for `map`)."""
_TOKEN_TOTAL = operator.attrgetter("token_total")
_SESSION_ID = operator.attrgetter("session_id")
_SEQ = operator.attrgetter("seq")

_PROGRAM_FIELDS = tuple(f.name for f in dataclasses.fields(Program))
# What an admission sets on its program besides the count (and what taking it back restores).
_TURN_FIELDS = ("status", "acting_since", "token_total", "tokens_estimated", "last_activity", "admission_epoch")


class SchedulerCore:
    """The program table and control law, composed. See docs/scheduler.md for the semantics."""

    def __init__(
        self,
        params: ControlParams | None = None,
        policy: PausePolicy | None = None,
        *,
        ticket_lease_seconds: float = 0.0,
    ) -> None:
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
        self._observe_tool = getattr(self.policy, "observe_tool", None)
        self._observe_prefill = getattr(self.policy, "observe_prefill", None)
        self._refresh_policy = getattr(self.policy, "refresh", None)
        # Replicas of the last capacity snapshot whose workers report no cached tokens: their turns'
        # (prompt, ttft) say nothing about the prefill rate (see `complete`).
        self._no_cache_report: frozenset[ReplicaKey] = frozenset()
        self.ledger = Ledger(
            self.params, getattr(self.policy, "weight_tokens", None), getattr(self.policy, "weigher", None)
        )
        self.control = ControlLaw(self.params, self.policy, self.ledger)
        # The router's prompt estimates in the workers' tokens (used when the params ask for it).
        self.calibration = EstimateCalibration()
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
        self.dispatched_while_paused_total = 0

    # ------------------------------------------------------------------ admission

    def admit(
        self,
        now: float,
        session_id: str,
        parent_session_id: str,
        estimated_prompt_tokens: int,
        request_id: str,
        *,
        dispatched: bool = False,
        dispatched_replica: ReplicaKey | None = None,
    ) -> AdmitResult:
        """Start a turn. PLACED: go now (replica None = any worker). WAIT: the program is in the
        paused queue; a later tick (resume) or `force_resume` resolves the admission.

        `dispatched`: the router already started the turn (its admission fast path: the program was ACTIVE
        as far as it knew), on `dispatched_replica` when it says. Never WAIT: a program paused meanwhile
        (the pause and its event crossed the turn) is resumed onto the replica the turn runs on and counted
        (`dispatched_while_paused_total`); the program is placed where the turn runs, as a Bind would."""
        if not request_id:
            raise MissingRequestId("request_id is required")
        replayed = self.ledger.turns.get(request_id)
        if (
            replayed is not None
            and replayed.restored
            and not replayed.waiting
            and replayed.session_id == normalise_session_id(session_id)
        ):
            # Stored by the previous leader, whose answer may never have left (it failed between its
            # commit and the reply): the router's retry gets the same admission, counted once.
            replayed.restored = False
            return AdmitResult(self._decision(now, replayed, replayed.program), Effects())
        if request_id in self.ledger.turns or request_id in self.ledger.passthrough:
            raise DuplicateRequest(f"request {request_id!r} is already in flight")
        acc = Acc()
        self.admissions_total += 1
        sent = max(0, int(estimated_prompt_tokens))
        estimate = self.calibration.apply(sent) if self.params.calibrate_token_estimates else sent
        sid = normalise_session_id(session_id)
        if not sid:
            self.ledger.passthrough[request_id] = Passthrough(request_id, estimate, None, now, self.lease_until(now))
            return AdmitResult(Decision(request_id, "", Verdict.PLACED, None, 0, 0.0, 0), acc.effects())

        program = self.ledger.programs.get(sid)
        before = program.snapshot() if program is not None else None
        paused_seq_before = self.ledger.paused.get(sid)
        created = program is None
        if program is None:
            program = self.ledger.create(now, sid, parent_session_id)
        if (
            self._observe_tool is not None
            and program is not None
            and program.status is Status.ACTING
            and program.acting_since is not None
        ):
            self._observe_tool(now - program.acting_since)  # the tool call that just ended
        program.turns += 1
        program.admission_epoch += 1
        if estimate > 0:
            program.token_total = estimate
            program.tokens_estimated = True
        program.status = Status.REASONING
        program.acting_since = None
        program.last_activity = now
        turn = Turn(request_id, sid, program, program.admission_epoch, now, before, paused_seq_before, estimate=sent)
        self.ledger.turns[request_id] = turn
        running_on = dispatched_replica if dispatched and dispatched_replica in self.ledger.caps else None
        if dispatched and program.lifecycle is Lifecycle.PAUSED:
            # Already running: its KV is where it runs. The control law sees it REASONING there, and may
            # mark it again at its next tool boundary if the pressure lasts.
            self.dispatched_while_paused_total += 1
            self._resume_onto(now, program, running_on, acc, forced=False)
            turn.was_paused = True  # the answer says so: the router drops its cached admission

        if program.lifecycle is Lifecycle.ACTIVE:
            if program.replica is not None and program.replica not in self.ledger.caps:
                program.replica = None  # stale pin: its replica left the snapshot
            if running_on is not None:
                if program.replica != running_on:
                    self.ledger.place(program, running_on)
            elif program.replica is None and self.ledger.caps and not dispatched:
                target = self.control.choose_admission_replica(now, program, gate=created and bool(self.ledger.waiting))
                if target is not None:
                    self.ledger.place(program, target)
                elif created:
                    # Nothing fits a brand-new program: it queues before its first turn runs.
                    self._pause(now, program, "admission_full", acc)
                # else: a live session is never parked; it runs unpinned (bound later).
        self.ledger.recharge(program)

        turn.after = program.snapshot()
        if program.lifecycle is Lifecycle.PAUSED:
            turn.waiting = True
            turn.was_paused = True
            self.ledger.add_waiter(sid, request_id, turn.started_at)
            decision = Decision(request_id, sid, Verdict.WAIT, None, 0, 0.0, program.admission_epoch, was_paused=True)
            return AdmitResult(decision, acc.effects())
        decision = self._decision(now, turn, program)
        turn.lease_until = self.lease_until(now)
        acc.events.append(ProgramEvent(EventKind.ADMITTED, sid, program.replica, program.token_total, now))
        return AdmitResult(decision, acc.effects())

    def cancel_admission(self, now: float, request_id: str) -> Effects:
        """Roll back an admission (client gone while held, its answer never delivered, or its lease
        lapsed unconfirmed) to the exact table state it found. Idempotent. If a later admission moved
        the program's epoch on, the later turn keeps the state (and inherits this turn's `before`) and
        only this turn's count is taken back; skipped if the program was replaced."""
        acc = Acc()
        pt = self.ledger.passthrough.pop(request_id, None)
        if pt is not None:
            self.ledger.recharge_passthrough(request_id, None)
            return acc.effects()
        restored = self.ledger.turns.get(request_id)
        if restored is not None and restored.before_lost:
            return self._cancel_restored(now, restored)
        turn = self.ledger.turns.pop(request_id, None)
        if turn is None:
            return acc.effects()
        self.admissions_cancelled_total += 1
        self.ledger.drop_waiter(turn.session_id, request_id)
        program = self.ledger.programs.get(turn.session_id)
        if program is not turn.program:
            return acc.effects()
        if program.admission_epoch != turn.epoch:
            # Later admissions of the program captured their snapshots with this turn in them: take
            # it out of each, so that rolling them back too restores the state before all of them.
            # The next one inherits our `before` whole if nothing happened between the two admissions.
            later = sorted(
                (t for t in self.ledger.turns.values() if t.program is program and t.epoch > turn.epoch),
                key=lambda t: t.epoch,
            )
            if later:
                successor = later[0]
                if turn.before is None or successor.before == turn.after:
                    successor.before = None if turn.before is None else turn.before.snapshot()
                    successor.paused_seq_before = turn.paused_seq_before
                elif successor.before is not None:
                    _take_out(successor.before, turn)
                for t in later[1:]:
                    if t.before is not None:
                        _take_out(t.before, turn)
                for t in later:
                    if t.after is not None:
                        _take_out(t.after, turn)
            _take_out(program, turn)  # the later turns keep the program's state; this count goes
            self.ledger.recharge(program)
            return acc.effects()
        if turn.before is None:
            self.ledger.remove(program)
            retained = False
        elif program == turn.after:
            # Untouched since this admission: the exact state it found, paused-queue position included.
            for name in _PROGRAM_FIELDS:
                setattr(program, name, getattr(turn.before, name))
            if program.replica is not None and self.ledger.caps and program.replica not in self.ledger.caps:
                program.replica = None  # its replica left the snapshot meanwhile (a late rollback)
            self.ledger.paused.pop(program.session_id, None)
            if turn.paused_seq_before is not None:
                self.ledger.paused[program.session_id] = turn.paused_seq_before
            self.ledger.recharge(program)
            retained = True
        else:
            # Changed since (an earlier turn completed, a tick marked it, a Bind moved it): what others
            # did stays; only this turn's own effects are taken back.
            _take_out(program, turn)
            self.ledger.recharge(program)
            retained = True
        acc.logs.append(
            LogRecord(
                INFO,
                "thunderagent.program admission_cancelled program=%s retained=%s "
                "active=%d paused=%d"
                % (
                    turn.session_id,
                    retained,
                    len(self.ledger.programs) - len(self.ledger.paused),
                    len(self.ledger.paused),
                ),
            )
        )
        return acc.effects()

    def _cancel_restored(self, now: float, turn: Turn) -> Effects:
        """Roll back a turn a new leader restored from the store: the state it found is not known, so it
        ends as a cancelled Complete would (the program at a tool boundary) and its count is taken back."""
        self.admissions_cancelled_total += 1
        effects = self._end_as_cancelled(now, turn)
        program = self.ledger.programs.get(turn.session_id)
        if program is turn.program:
            program.turns = max(0, program.turns - 1)
            self.ledger.recharge(program)
        return effects

    def _end_as_cancelled(self, now: float, turn: Turn) -> Effects:
        """End a placed turn as Complete(CANCELLED, no counts) would, if the program is still in it (same
        program, same admission, REASONING); else only drop its ticket."""
        program = self.ledger.programs.get(turn.session_id)
        if program is turn.program and program.admission_epoch == turn.epoch and program.status is Status.REASONING:
            return self.complete(now, "", turn.request_id, None, 0, 0, 0, TurnOutcome.CANCELLED)
        del self.ledger.turns[turn.request_id]
        return Effects()

    def bind_request(self, request_id: str, replica: ReplicaKey) -> bool:
        """Record the replica the router chose for an unpinned turn (passthrough, cold start, or a
        live session nothing could take). Admission placement stays authoritative."""
        if replica not in self.ledger.caps:
            return False
        pt = self.ledger.passthrough.get(request_id)
        if pt is not None:
            pt.replica = replica
            self.ledger.recharge_passthrough(request_id, pt)
            if self.ledger.tracking:
                self.ledger.dirty_tickets.add(request_id)
            return True
        turn = self.ledger.turns.get(request_id)
        if turn is None:
            return False
        # Not a confirmation: the router binds as it picks the worker, before its client has anything
        # (a router killed now leaves a client that retries the turn). `renew_leases(delivered=...)` is.
        program = self.ledger.programs.get(turn.session_id)
        if (
            program is not turn.program
            or program.admission_epoch != turn.epoch
            or program.lifecycle is not Lifecycle.ACTIVE
        ):
            return False
        if program.replica is not None and not turn.unpinned:
            return False  # pinned by admission: placement stays authoritative
        if program.replica != replica:
            self.ledger.place(program, replica)
            self.ledger.recharge(program)
        return True

    def complete(
        self,
        now: float,
        session_id: str,
        request_id: str,
        replica: ReplicaKey | None,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        outcome: TurnOutcome = TurnOutcome.OK,
        ttft_s: float | None = None,
    ) -> Effects:
        """A turn ended: the program is at a tool boundary (ACTING). token_total becomes
        prompt + completion when the worker reported them. A marked program is paused here.
        `ttft_s` (dispatch to first token, when the caller knows it) feeds the policy's prefill
        estimate; the whole context stays resident whether or not it was cached. It does not when
        the turn ran on a replica whose worker reports no cached tokens (or on an unknown replica
        while any does): its cached_tokens is then 0 whatever the cache served, and a cached
        prompt taken as uncached would read as a far too fast prefill (cost_aware.py, Estimates).

        The ticket (the admitted turn) is authoritative: a request id with none (never admitted,
        already completed, expired, or still held) is ignored and counted, and never changes the
        table; a `session_id` other than the admitted one is a RequestMismatch. NOT_STARTED (answered,
        never sent to a worker) rolls the admission back instead (`cancel_admission`)."""
        acc = Acc()
        turn = self.ledger.turns.get(request_id)
        sid = normalise_session_id(session_id)
        if request_id in self.ledger.passthrough:
            if sid:
                raise RequestMismatch(
                    f"session_id {sid!r} does not match request {request_id!r} (admitted as a passthrough request)"
                )
        elif turn is None or turn.waiting:
            self.completes_ignored_total += 1
            return acc.effects()
        elif sid and sid != turn.session_id:
            raise RequestMismatch(
                f"session_id {sid!r} does not match request {request_id!r} (admitted for {turn.session_id!r})"
            )
        if outcome is TurnOutcome.NOT_STARTED:
            return self.cancel_admission(now, request_id)  # never reached a worker: it never counted
        if (
            self._observe_prefill is not None
            and ttft_s is not None
            and outcome is TurnOutcome.OK
            and prompt_tokens > cached_tokens >= 0
            and self.cache_reported(replica)
        ):
            self._observe_prefill(int(prompt_tokens) - int(cached_tokens), float(ttft_s))
        pt = self.ledger.passthrough.pop(request_id, None)
        if pt is not None:
            self.ledger.recharge_passthrough(request_id, None)
            return acc.effects()
        assert turn is not None
        del self.ledger.turns[request_id]
        if outcome is TurnOutcome.OK:
            self.calibration.observe(turn.estimate, int(prompt_tokens))
        program = self.ledger.programs.get(turn.session_id)
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
        if (
            program.lifecycle is Lifecycle.ACTIVE
            and program.replica is None
            and replica is not None
            and replica in self.ledger.caps
        ):
            self.ledger.place(program, replica)  # its KV now lives where the turn ran
        if program.marked and program.lifecycle is Lifecycle.ACTIVE:
            program.marked = False
            self._pause(now, program, "marked", acc)
        self.ledger.recharge(program)
        return acc.effects()

    # ------------------------------------------------------------------ ticket leases

    def lease_until(self, now: float) -> float | None:
        """Until when a ticket placed (or renewed) at `now` lives unrenewed; None: tickets never expire."""
        return now + self.ticket_lease_seconds if self.ticket_lease_seconds > 0 else None

    def renew_leases(self, now: float, request_ids: Iterable[str], delivered: Iterable[str] = ()) -> tuple[str, ...]:
        """Extend the lease of each named ticket (`request_ids` and `delivered`) to now +
        ticket_lease_seconds; return the ids that have no ticket (completed, expired, never admitted),
        which the caller may stop renewing. A held admission's ticket is known but has no lease: its
        Admit call is its liveness. A ticket named in `delivered` is confirmed: its client has received
        something (a streamed answer's headers and first chunk, a whole answer), so the turn counts
        whatever happens to its router from now on. A renewal alone confirms nothing: a live router
        renews a turn still waiting for its worker's first byte, and a client that got nothing retries."""
        until = self.lease_until(now)
        unknown = []
        for rid, confirm in itertools.chain(((r, False) for r in request_ids), ((r, True) for r in delivered)):
            turn = self.ledger.turns.get(rid)
            ticket = turn or self.ledger.passthrough.get(rid)
            if ticket is None:
                if rid not in unknown:
                    unknown.append(rid)
            elif turn is not None and turn.waiting:
                continue  # held: its open Admit call is its liveness
            else:
                if until is not None:
                    ticket.lease_until = until
                if confirm and turn is not None and not turn.confirmed:
                    turn.confirmed = True
                    if self.ledger.tracking:
                        self.ledger.dirty_tickets.add(rid)  # a new leader must count it too
        return tuple(unknown)

    def expire_leases(self, now: float) -> Effects:
        """End every placed turn whose lease lapsed, as if Complete(outcome=CANCELLED, no counts)
        had arrived: the program goes to ACTING (paused there if marked) and its token_total stays
        the last known one, so idle expiry and pauses see it again. A turn never confirmed (no
        delivery reported by RenewLeases, no Complete) is rolled back instead, as a cancelled admission:
        its client received nothing (it retries the turn), so it never counted. A passthrough request stops being
        charged. A lapsed ticket of an older turn (a newer one is in flight) is only dropped. A ticket
        placed by a resume starts its lease at the first call after it. O(tickets in flight)."""
        acc = Acc()
        if self.ticket_lease_seconds <= 0:
            return acc.effects()
        for rid, pt in list(self.ledger.passthrough.items()):
            if pt.lease_until is None:
                pt.lease_until = self.lease_until(now)
            elif pt.lease_until <= now:
                del self.ledger.passthrough[rid]
                self.ledger.recharge_passthrough(rid, None)
                self.tickets_expired_total += 1
                acc.logs.append(
                    LogRecord(
                        INFO,
                        "thunderagent.program lease_expired passthrough request=%s "
                        "age=%.1fs" % (rid, now - pt.started_at),
                    )
                )
        for rid, turn in list(self.ledger.turns.items()):
            if turn.waiting:
                continue
            if turn.lease_until is None:
                turn.lease_until = self.lease_until(now)
                continue
            if turn.lease_until > now:
                continue
            self.tickets_expired_total += 1
            if not turn.confirmed:
                # No sign that its client received anything (no delivery reported, no Complete): a call
                # cancelled as it was answered, or a router that died before its client's first byte
                # (after its Bind, perhaps). Roll it back.
                effects = self.cancel_admission(now, rid)
                acc.events.extend(effects.events)
                acc.logs.extend(effects.logs)
                acc.logs.append(
                    LogRecord(
                        INFO,
                        "thunderagent.program lease_expired_unconfirmed program=%s request=%s age=%.1fs rolled_back"
                        % (turn.session_id, rid, now - turn.started_at),
                    )
                )
                continue
            effects = self._end_as_cancelled(now, turn)
            acc.events.extend(effects.events)
            acc.logs.extend(effects.logs)
            acc.logs.append(
                LogRecord(
                    INFO,
                    "thunderagent.program lease_expired program=%s request=%s age=%.1fs"
                    % (turn.session_id, rid, now - turn.started_at),
                )
            )
        return acc.effects()

    def release(self, now: float, session_id: str) -> tuple[bool, Effects]:
        """Final request: remove every trace of the program. Held admissions go unpinned."""
        acc = Acc()
        program = self.ledger.programs.get(normalise_session_id(session_id))
        if program is None:
            return False, acc.effects()
        self._end(now, program, EventKind.RELEASED, "final", acc)
        self.released_total += 1
        self.ledger.note_release(program.turns)
        acc.logs.append(
            LogRecord(
                INFO,
                "thunderagent.program terminated program=%s remaining=%d"
                % (program.session_id, len(self.ledger.programs)),
            )
        )
        return True, acc.effects()

    def force_resume(self, now: float, request_id: str) -> Effects:
        """Resume the program a held admission waits on, ignoring thresholds (starvation bound).
        The shell may call this at the exact deadline; `tick` also does it for overdue waits."""
        acc = Acc()
        turn = self.ledger.turns.get(request_id)
        if turn is not None and turn.waiting:
            program = self.ledger.programs.get(turn.session_id)
            if program is not None and program.lifecycle is Lifecycle.PAUSED:
                self._forced_resume(now, program, now - turn.started_at, acc)
        return acc.effects()

    # ------------------------------------------------------------------ tick

    def tick(self, now: float, snapshot: CapacitySnapshot | None = None) -> TickResult:
        """One control step: apply capacity -> expire idle -> soft demote -> resume -> forced
        resume -> pause. Cost O(P log P) in the number of programs P."""
        acc = Acc()
        control = self.control
        control.note_tick_start()
        if snapshot is not None:
            self._apply_capacity(now, snapshot, acc)
        if self._refresh_policy is not None:
            moved = self._refresh_policy()
            self.ledger.forget_weighers()  # valid until a refresh, whatever it says
            if moved:
                # The policy's estimates moved: re-weigh the placed programs (their weight depends on them).
                self.ledger.reweigh()
        expired = self._expire_idle(now, acc)
        resumed = paused = marked = 0
        if self.ledger.caps:
            self._soft_demote(now, acc)
            resumed = self._apply(now, control.plan_resume(now), acc).count(Resume)
        if self.ledger.caps and self.params.resume_aging_seconds > 0:
            resumed += self._apply(now, control.plan_aging(now), acc).count(Resume)
        forced = self._apply(now, control.plan_forced(now), acc).count(ForceResume)
        if self.ledger.caps:
            plan = self._apply(now, control.plan_pauses(now), acc)
            paused, marked = plan.count(Pause), plan.count(Mark)
        control.note_tick_end()
        if resumed:
            acc.logs.append(
                LogRecord(INFO, "scheduler.tick resumed=%d still_paused=%d" % (resumed, len(self.ledger.paused)))
            )
        return TickResult(
            tuple(acc.events),
            tuple(acc.logs),
            tuple(acc.resolutions),
            self.replica_stats(now),
            paused,
            marked,
            resumed,
            forced,
            expired,
        )

    def apply_capacity(self, now: float, snapshot: CapacitySnapshot) -> Effects:
        """Take a new capacity snapshot without running the control law (e.g. between ticks)."""
        acc = Acc()
        self._apply_capacity(now, snapshot, acc)
        return acc.effects()

    def cache_reported(self, replica: ReplicaKey | None) -> bool:
        """Does a turn that ran on `replica` come with a true cached-token count? An unknown replica
        (None) does only when every replica's worker reports them."""
        if replica is None:
            return not self._no_cache_report
        return replica not in self._no_cache_report

    def _apply_capacity(self, now: float, snapshot: CapacitySnapshot, acc: Acc) -> None:
        unreported = frozenset(r.key for r in snapshot.replicas if not r.cache_report)
        present = {r.key for r in snapshot.replicas}
        line = "scheduler.capacity %s worker=%s dp_rank=%s: its turns %s the prefill-rate estimate"
        for key in sorted(unreported - self._no_cache_report):
            acc.logs.append(LogRecord(WARNING, line % ("cache_report_off", *key, "no longer feed")))
        # A replica that left the snapshot says nothing about reports: its removal is logged below.
        for key in sorted((self._no_cache_report - unreported) & present):
            acc.logs.append(LogRecord(INFO, line % ("cache_report_on", *key, "feed")))
        self._no_cache_report = unreported
        for key, unplaced in self.ledger.set_capacity(snapshot):
            acc.logs.append(
                LogRecord(
                    INFO,
                    "scheduler.capacity replica_removed worker=%s dp_rank=%s unplaced=%d"
                    % (key.worker_id, key.dp_rank, unplaced),
                )
            )

    def _expire_idle(self, now: float, acc: Acc) -> int:
        ttl = self.params.program_idle_ttl_seconds
        if ttl <= 0:
            return 0
        # From the idle index (the ACTING programs past the TTL, in table order), not a walk of the table.
        due = []
        for p in self.ledger.idle_due(now, ttl):
            if self.ledger.waiting.get(p.session_id):
                self.ledger.reindex_idle(p)  # kept while an admission waits on it: due again next tick
            else:
                due.append(p)
        for program in due:
            idle_s = now - (program.acting_since or now)
            self._end(now, program, EventKind.EXPIRED, "idle_ttl", acc)
            self.expired_total += 1
            acc.logs.append(
                LogRecord(
                    INFO,
                    "thunderagent.program expired program=%s idle=%.0fs tokens=%d "
                    "remaining=%d" % (program.session_id, idle_s, program.token_total, len(self.ledger.programs)),
                )
            )
        return len(due)

    # ------------------------------------------------------------------ views

    def program(self, session_id: str) -> ProgramView | None:
        program = self.ledger.programs.get(normalise_session_id(session_id))
        return None if program is None else self._view(program, None)

    def programs(self, now: float | None = None) -> tuple[ProgramView, ...]:
        return tuple(self._view(p, now) for p in self.ledger.programs.values())

    def paused_ids(self) -> tuple[str, ...]:
        """The global paused queue, oldest pause first."""
        return tuple(sorted(self.ledger.paused, key=self.ledger.paused.__getitem__))

    def waiting_request_ids(self) -> tuple[str, ...]:
        return tuple(rid for rids in self.ledger.waiting.values() for rid in rids)

    def resume_deadline(self, request_id: str) -> float | None:
        """When a held admission is force-resumed (for the shell's timer)."""
        turn = self.ledger.turns.get(request_id)
        if turn is None or not turn.waiting:
            return None
        return turn.started_at + self.params.resume_timeout_seconds

    @property
    def capacity(self) -> tuple[ReplicaCapacity, ...]:
        return tuple(self.ledger.caps.values())

    def replica_stats(self, now: float) -> tuple[ReplicaStats, ...]:
        used_d = self.ledger.decayed_used(now)
        out = []
        for key, cap in self.ledger.caps.items():
            resident = self.ledger.resident[key]
            # In flight there: its REASONING programs and its passthrough requests (see Ledger).
            reasoning = self.ledger.inflight[key] - self.ledger.pt_count[key]
            out.append(
                ReplicaStats(
                    key,
                    cap.retention_tokens,
                    cap.max_programs,
                    self.ledger.used[key],
                    used_d[key],
                    self.ledger.used[key] / cap.retention_tokens,
                    self.control.band(key),
                    reasoning,
                    len(resident),
                    self.ledger.pt_count[key],
                )
            )
        return tuple(out)

    def stats(self, now: float) -> Stats:
        reasoning = sum(1 for p in self.ledger.programs.values() if p.status is Status.REASONING)
        return Stats(
            programs_active=len(self.ledger.programs) - len(self.ledger.paused),
            programs_paused=len(self.ledger.paused),
            programs_reasoning=reasoning,
            programs_acting=len(self.ledger.programs) - reasoning,
            pauses_total=self.pauses_total,
            resumes_total=self.resumes_total,
            forced_resumes_total=self.forced_resumes_total,
            marks_total=self.marks_total,
            expired_total=self.expired_total,
            released_total=self.released_total,
            admissions_total=self.admissions_total,
            admissions_cancelled_total=self.admissions_cancelled_total,
            completes_ignored_total=self.completes_ignored_total,
            tickets_in_flight=len(self.ledger.turns) + len(self.ledger.passthrough),
            dispatched_while_paused_total=self.dispatched_while_paused_total,
            tickets_expired_total=self.tickets_expired_total,
            waiting_admissions=sum(len(r) for r in self.ledger.waiting.values()),
            passthrough_in_flight=len(self.ledger.passthrough),
            capacity_version=self.ledger.capacity_version,
            replicas=self.replica_stats(now),
        )

    # ------------------------------------------------------------------ internals

    # ------------------------------------------------------------------ plans

    def apply(self, now: float, plan: Plan) -> Effects:
        """Carry out a control-law plan (`ControlLaw.plan_*`, or one built by hand: an operator's or a
        test's pause) through the core's transitions, in order."""
        acc = Acc()
        self._apply(now, plan, acc)
        return acc.effects()

    def _apply(self, now: float, plan: Plan, acc: Acc) -> Plan:
        programs = self.ledger.programs
        for step in plan.steps:
            if isinstance(step, Pause):  # the kinds in the order of their frequency in a tick
                self._pause(now, programs[step.session_id], step.reason, acc)
            elif isinstance(step, Resume):
                program = programs[step.session_id]
                if step.protect_until is not None:
                    program.pause_protected_until = step.protect_until
                self._resume_onto(now, program, step.replica, acc, forced=False)
            elif isinstance(step, SoftDemote):
                # One step per replica in the band, with every resident in it: locals, not lookups.
                # The events are built by C-level calls over the ids (thousands in a tick at fleet size),
                # each the `ProgramEvent(SOFT_DEMOTED, sid, replica, tokens, now)` of one program.
                until, replica = step.until, step.replica
                acc.events.extend(
                    map(
                        _new_event,
                        zip(
                            itertools.repeat(EventKind.SOFT_DEMOTED),
                            step.announce,
                            itertools.repeat(replica),
                            map(_TOKEN_TOTAL, map(programs.__getitem__, step.announce)),
                            itertools.repeat(now),
                            itertools.repeat(""),
                        ),
                    )
                )
                # A plain loop: the interpreter's specialised attribute store is about twice as fast as
                # `setattr` mapped over the programs (measured, 6,000 programs).
                for program in map(programs.__getitem__, step.session_ids):
                    if program.soft_demoted_until < until:
                        program.soft_demoted_until = until
            elif isinstance(step, ForceResume):
                program = programs[step.session_id]
                if program.lifecycle is Lifecycle.PAUSED:
                    self._forced_resume(now, program, step.waited_s, acc)
            elif isinstance(step, Mark):
                self._mark(now, programs[step.session_id], step.replica, acc)
            elif isinstance(step, Unmark):
                programs[step.session_id].marked = False
            else:
                acc.logs.append(step)
        return plan

    def _soft_demote(self, now: float, acc: Acc) -> None:
        """`control.plan_soft_demote(now)` and its application in one pass over each band replica's
        residents: the same windows set, the same events in the same order, without the plan's id
        tuples and the lookups back from them (a replica in the band holds hundreds of programs, and
        at fleet size most replicas are in it). Per replica as the plan's steps are applied one after
        the other: a demotion changes no band and no other replica's residents."""
        ledger, band, soft = self.ledger, self.control.band, Band.SOFT_DEMOTE
        until = now + self.params.soft_demote_window_seconds
        events = acc.events
        for key in ledger.caps:
            if band(key) is not soft:
                continue
            announce: list[Program] = []  # not demoted already: an event each
            for program in ledger.resident[key].values():
                if program.marked:
                    continue
                demoted_until = program.soft_demoted_until
                if demoted_until <= now:
                    announce.append(program)
                if demoted_until < until:
                    program.soft_demoted_until = until
            if announce:
                # Events in creation order: the residents' order is the order of their last re-account.
                announce.sort(key=_SEQ)
                events.extend(
                    map(
                        _new_event,
                        zip(
                            itertools.repeat(EventKind.SOFT_DEMOTED),
                            map(_SESSION_ID, announce),
                            itertools.repeat(key),
                            map(_TOKEN_TOTAL, announce),
                            itertools.repeat(now),
                            itertools.repeat(""),
                        ),
                    )
                )

    # ------------------------------------------------------------------ transitions

    def _forced_resume(self, now: float, program: Program, waited_s: float, acc: Acc) -> None:
        """Onto argmax(capacity - used_d) over the whole snapshot; None (any worker) when empty."""
        target = self.control.forced_target(now)
        acc.logs.append(LogRecord(WARNING, "Forced resume for %s after %.1fs" % (program.session_id, waited_s)))
        self.forced_resumes_total += 1
        self._resume_onto(now, program, target, acc, forced=True)

    def _mark(self, now: float, program: Program, key: ReplicaKey, acc: Acc) -> None:
        program.marked = True
        self.marks_total += 1
        acc.events.append(_new_event((EventKind.MARKED, program.session_id, key, program.token_total, now, "pressure")))

    def _end(self, now: float, program: Program, kind: EventKind, reason: str, acc: Acc) -> None:
        """Release or expire: held admissions proceed unpinned with priority 0."""
        sid = program.session_id
        for rid in list(self.ledger.waiting.pop(sid, {})):
            turn = self.ledger.turns[rid]
            turn.waiting = False
            acc.resolutions.append(
                Decision(
                    rid,
                    sid,
                    Verdict.PLACED,
                    None,
                    0,
                    0.0,
                    turn.epoch,
                    was_paused=True,
                    held_seconds=now - turn.started_at,
                    program_gone=True,
                )
            )
        replica = program.replica
        self.ledger.remove(program)
        acc.events.append(ProgramEvent(kind, sid, replica, program.token_total, now, reason))

    def _pause(self, now: float, program: Program, reason: str, acc: Acc) -> None:
        sid, replica, ledger = program.session_id, program.replica, self.ledger
        program.lifecycle = Lifecycle.PAUSED
        program.replica = None  # a paused program is never placed
        program.paused_since = now
        ledger.enqueue_paused(sid)
        self.pauses_total += 1
        ledger.recharge(program)
        tokens = program.token_total
        # The event is the whole record: its DEBUG line is rendered from it (model.transition_logs).
        acc.events.append(_new_event((EventKind.PAUSED, sid, replica, tokens, now, reason)))
        if reason == "admission_full":
            acc.logs.append(
                LogRecord(
                    INFO,
                    "thunderagent.program paused program=%s reason=admission_full tokens=%d "
                    "paused=%d" % (program.session_id, program.token_total, len(self.ledger.paused)),
                )
            )

    def _resume_onto(self, now: float, program: Program, target: ReplicaKey | None, acc: Acc, *, forced: bool) -> None:
        sid, ledger = program.session_id, self.ledger
        program.lifecycle = Lifecycle.ACTIVE
        program.paused_since = None
        ledger.paused.pop(sid, None)
        program.replica = None
        if target is not None:
            ledger.place(program, target)
        ledger.recharge(program)
        self.resumes_total += 1
        kind = EventKind.FORCED_RESUME if forced else EventKind.RESUMED
        tokens = program.token_total
        acc.events.append(_new_event((kind, sid, target, tokens, now, "")))  # and its DEBUG line: transition_logs
        waiting = ledger.waiting.pop(sid, None)
        for rid in waiting or ():
            turn = ledger.turns[rid]
            turn.waiting = False
            turn.after = program.snapshot()  # a rollback from here undoes the resume too
            decision = self._decision(now, turn, program, forced=forced)
            acc.resolutions.append(decision)
            acc.events.append(ProgramEvent(EventKind.ADMITTED, sid, target, program.token_total, now))

    def _decision(self, now: float, turn: Turn, program: Program, *, forced: bool = False) -> Decision:
        demoted = program.soft_demoted_until > now
        jump_s = (self.params.resume_priority_boost if turn.was_paused else 0.0) + (
            self.params.soft_demote_priority_jump if demoted else 0.0
        )
        replica = program.replica
        if (
            replica is not None
            and not forced
            and (self.control.may_leave_placement_to_router() or self.control.let_go(program, replica))
        ):
            # Nothing is under pressure, or the policy does not hold this context anyway: the
            # router's KV cost (overlap and live load) picks, and Bind moves the program if it
            # chose elsewhere. Pinning here only costs balance.
            replica = None
            turn.unpinned = True
        return Decision(
            turn.request_id,
            turn.session_id,
            Verdict.PLACED,
            replica,
            to_sglang_priority(jump_s),
            jump_s,
            turn.epoch,
            was_paused=turn.was_paused,
            was_soft_demoted=demoted,
            forced_resume=forced,
            held_seconds=now - turn.started_at,
        )

    def _view(self, program: Program, now: float | None) -> ProgramView:
        at = program.last_activity if now is None else now
        return ProgramView(
            session_id=program.session_id,
            parent_session_id=program.parent_session_id,
            status=program.status,
            lifecycle=program.lifecycle,
            token_total=program.token_total,
            tokens_estimated=program.tokens_estimated,
            replica=program.replica,
            marked=program.marked,
            soft_demoted=program.soft_demoted_until > at,
            turns=program.turns,
            admission_epoch=program.admission_epoch,
            created_at=program.created_at,
            last_activity=program.last_activity,
            paused_since=program.paused_since,
            children=tuple(self.ledger.children.get(program.session_id, ())),
        )


def _take_out(state: Program, turn: Turn) -> None:
    """Take `turn`'s own effects out of `state` (the program, or a snapshot of it): its count, and the
    REASONING it began if that is still its doing (no later admission, no Complete since)."""
    state.turns = max(0, state.turns - 1)
    if turn.before is not None and state.admission_epoch == turn.epoch and state.status is Status.REASONING:
        for name in _TURN_FIELDS:
            setattr(state, name, getattr(turn.before, name))
