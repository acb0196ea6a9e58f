"""The async shell around the pure scheduler core: tick loop, held admissions, resume timers, events.

One event loop owns everything and the core is synchronous, so calls are serialised without
locks: nothing awaits between a core call and the publishing of the `Effects` it returned.

- Held admissions: `admit` returns at once with the core's decision; a WAIT registers a future
  that a later resolution (resume, forced resume, release, expiry) completes. Whoever holds a
  future calls `cancel` in `finally` if it gives up, which rolls the admission back in the core.
- Resume timers: each held admission has a forced-resume deadline (`core.resume_deadline`) on the
  injected clock. A timer task sleeps until the earliest one and calls `core.force_resume`; tests
  on a FakeClock advance the clock and call `wake_timers()` (or `fire_due_resumes()` directly).
- Tick loop: every `scheduler_interval_seconds`, `core.expire_leases(now)` (turns whose router
  stopped renewing them end as if cancelled) then `core.tick(now)`, in one `scheduler.tick` span. A
  failing tick is logged with its exception and retried next interval; the loop never stops.
- Events fan out to WatchEvents subscribers through bounded queues: a slow watcher loses its
  oldest events and never blocks the tick.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import heapq
import logging
import time
from typing import TYPE_CHECKING, Callable

from opentelemetry import trace

from services.common.clock import Clock
from services.common.process import heap
from services.scheduler.core import (
    AdmitResult,
    CapacitySnapshot,
    Decision,
    Effects,
    EventKind,
    ProgramEvent,
    ReplicaKey,
    SchedulerCore,
    TickResult,
    TurnOutcome,
    Verdict,
    transition_logs,
)
from services.scheduler.metrics import SchedulerMetrics

if TYPE_CHECKING:
    from services.scheduler.persist import Recovery

log = logging.getLogger("services.scheduler")
# The core's own records (`scheduler.tick ...`, `thunderagent.program ...`, DEBUG per program).
core_log = logging.getLogger("services.scheduler.control")

DEFAULT_WATCH_QUEUE = 1024
STOP_TIMEOUT_S = 1.0
"""How long `stop` waits for its loops to end once cancelled (they end at once; this only bounds a bug)."""


class ShuttingDown(Exception):
    """The scheduler is stopping; a held admission was rolled back (gRPC: UNAVAILABLE)."""


class EventQueue:
    """One WatchEvents subscriber: bounded, drop-oldest; the kinds it excluded are never queued (the
    publisher leaves them out, once per distinct exclusion: `wanted`)."""

    __slots__ = ("events", "wake", "closed", "dropped", "excluded")

    def __init__(self, maxlen: int, excluded: frozenset[EventKind] = frozenset()) -> None:
        self.events: collections.deque[ProgramEvent] = collections.deque(maxlen=maxlen)
        self.wake = asyncio.Event()
        self.closed = False
        self.dropped = 0
        self.excluded = excluded

    def put(self, events: tuple[ProgramEvent, ...]) -> int:
        """Queue `events`, which hold none of the kinds this queue excludes; returns how many it dropped."""
        overflow = max(0, len(self.events) + len(events) - (self.events.maxlen or 0))
        self.events.extend(events)
        self.dropped += overflow
        self.wake.set()
        return overflow

    def close(self) -> None:
        self.closed = True
        self.wake.set()


def wanted(events: tuple[ProgramEvent, ...], excluded: frozenset[EventKind]) -> tuple[ProgramEvent, ...]:
    """`events` without the `excluded` kinds."""
    return tuple(e for e in events if e.kind not in excluded) if excluded else events


class SchedulerRuntime:
    def __init__(
        self,
        core: SchedulerCore,
        *,
        clock: Clock,
        metrics: SchedulerMetrics,
        tracer: trace.Tracer,
        interval_s: float,
        watch_queue: int = DEFAULT_WATCH_QUEUE,
        may_decide: Callable[[], bool] | None = None,
    ) -> None:
        """`may_decide`: checked before each tick (leader election: a replica whose lease lapsed makes no
        control decision, even before its election loop has run to end the term)."""
        self.core = core
        self.may_decide = may_decide
        self.clock = clock
        self.metrics = metrics
        self.tracer = tracer
        self.interval_s = interval_s
        self.watch_queue = watch_queue
        self._held: dict[str, asyncio.Future[Decision]] = {}
        self._held_since: dict[str, float] = {}
        # Per-program admission gate: while one admission of a program is held, the next waits here.
        self._gates: dict[str, tuple[str, asyncio.Event]] = {}
        self._held_session: dict[str, str] = {}
        self.gate_waiting = 0  # admissions waiting behind a held turn of the same program
        self._deadlines: list[tuple[float, str]] = []
        self._timer_wake = asyncio.Event()
        self._subscribers: set[EventQueue] = set()
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self.stop_reason = "scheduler is shutting down"
        self.ticks = 0
        self.capacity_received = False
        self.recovery: Recovery | None = None  # persist.Recovery when the table was recovered from a store at start
        metrics.watch_core(core, clock.monotonic, lambda: len(self._held))

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, tick_loop: bool = True) -> None:
        self._tasks.append(asyncio.create_task(self._timer_loop(), name="scheduler-resume-timers"))
        if tick_loop:
            self._tasks.append(asyncio.create_task(self._tick_loop(), name="scheduler-tick"))

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def stop(self, reason: str = "scheduler is shutting down") -> None:
        """Release held admissions with ShuttingDown (rolled back), stop loops, end event streams.
        `reason` is what the held callers are told (a deposed leader says so: they retry elsewhere)."""
        if self._stopping:
            return
        self._stopping = True
        self.stop_reason = reason
        now = self.clock.monotonic()
        for request_id, future in list(self._held.items()):
            self._held.pop(request_id, None)
            self._observe_hold(request_id, "shutdown")
            self._publish(self.core.cancel_admission(now, request_id))
            if not future.done():
                future.set_exception(ShuttingDown(reason))
        for _, event in list(self._gates.values()):
            event.set()
        self._gates.clear()
        for queue in list(self._subscribers):
            queue.close()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: both loops also end on `_stopping`, but a stop must never wait on a task for ever.
            _, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            if pending:
                log.warning(
                    "scheduler stop: %s did not end within %gs of its cancellation; going on",
                    ", ".join(sorted(task.get_name() for task in pending)),
                    STOP_TIMEOUT_S,
                )

    # ------------------------------------------------------------------ operations (servicer)

    def admit(
        self,
        session_id: str,
        parent_session_id: str,
        estimated_prompt_tokens: int,
        request_id: str,
        *,
        dispatched: bool = False,
        dispatched_replica: ReplicaKey | None = None,
    ) -> AdmitResult:
        """The core's decision now. On WAIT the admission is held: `wait(request_id)` returns its
        resolution, and the caller must `cancel(request_id)` if it stops waiting."""
        if self._stopping:
            raise ShuttingDown(self.stop_reason)
        if self.gated(session_id) and not dispatched:
            # Only `pass_gate` may lead here for a gated program, and it returns with the gate open;
            # replacing a held turn's gate would strand everything waiting behind it. (A dispatched turn
            # runs already: it never waits, and never replaces a gate, since it is never held.)
            raise RuntimeError(f"admission of {session_id!r} bypassed the per-program gate")
        now = self.clock.monotonic()
        result = self.core.admit(
            now,
            session_id,
            parent_session_id,
            estimated_prompt_tokens,
            request_id,
            dispatched=dispatched,
            dispatched_replica=dispatched_replica,
        )
        if result.decision.request_id == request_id and result.decision.verdict is Verdict.WAIT:
            self._held[request_id] = asyncio.get_running_loop().create_future()
            self._held_since[request_id] = now
            self._gates[session_id] = (request_id, asyncio.Event())
            self._held_session[request_id] = session_id
            deadline = self.core.resume_deadline(request_id)
            if deadline is not None:
                heapq.heappush(self._deadlines, (deadline, request_id))
                self._timer_wake.set()
        self._publish(result.effects)
        return result

    def gated(self, session_id: str) -> bool:
        return bool(session_id) and session_id in self._gates

    async def pass_gate(self, session_id: str) -> None:
        """Wait while another admission of this program is held (the reference's per-program gate), so
        that a program's turns are admitted one at a time and each rollback restores the previous
        admission's state. Nothing to undo if the caller gives up here."""
        self.gate_waiting += 1
        try:
            while session_id and session_id in self._gates:
                if self._stopping:
                    raise ShuttingDown(self.stop_reason)
                await self._gates[session_id][1].wait()
        finally:
            self.gate_waiting -= 1

    def _open_gate(self, request_id: str) -> None:
        session_id = self._held_session.pop(request_id, None)
        if session_id is None:
            return
        gate = self._gates.get(session_id)
        if gate is not None and gate[0] == request_id:
            del self._gates[session_id]
            gate[1].set()

    def wait(self, request_id: str) -> asyncio.Future[Decision]:
        """The resolution of a held admission, to await. Taken at once (a tick may resolve the admission
        before the caller awaits it). Cancelling the wait leaves the admission held; the caller rolls back."""
        future = self._held.get(request_id)
        if future is None:
            raise KeyError(request_id)
        return asyncio.shield(future)

    def cancel(self, request_id: str) -> None:
        """Roll an admission back (client gone, deadline passed). Idempotent; never awaits."""
        if request_id in self._held:
            self._held.pop(request_id)
            self._observe_hold(request_id, "cancelled")
        self._publish(self.core.cancel_admission(self.clock.monotonic(), request_id))

    def bind(self, request_id: str, replica: ReplicaKey) -> bool:
        return self.core.bind_request(request_id, replica)

    def renew_leases(self, request_ids: list[str], delivered: tuple[str, ...] | list[str] = ()) -> tuple[str, ...]:
        """Renew the named tickets' leases (confirm the `delivered` ones); returns the ids with no ticket."""
        return self.core.renew_leases(self.clock.monotonic(), request_ids, delivered)

    def complete(
        self,
        session_id: str,
        request_id: str,
        replica: ReplicaKey | None,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        outcome: TurnOutcome,
        *,
        ttft_s: float | None = None,
    ) -> None:
        """End a turn. Idempotent: a request id without a ticket (completed already, expired, unknown)
        is ignored and counted by the core, and changes nothing."""
        effects = self.core.complete(
            self.clock.monotonic(),
            session_id,
            request_id,
            replica,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            outcome,
            ttft_s=ttft_s,
        )
        self._publish(effects)

    def release(self, session_id: str) -> bool:
        released, effects = self.core.release(self.clock.monotonic(), session_id)
        self._publish(effects)
        return released

    def apply_capacity(self, snapshot: CapacitySnapshot) -> None:
        self._publish(self.core.apply_capacity(self.clock.monotonic(), snapshot))
        self.capacity_received = True
        self.metrics.capacity_snapshots.inc()

    def subscribe(self, excluded: frozenset[EventKind] = frozenset()) -> EventQueue:
        """A subscriber's queue; `excluded`: the event kinds it does not want."""
        queue = EventQueue(self.watch_queue, excluded)
        if self._stopping:
            queue.close()
        self._subscribers.add(queue)
        self.metrics.watchers.set(len(self._subscribers))
        return queue

    def unsubscribe(self, queue: EventQueue) -> None:
        self._subscribers.discard(queue)
        self.metrics.watchers.set(len(self._subscribers))

    @property
    def held_count(self) -> int:
        return len(self._held)

    def is_held(self, request_id: str) -> bool:
        return request_id in self._held

    # ------------------------------------------------------------------ tick

    def tick_once(self) -> TickResult | None:
        """One control step (also the tests' hook). Returns None if the core raised (or may not decide)."""
        if self.may_decide is not None and not self.may_decide():
            return None
        started = time.perf_counter()
        with self.tracer.start_as_current_span("scheduler.tick") as span:
            try:
                now = self.clock.monotonic()
                self._publish(self.core.expire_leases(now))
                result = self.core.tick(now)
            except Exception as exc:
                self.metrics.tick_failures.inc()
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
                log.exception("scheduler tick failed; retrying next interval")
                return None
            self._publish(Effects(result.events, result.logs, result.resolutions))
            self.ticks += 1
            span.set_attribute("scheduler.paused", result.paused)
            span.set_attribute("scheduler.marked", result.marked)
            span.set_attribute("scheduler.resumed", result.resumed)
            span.set_attribute("scheduler.forced", result.forced)
            span.set_attribute("scheduler.expired", result.expired)
            span.set_attribute("scheduler.replicas", len(result.replicas))
            span.set_attribute("scheduler.held_admissions", len(self._held))
        self.metrics.tick_seconds.observe(time.perf_counter() - started)
        return result

    def _settle_heap(self) -> None:
        """Before a tick: freeze what the table grew by, if it grew enough (heap.settle_if_grown; a
        no-op unless the process's main settled its heap), so the tick meets no collection of it."""
        started = time.perf_counter()
        programs = len(self.core.ledger.programs)
        if heap.settle_if_grown(programs):
            log.info(
                "scheduler.heap settled programs=%d frozen=%d in %.1f ms",
                programs,
                gc.get_freeze_count(),
                (time.perf_counter() - started) * 1e3,
            )

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.interval_s
        while not self._stopping:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            self._settle_heap()
            self.tick_once()
            # Fixed rate; after a stall, skip missed ticks instead of bunching them.
            next_at = max(next_at + self.interval_s, loop.time())

    # ------------------------------------------------------------------ forced-resume timers

    def wake_timers(self) -> None:
        """Re-evaluate the earliest forced-resume deadline (after a FakeClock moved)."""
        self._timer_wake.set()

    def fire_due_resumes(self) -> int:
        """Force-resume every held admission whose deadline has passed on the injected clock."""
        now = self.clock.monotonic()
        fired = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            _, request_id = heapq.heappop(self._deadlines)
            if request_id not in self._held:
                continue  # resolved or cancelled meanwhile
            deadline = self.core.resume_deadline(request_id)
            if deadline is None:
                continue
            if deadline > now:
                heapq.heappush(self._deadlines, (deadline, request_id))
                continue
            self._publish(self.core.force_resume(now, request_id))
            fired += 1
        return fired

    async def _timer_loop(self) -> None:
        while not self._stopping:
            self._timer_wake.clear()
            delay = None
            if self._deadlines:
                delay = max(0.0, self._deadlines[0][0] - self.clock.monotonic())
            try:
                await asyncio.wait_for(self._timer_wake.wait(), timeout=delay)
            except TimeoutError:
                pass
            try:
                self.fire_due_resumes()
            except Exception:
                log.exception("forced resume failed; the next tick retries it")

    # ------------------------------------------------------------------ publishing

    def _publish(self, effects: Effects) -> None:
        for record in effects.logs:
            core_log.log(record.level, "%s", record.message)
        if core_log.isEnabledFor(logging.DEBUG):
            for record in transition_logs(effects.events):
                core_log.log(record.level, "%s", record.message)
        if effects.events and self._subscribers:
            # The subscribers share a few exclusions (every router process leaves out the same kinds):
            # each is applied once per publish, not once per subscriber.
            by_exclusion: dict[frozenset[EventKind], tuple[ProgramEvent, ...]] = {}
            for queue in self._subscribers:
                events = by_exclusion.get(queue.excluded)
                if events is None:
                    events = by_exclusion[queue.excluded] = wanted(effects.events, queue.excluded)
                if events:
                    dropped = queue.put(events)
                    if dropped:
                        self.metrics.watch_dropped.inc(dropped)
        for decision in effects.resolutions:
            future = self._held.pop(decision.request_id, None)
            if future is None:
                continue
            if decision.program_gone:
                outcome = "released"
            elif decision.forced_resume:
                outcome = "forced"
            else:
                outcome = "resumed"
            self._observe_hold(decision.request_id, outcome)
            if not future.done():
                future.set_result(decision)

    def _observe_hold(self, request_id: str, outcome: str) -> None:
        self._open_gate(request_id)
        since = self._held_since.pop(request_id, None)
        if since is not None:
            self.metrics.hold_seconds.labels(outcome).observe(max(0.0, self.clock.monotonic() - since))
