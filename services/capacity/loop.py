"""The async shell around the pure registry: polling, recompute/publish, and watcher fan-out.

One event loop owns everything, so no locks: RPC handlers and poll completions mutate the
registry and set `_dirty`; the publisher task recomputes from a fresh snapshot, and when the
registry version moved, builds one protobuf snapshot and hands the same object to every
watcher's one-slot mailbox (a slow watcher only ever holds the latest snapshot).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Generic, TypeVar

from opentelemetry import trace

from bandmaster.capacity.v1 import capacity_pb2 as pb
from services.capacity.adapters.poller import SglangPoller
from services.capacity.adapters.proto import snapshot_to_proto
from services.capacity.core.cards import CapacityView, RetentionSettings, recompute
from services.capacity.core.registry import PollFailed, PollOk, PollResult, Registry, Transition, TransitionKind
from services.capacity.core.state import CardRejection, Expectation, Load, Origin, PollFailureReason, WorkerState
from services.capacity.metrics import CapacityMetrics
from services.capacity.transition_log import TransitionLog
from services.common.clock import Clock

log = logging.getLogger("services.capacity")

PUBLISH_COALESCE_S = 0.01
M = TypeVar("M")
MAX_RECOMPUTE_LINKS = 8  # links to the requests behind one recompute (a heartbeat storm is coalesced)


class Mailbox(Generic[M]):
    """One watcher's slot: only the newest message is kept (a workers snapshot, a router-load table)."""

    __slots__ = ("latest", "event", "closed")

    def __init__(self) -> None:
        self.latest: M | None = None
        self.event = asyncio.Event()
        self.closed = False

    def put(self, snapshot: M) -> None:
        self.latest = snapshot
        self.event.set()

    def close(self) -> None:
        self.closed = True
        self.event.set()

    async def follow(self, heartbeat_s: float) -> AsyncIterator[M | None]:
        """The newest message each time one arrives, or None after `heartbeat_s` with none (the
        watcher sends a liveness message then), until the mailbox is closed."""
        while not self.closed:
            try:
                await asyncio.wait_for(self.event.wait(), timeout=heartbeat_s)
            except TimeoutError:
                if not self.closed:
                    yield None
                continue
            self.event.clear()
            message = self.latest
            if self.closed or message is None:
                return
            yield message


