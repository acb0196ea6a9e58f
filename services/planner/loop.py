"""The planner's async shell: the tick loop and its effects, in order.

    observe (Collector, bounded by tick_max_duration) -> decide (pure core, at publication time)
      -> effects: 1. publish the lease   2. then, only if it was acknowledged, mutate replicas

An error or unknown outcome from an effect stops the later effects of that tick, with no replay:
the next tick decides afresh from a fresh observation, and meanwhile the last lease lapses by its
TTL. Advisory mode computes and logs everything and actuates nothing.

Time: tick scheduling and lease expiry use the monotonic clock; wall time is only used for
deadlines and for the timestamps other processes read (a wall-clock jump backwards neither
extends a lease nor stalls the loop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from opentelemetry import trace

from services.common.clock import Clock
from services.planner.adapters.connectors import Connector, ConnectorRefused
from services.planner.adapters.lease_store import LeaseRejected, LeaseStore, LeaseStoreError
from services.planner.adapters.observe import Collector
from services.planner.core.tick import TickDecision, TickSettings, TickState, decide
from services.planner.core.types import Lease, LeaseDecision, Observation
from services.planner.metrics import PlannerMetrics

log = logging.getLogger("services.planner")
EFFECT_FAILURES = ("lease_failed", "lease_unknown", "scale_failed", "scale_unknown")


@dataclass
class TickRecord:
    """The last tick, for GetPlan."""

    decision: TickDecision
    observation: Observation
    advisory: bool
    effects_outcome: str
    effects_error: str = ""
    lease: Lease | None = None
    tick_seconds: float = 0.0

    @property
    def fail_closed(self) -> tuple[str, ...]:
        """Why this tick failed closed: the decision's reasons, and an effect that was not applied
        (a lease that could not be written leaves batches at 0 rps as surely as a zero lease)."""
        if self.effects_outcome in EFFECT_FAILURES:
            return (*self.decision.fail_closed, self.effects_outcome)
        return self.decision.fail_closed


@dataclass
class LeaseBoard:
    """The current lease and the WatchLease subscribers (each wakes on every new lease)."""

    lease: Lease | None = None
    version: int = 0
    _waiters: set = field(default_factory=set)

    def set(self, lease: Lease) -> None:
        self.lease = lease
        self.version += 1
        for event in list(self._waiters):
            event.set()

    def subscribe(self) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters.add(event)
        return event

    def unsubscribe(self, event: asyncio.Event) -> None:
        self._waiters.discard(event)


class PlannerRuntime:
    def __init__(
        self,
        *,
        settings: TickSettings,
        collector: Collector,
        store: LeaseStore,
        connector: Connector,
        clock: Clock,
        metrics: PlannerMetrics,
        tracer: trace.Tracer,
        interval_s: float,
        tick_max_duration_s: float,
        effect_timeout_s: float,
        advisory: bool = False,
        on_lease: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.collector = collector
        self.store = store
        self.connector = connector
        self.clock = clock
        self.metrics = metrics
        self.tracer = tracer
        self.interval_s = interval_s
        self.tick_max_duration_s = tick_max_duration_s
        self.effect_timeout_s = effect_timeout_s
        self.advisory = advisory
        self.on_lease = on_lease
        self.state = TickState()
        self.board = LeaseBoard()
        self.last: TickRecord | None = None
        self.ticks = 0
        self.lease_failing_since: int | None = None
        """The tick whose lease write first failed, while writes keep failing (None when the last one applied)."""
        self.ready = False
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()

    @property
    def pool_id(self) -> str:
        return self.settings.batch.pool_id

    def _zero(self, prefix: str) -> LeaseDecision:
        return LeaseDecision(
            self.pool_id, 0.0, self.settings.batch.drain_lease_duration_s, f"{prefix}-{time.time_ns()}"
        )

    async def start_lease(self) -> None:
        """First thing at start-up: a zero-rate lease replaces whatever a previous process left.
        Raises LeaseStoreError when the store cannot be reached (the service refuses to start)."""
        if self.advisory:
            log.info("advisory mode: no lease is written and nothing is scaled")
            self.ready = True
            return
        lease = await asyncio.wait_for(
            self.store.start(self._zero("planner-startup"), self.clock.monotonic(), self.clock.wall()),
            self.effect_timeout_s,
        )
        self._published(lease)
        log.info("start-up zero lease published to the %s store (writer epoch %d)", self.store.name, lease.writer_epoch)
        self.ready = True

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="planner-tick")

    async def stop(self) -> None:
        """Stop ticking, then a best-effort zero lease (the shutdown pause)."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if not self.advisory and self.ready:
            try:
                lease = await asyncio.wait_for(
                    self.store.publish(self._zero("planner-shutdown"), self.clock.monotonic(), self.clock.wall()),
                    max(1.0, self.effect_timeout_s),
                )
                self._published(lease)
                log.info("shutdown zero lease published")
            except Exception as exc:
                log.warning("shutdown zero lease not published (%s); the last lease lapses by its TTL", exc)

    async def _run(self) -> None:
        next_at = self.clock.monotonic()
        while not self._stopping.is_set():
            try:
                await self.tick_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("planner tick crashed")
            next_at = max(next_at + self.interval_s, self.clock.monotonic())
            try:
                await asyncio.wait_for(self._stopping.wait(), max(0.0, next_at - self.clock.monotonic()))
            except TimeoutError:
                pass

    async def tick_once(self) -> TickRecord:
        started = time.perf_counter()
        self.ticks += 1
        with self.tracer.start_as_current_span("planner.tick") as span:
            pipeline_error = None
            try:
                obs = await asyncio.wait_for(self.collector.collect(), self.tick_max_duration_s)
            except TimeoutError:
                pipeline_error = "tick_timeout"
                obs = Observation(self.clock.monotonic(), self.clock.wall(), None, errors=("tick timeout",))
            except Exception as exc:
                pipeline_error = "pipeline_failed"
                obs = Observation(
                    self.clock.monotonic(), self.clock.wall(), None, errors=(f"observe: {type(exc).__name__}: {exc}",)
                )
            decision_id = f"d-{obs.now_wall_s:.3f}-{self.ticks}"
            # Decide at publication time: freshness is judged and the lease stamped now.
            decision, self.state = decide(
                obs,
                self.settings,
                self.state,
                decision_id,
                now_s=self.clock.monotonic(),
                now_wall_s=self.clock.wall(),
                pipeline_error=pipeline_error,
            )
            record = await self._effects(decision, obs)
            record.tick_seconds = time.perf_counter() - started
            self._observe(record)
            span.set_attribute("planner.action", decision.action)
            span.set_attribute("planner.lease_rps", decision.lease.max_admission_rps)
            span.set_attribute("planner.scale_to", -1 if decision.scale_to is None else decision.scale_to)
            span.set_attribute("planner.fail_closed", ",".join(decision.fail_closed))
            span.set_attribute("planner.effects", record.effects_outcome)
        self.last = record
        return record

    async def _effects(self, d: TickDecision, obs: Observation) -> TickRecord:
        if self.advisory:
            return TickRecord(d, obs, True, "advisory")
        # 1. The lease first.
        publish_started = time.perf_counter()
        try:
            lease = await asyncio.wait_for(
                self.store.publish(d.lease, self.clock.monotonic(), self.clock.wall()), self.effect_timeout_s
            )
        except LeaseRejected as exc:
            self.metrics.effects.labels("lease", "failed").inc()
            return self._lease_failed(d, obs, "lease_failed", exc)
        except (LeaseStoreError, TimeoutError, OSError) as exc:
            self.metrics.effects.labels("lease", "unknown").inc()
            return self._lease_failed(d, obs, "lease_unknown", exc)
        self.metrics.lease_publish_seconds.observe(time.perf_counter() - publish_started)
        self.metrics.effects.labels("lease", "applied").inc()
        if self.lease_failing_since is not None:
            log.info(
                "lease writes to the %s store applied again after %d failed tick(s); no longer failing closed",
                self.store.name,
                self.ticks - self.lease_failing_since,
            )
            self.lease_failing_since = None
        self.metrics.lease_fail_closed.set(0)
        self._published(lease)
        # 2. Then the replicas.
        if d.scale_to is not None:
            try:
                await asyncio.wait_for(self.connector.scale_to(d.scale_to), self.effect_timeout_s)
            except ConnectorRefused as exc:
                self.metrics.effects.labels("scale", "failed").inc()
                return self._stopped(d, obs, "scale_failed", exc, lease)
            except Exception as exc:
                self.metrics.effects.labels("scale", "unknown").inc()
                return self._stopped(d, obs, "scale_unknown", exc, lease)
            self.metrics.effects.labels("scale", "applied").inc()
            direction = "up" if d.desired is None or d.scale_to > d.desired else "down"
            self.metrics.scale_actions.labels(direction).inc()
            log.info("scaled pool %s to %d replicas (%s; was %s)", self.pool_id, d.scale_to, d.action, d.desired)
        return TickRecord(d, obs, False, "applied", lease=lease)

    def _lease_failed(self, d: TickDecision, obs: Observation, outcome: str, exc: BaseException) -> TickRecord:
        """The lease could not be written: fail closed (no scaling; the last lease lapses, so batches
        go to 0 rps), reported as such until a write is applied again (GetPlan, the gauge, one log
        line when it starts; per-tick lines at DEBUG)."""
        self.metrics.lease_fail_closed.set(1)
        first = self.lease_failing_since is None
        if first:
            self.lease_failing_since = self.ticks
        return self._stopped(d, obs, outcome, exc, level=logging.WARNING if first else logging.DEBUG)

    def _stopped(
        self,
        d: TickDecision,
        obs: Observation,
        outcome: str,
        exc: BaseException,
        lease: Lease | None = None,
        *,
        level: int = logging.WARNING,
    ) -> TickRecord:
        self.metrics.fail_closed.labels(outcome).inc()
        log.log(
            level,
            "tick %s: %s (%s: %s); failing closed: no further effects this tick, the last lease lapses by its TTL",
            d.decision_id,
            outcome,
            type(exc).__name__,
            exc,
        )
        return TickRecord(d, obs, False, outcome, f"{type(exc).__name__}: {exc}", lease=lease)

    def _published(self, lease: Lease) -> None:
        self.board.set(lease)
        self.metrics.lease_rps.set(lease.max_admission_rps)
        self.metrics.lease_valid_until.set(lease.valid_until_unix_ms / 1000)
        self.metrics.lease_sequence.set(lease.writer_sequence)
        self.on_lease()

    def _observe(self, r: TickRecord) -> None:
        d = r.decision
        m = self.metrics
        m.ticks.labels(d.action).inc()
        m.tick_seconds.observe(r.tick_seconds)
        m.target_replicas.set(-1 if d.target is None else d.target)
        inv = r.observation.inventory
        m.ready_replicas.set(-1 if inv is None else inv.ready)
        m.replica_floor.set(-1 if d.plan.replica_floor is None else d.plan.replica_floor)
        for reason in d.fail_closed:
            m.fail_closed.labels(reason).inc()
        previous = self.last.decision if self.last else None
        summary = (d.action, d.lease.max_admission_rps, d.scale_to, d.fail_closed, d.plan.replica_floor)
        before = (
            None
            if previous is None
            else (
                previous.action,
                previous.lease.max_admission_rps,
                previous.scale_to,
                previous.fail_closed,
                previous.plan.replica_floor,
            )
        )
        # INFO on transitions, DEBUG otherwise (never a line per tick when nothing changes).
        level = logging.INFO if summary != before or d.scale_to is not None else logging.DEBUG
        log.log(
            level,
            "tick %s: action=%s lease=%.3g rps floor=%s idle_target=%s target=%s scale_to=%s "
            "fail_closed=%s effects=%s%s",
            d.decision_id,
            d.action,
            d.lease.max_admission_rps,
            d.plan.replica_floor,
            d.plan.idle_replica_target,
            d.target,
            d.scale_to,
            ",".join(d.fail_closed) or "-",
            r.effects_outcome,
            f" errors={'; '.join(r.observation.errors)}" if r.observation.errors else "",
        )
        if self.advisory:
            for line in d.audit:
                log.info("advisory: %s", line)