class CapacityRuntime:
    def __init__(
        self,
        *,
        registry: Registry,
        retention: RetentionSettings,
        poller: SglangPoller,
        clock: Clock,
        metrics: CapacityMetrics,
        tracer: trace.Tracer,
        poll_interval_s: float,
        heartbeat_interval_s: float,
        transition_log_interval_s: float = 60.0,
    ) -> None:
        self.registry = registry
        self.retention = retention
        self.poller = poller
        self.clock = clock
        self.metrics = metrics
        self.tracer = tracer
        self.poll_interval_s = poll_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self._transitions = TransitionLog(log, transition_log_interval_s)
        self._mailboxes: set[Mailbox[pb.WorkersSnapshot]] = set()
        self._dirty = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._polls: dict[str, asyncio.Task] = {}  # in-flight poll per worker_id
        self._published: pb.WorkersSnapshot | None = None
        self._published_version = -1
        self._heartbeat: pb.WorkersSnapshot | None = None
        self._heartbeat_built_at = 0.0
        # Sampled spans of the requests (RegisterWorker, Heartbeat, ...) whose change the next recompute
        # publishes: that recompute runs in the publisher task, a trace of its own, linked to them.
        self._causes: list[trace.SpanContext] = []

    # --- lifecycle ---

    async def start(self) -> None:
        await self.poller.start()
        self.publish()
        self._tasks = [
            asyncio.create_task(self._poll_loop(), name="capacity-poll"),
            asyncio.create_task(self._publish_loop(), name="capacity-publish"),
        ]

    async def stop(self) -> None:
        """Stop loops and polls, end every watch stream. Safe to call twice."""
        self._stopping.set()
        self._dirty.set()
        for mailbox in list(self._mailboxes):
            mailbox.close()
        tasks = [*self._tasks, *self._polls.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self._polls.clear()
        await self.poller.close()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # --- operations used by the servicer ---

    def add_worker(
        self, worker_id: str, url: str, origin: Origin, expectation: Expectation = Expectation()
    ) -> WorkerState:
        state, transitions = self.registry.add(worker_id, url, origin, self.clock.monotonic(), expectation)
        self._log(transitions)
        # Published by the publisher task: a burst of registrations costs one recompute, not one each.
        self._changed_by_request()
        if self._tasks and state.worker_id not in self._polls and state.card is None:
            # A new worker should not wait a whole interval for its first card.
            self._spawn_poll(state)
        return state

    def remove_worker(self, worker_id: str) -> bool:
        state = self.registry.get(worker_id)
        transitions = self.registry.remove(worker_id)
        if not transitions:
            return False
        assert state is not None
        self.poller.forget(state.url)
        poll = self._polls.pop(worker_id, None)
        if poll is not None:
            poll.cancel()
        self._log(transitions)
        self._changed_by_request()
        return True

    def set_load(self, worker_id: str, load: Load) -> bool:
        before = self.registry.version
        known = self.registry.set_load(worker_id, load)
        if self.registry.version != before:
            self._changed_by_request()  # coalesced: a storm of heartbeats costs one recompute per loop turn
        return known

    def _changed_by_request(self) -> None:
        """The registry moved in a request: publish soon, and link that recompute to the request's span."""
        cause = trace.get_current_span().get_span_context()
        if cause.is_valid and cause.trace_flags.sampled and len(self._causes) < MAX_RECOMPUTE_LINKS:
            self._causes.append(cause)
        self._dirty.set()

    def current(self) -> pb.WorkersSnapshot:
        """The latest published snapshot, publishing first if the registry moved on."""
        if self.registry.version != self._published_version or self._published is None:
            self.publish()
        assert self._published is not None
        return self._published

    def fresh(self, heartbeat: bool = False) -> pb.WorkersSnapshot:
        """The current version rebuilt now, so liveness fields (last_success, failures) are fresh."""
        view = recompute(self.retention, self.registry.snapshot())
        return snapshot_to_proto(view, self.registry.version, self.clock.wall(), heartbeat=heartbeat)

    def heartbeat_snapshot(self) -> pb.WorkersSnapshot:
        """Shared by all watchers whose heartbeat fires within the same half interval."""
        now = time.monotonic()
        if (
            self._heartbeat is None
            or self._heartbeat.version != self.registry.version
            or now - self._heartbeat_built_at > self.heartbeat_interval_s / 2
        ):
            self.current()
            self._heartbeat = self.fresh(heartbeat=True)
            self._heartbeat_built_at = now
        return self._heartbeat

    def subscribe(self) -> Mailbox[pb.WorkersSnapshot]:
        mailbox: Mailbox[pb.WorkersSnapshot] = Mailbox()
        if self.stopping:
            mailbox.close()
        self._mailboxes.add(mailbox)
        self.metrics.watchers.set(len(self._mailboxes))
        return mailbox

    def unsubscribe(self, mailbox: Mailbox[pb.WorkersSnapshot]) -> None:
        self._mailboxes.discard(mailbox)
        self.metrics.watchers.set(len(self._mailboxes))

    # --- recompute and publish ---

    def publish(self) -> CapacityView:
        """Recompute from a fresh registry snapshot; hand a new snapshot to watchers if the version moved."""
        started = time.perf_counter()
        version = self.registry.version
        links, self._causes = [trace.Link(cause) for cause in self._causes], []
        # In a request's trace when a request publishes (ListWorkers, a watch opening); else its own trace.
        with self.tracer.start_as_current_span("capacity.recompute", links=links) as span:
            view = recompute(self.retention, self.registry.snapshot())
            changed = version != self._published_version
            if changed:
                self._published = snapshot_to_proto(view, version, self.clock.wall())
                self._published_version = version
                self.metrics.observe_view(view, version)
            span.set_attribute("capacity.version", version)
            span.set_attribute("capacity.changed", changed)
            span.set_attribute("capacity.workers", len(view.workers))
            span.set_attribute("capacity.replicas", view.replica_count)
            span.set_attribute("capacity.total_retention_tokens", view.total_retention_tokens)
        self.metrics.recompute_seconds.observe(time.perf_counter() - started)
        if changed:
            assert self._published is not None
            for mailbox in self._mailboxes:
                mailbox.put(self._published)
        return view

    async def _publish_loop(self) -> None:
        while not self.stopping:
            await self._dirty.wait()
            self._dirty.clear()
            if self.stopping:
                return
            if self.registry.version != self._published_version:
                self.publish()
                # A recompute is O(workers); under a burst (mass registration, a poll round) let
                # changes accumulate briefly. An isolated change still publishes at once.
                await asyncio.sleep(PUBLISH_COALESCE_S)

    # --- polling ---

    async def _poll_loop(self) -> None:
        while not self.stopping:
            started = time.monotonic()
            states = [s for s in self.registry.snapshot() if s.worker_id not in self._polls]
            polls = [self._spawn_poll(s) for s in states]
            if polls:
                await asyncio.gather(*polls, return_exceptions=True)
            self._log(self.registry.expire(self.clock.monotonic()))
            self._transitions.flush(self.clock.monotonic())
            self._dirty.set()
            delay = self.poll_interval_s - (time.monotonic() - started)
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=max(delay, 0.0))
            except TimeoutError:
                pass

    def _spawn_poll(self, state: WorkerState) -> asyncio.Task:
        worker_id = state.worker_id
        task = asyncio.create_task(self._poll_one(worker_id, state.url), name=f"poll-{worker_id}")
        self._polls[worker_id] = task
        task.add_done_callback(lambda t: self._poll_done(worker_id, t))
        return task

    def _poll_done(self, worker_id: str, task: asyncio.Task) -> None:
        if self._polls.get(worker_id) is task:
            del self._polls[worker_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("poll of worker %s crashed", worker_id, exc_info=task.exception())

    async def _poll_one(self, worker_id: str, url: str) -> None:
        try:
            result: PollResult = await self.poller.poll(url)
        except Exception as exc:
            # The poller turns everything a worker can do into a result; this is a bug in it. The
            # worker must still not keep its last card as if the poll had succeeded.
            log.exception("poll of worker %s failed unexpectedly", worker_id)
            result = PollFailed(PollFailureReason.ERROR, type(exc).__name__)
        self.apply(worker_id, url, result)

    def apply(self, worker_id: str, url: str, result: PollResult) -> None:
        state = self.registry.get(worker_id)
        if state is None or state.url != url:
            return  # deregistered (or re-registered elsewhere) while the poll was in flight
        if isinstance(result, PollFailed):
            self.metrics.poll_failures.labels(result.reason.value).inc()
            log.debug("poll of %s failed: %s %s", worker_id, result.reason.value, result.detail)
        transitions = self.registry.apply_poll(worker_id, result, self.clock.monotonic(), self.clock.wall())
        if (
            isinstance(result, PollOk)
            and isinstance(result.card, CardRejection)
            and any(t.kind is TransitionKind.CARD_REJECTED for t in transitions)
        ):
            self.metrics.card_rejections.labels(result.card.reason.value).inc()
        self._log(transitions)
        self._dirty.set()

    def _log(self, transitions: list[Transition]) -> None:
        self._transitions.emit(transitions, self.clock.monotonic())
