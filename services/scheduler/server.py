"""Composition root: config -> core, runtime, capacity watch, servicer, ServiceHost.

Without leader election the table is recovered before anything is served and one runtime decides for
the life of the process. With it (`--leader-election`, services/scheduler/election.py) the process
serves at once as a standby; each leadership term it wins rebuilds a core from the store and runs it
until the term ends. The capacity watch runs for the life of the process either way, so that a standby
that takes over places programs with the current fleet at once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from bandmaster.capacity.v1 import capacity_pb2_grpc as cap_pb_grpc
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.common.auth.redact import redact_url
from services.common.clock import Clock, SystemClock
from services.common.observe.telemetry import Telemetry
from services.common.outbound.capacity_watch import CapacityWatch
from services.common.serve.grpc_server import ServiceHost
from services.common.settings.errors import ConfigError
from services.scheduler import native
from services.scheduler.adapters.proto import capacity_from_proto
from services.scheduler.adapters.state_store import (
    RedisStateStore,
    SqliteStateStore,
    StateStore,
    StoreError,
    StoreLocked,
)
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore, compiled, make_pause_policy
from services.scheduler.core.state import CoreState
from services.scheduler.election import Election, SingleReplica, Term
from services.scheduler.loop import SchedulerRuntime
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.persist import StatePersister
from services.scheduler.servicer import SERVICE_NAME, SchedulerServicer

log = logging.getLogger("services.scheduler")


@dataclass
class RunningScheduler:
    host: ServiceHost
    runtime: SchedulerRuntime | None
    """The deciding runtime (with leader election: the current term's, None while standing by)."""
    follower: CapacityWatch
    config: SchedulerConfig
    persister: StatePersister | None = None
    election: Election | None = None

    @property
    def address(self) -> str:
        return self.host.address

    @property
    def core(self) -> SchedulerCore:
        assert self.runtime is not None, "a standby has no table"
        return self.runtime.core

    async def stop(self) -> None:
        await self.host.stop()


async def start_scheduler(
    config: SchedulerConfig,
    *,
    clock: Clock | None = None,
    telemetry: Telemetry | None = None,
    capacity_stub: Any = None,
    tick_loop: bool = True,
    capacity_idle_timeout_s: float = 60.0,
) -> RunningScheduler:
    """Build and start the service; returns once it serves gRPC.

    `capacity_stub` replaces the channel to `config.capacity_addr` (tests). `tick_loop=False`
    leaves ticking to the caller (`running.runtime.tick_once()`), for FakeClock-driven tests.
    """
    clock = clock or SystemClock()
    if config.leader_election:
        return await _start_replica(
            config,
            clock=clock,
            telemetry=telemetry,
            capacity_stub=capacity_stub,
            tick_loop=tick_loop,
            capacity_idle_timeout_s=capacity_idle_timeout_s,
        )
    host, tracer, metrics = _host(config, telemetry)
    metrics.leader.set(1)  # a single scheduler always decides
    core = SchedulerCore(
        config.control,
        make_pause_policy(config.pause_policy, config.pause_policy_params()),
        ticket_lease_seconds=config.ticket_lease_seconds,
    )
    runtime = SchedulerRuntime(
        core, clock=clock, metrics=metrics, tracer=tracer, interval_s=config.control.scheduler_interval_seconds
    )
    # The table is recovered before anything is served: no RPC ever sees it half-built.
    persister = await _recover_state(config, core, clock, metrics)
    runtime.recovery = persister.recovery if persister is not None else None
    channel = None
    if capacity_stub is None:
        channel = config.security.channel(config.capacity_addr)
        capacity_stub = cap_pb_grpc.CapacityStub(channel)
    follower = CapacityWatch(
        capacity_stub,
        lambda snapshot: runtime.apply_capacity(capacity_from_proto(snapshot)),
        address=config.capacity_addr,
        logger=logging.getLogger("services.scheduler.capacity"),
        on_connected=lambda up: metrics.capacity_connected.set(1 if up else 0),
        on_failure=metrics.capacity_reconnects.inc,
        idle_timeout_s=capacity_idle_timeout_s,
        name="scheduler-capacity-watch",
    )
    replica = SingleReplica(runtime, lambda: config.advertise_addr or host.address)
    pb_grpc.add_SchedulerServicer_to_server(
        SchedulerServicer(replica, config.kv_router, tracer, mux_streams=metrics.admit_mux_streams), host.server
    )
    host.add_service(SERVICE_NAME)

    async def stop_components() -> None:
        # Health is NOT_SERVING by now: release held Admits (UNAVAILABLE), then stop the loops,
        # then write the last batch of state (rolled-back admissions included).
        await runtime.stop()
        await follower.stop()
        if persister is not None:
            await persister.stop()
        if channel is not None:
            await channel.close()

    host.on_stop(stop_components)
    runtime.start(tick_loop=tick_loop)
    follower.start()
    if persister is not None:
        persister.start()
    try:
        await host.start()
    except BaseException:
        await stop_components()
        raise
    c = config.control
    log.info(
        "scheduler started (interval=%ss, pause=%.2f, soft=%.2f, target=%.2f, margin quantile=%.2f, policy=%s, "
        "capacity=%s, "
        "state=%s, ticket lease=%gs, core=%s)",
        c.scheduler_interval_seconds,
        c.pause_threshold,
        c.soft_demote_threshold,
        c.pause_target,
        c.pause_margin_quantile,
        config.pause_policy,
        config.capacity_addr,
        persister.store.description if persister is not None else "memory",
        config.ticket_lease_seconds,
        native.describe(),
    )
    host.write_ready_file(config.ready_file)
    return RunningScheduler(host, runtime, follower, config, persister)


def _state_store(config: SchedulerConfig) -> StateStore | None:
    if config.state_store == "redis":
        return RedisStateStore(config.state_redis_url, config.state_redis_prefix, config.state_write_timeout_seconds)
    if config.state_store == "sqlite" and config.state_path:  # sqlite implies a path
        return SqliteStateStore(config.state_path, shared=config.leader_election)
    return None


def _open_store(config: SchedulerConfig) -> StateStore:
    field = "state_redis_url" if config.state_store == "redis" else "state_path"
    try:
        store = _state_store(config)
    except ImportError as exc:  # the `redis` package is an optional dependency
        raise ConfigError(
            field,
            redact_url(config.state_redis_url),
            f"the Redis store needs the `redis` package ({exc.name} is not installed)",
        ) from None
    assert store is not None  # leader election refuses the in-memory table
    return store


async def _recover_state(
    config: SchedulerConfig, core: SchedulerCore, clock: Clock, metrics: SchedulerMetrics
) -> StatePersister | None:
    """Open the configured store and rebuild the table from it. A store that cannot be opened or read
    is a ConfigError naming the setting (the service then exits 2 rather than start with no table)."""
    field = "state_redis_url" if config.state_store == "redis" else "state_path"
    try:
        store = _state_store(config)
    except ImportError as exc:  # the `redis` package is an optional dependency
        raise ConfigError(
            field,
            redact_url(config.state_redis_url),
            f"the Redis store needs the `redis` package ({exc.name} is not installed)",
        ) from None
    if store is None:
        return None
    persister = StatePersister(
        core,
        store,
        clock,
        metrics,
        flush_s=config.state_flush_seconds,
        write_timeout_s=config.state_write_timeout_seconds,
    )
    try:
        await store.open()
        await persister.recover(config.state_load_timeout_seconds)
    except StoreLocked as exc:
        await store.close()
        raise ConfigError(field, store.description, f"{exc}; give each scheduler its own state") from None
    except (StoreError, ValueError) as exc:
        await store.close()
        raise ConfigError(field, store.description, str(exc)) from None
    return persister


def _host(config: SchedulerConfig, telemetry: Telemetry | None):
    """The service host, tracer and metrics every scheduler process has, single or one of several replicas.

    A process that exports no spans (no OTLP endpoint, no trace file or console) records none: spans nobody
    reads were a third of the CPU of an Admit+Complete, on the critical path of every turn
    (docs/scheduler.md, "Admission cost"), and no call of the scheduler's makes an outbound call on a turn's
    behalf that they could be the parent of. With tracing exported, every call has its spans as before."""
    tracing = telemetry is None or telemetry.exporting
    host = ServiceHost(
        "scheduler",
        listen=config.listen,
        metrics_port=config.metrics_port,
        telemetry=telemetry,
        shutdown_grace_seconds=config.shutdown_grace_seconds,
        security=config.security,
        trace_calls=tracing,
    )
    if not tracing:
        tracer: trace.Tracer = trace.NoOpTracer()
    elif telemetry is not None:
        tracer = telemetry.tracer("services.scheduler")
    else:
        tracer = trace.get_tracer("services.scheduler")
    metrics = SchedulerMetrics(host.registry)
    metrics.core_compiled.set(1 if compiled() else 0)
    return host, tracer, metrics


async def _start_replica(
    config: SchedulerConfig,
    *,
    clock: Clock,
    telemetry: Telemetry | None,
    capacity_stub: Any,
    tick_loop: bool,
    capacity_idle_timeout_s: float,
) -> RunningScheduler:
    """One of several replicas on a shared store: serve at once as a standby; lead when the lease is won."""
    host, tracer, metrics = _host(config, telemetry)
    metrics.leader.set(0)
    store = _open_store(config)
    field = "state_redis_url" if config.state_store == "redis" else "state_path"
    try:
        await store.open()
    except StoreError as exc:
        await store.close()
        raise ConfigError(field, store.description, str(exc)) from None
    last_capacity: list[Any] = []
    running_ref: list[RunningScheduler] = []

    async def build_term(epoch: int, may_decide, retained: CoreState | None) -> Term:
        core = SchedulerCore(
            config.control,
            make_pause_policy(config.pause_policy, config.pause_policy_params()),
            ticket_lease_seconds=config.ticket_lease_seconds,
        )
        runtime = SchedulerRuntime(
            core,
            clock=clock,
            metrics=metrics,
            tracer=tracer,
            interval_s=config.control.scheduler_interval_seconds,
            may_decide=may_decide,
        )
        persister = StatePersister(
            core,
            store,
            clock,
            metrics,
            flush_s=config.state_flush_seconds,
            write_timeout_s=config.state_write_timeout_seconds,
            epoch=epoch,
            on_fenced=lambda: election.fenced(epoch),
        )
        await persister.recover(config.state_load_timeout_seconds, retained)
        runtime.recovery = persister.recovery
        if last_capacity:
            runtime.apply_capacity(last_capacity[-1])
        runtime.start(tick_loop=tick_loop)
        persister.start()
        return Term(epoch, runtime, persister, clock.monotonic())

    def on_term(term: Term | None) -> None:
        if running_ref:
            running_ref[0].runtime = term.runtime if term is not None else None
            running_ref[0].persister = term.persister if term is not None else None

    def on_capacity(snapshot) -> None:
        capacity = capacity_from_proto(snapshot)
        last_capacity[:] = [capacity]
        term = election.term
        if term is not None and not term.runtime.stopping:
            term.runtime.apply_capacity(capacity)
        else:
            metrics.capacity_snapshots.inc()

    election = Election(
        config.lease,
        store,
        clock,
        metrics,
        build_term,
        address=lambda: config.advertise_addr or host.address,
        call_timeout_s=max(config.lease.renew_s, min(config.state_write_timeout_seconds, config.lease.ttl_s / 2)),
        tracer=tracer,
        stop_timeout_s=max(0.5, config.shutdown_grace_seconds),
    )
    election.on_term = on_term
    channel = None
    if capacity_stub is None:
        channel = config.security.channel(config.capacity_addr)
        capacity_stub = cap_pb_grpc.CapacityStub(channel)
    follower = CapacityWatch(
        capacity_stub,
        on_capacity,
        address=config.capacity_addr,
        logger=logging.getLogger("services.scheduler.capacity"),
        on_connected=lambda up: metrics.capacity_connected.set(1 if up else 0),
        on_failure=metrics.capacity_reconnects.inc,
        idle_timeout_s=capacity_idle_timeout_s,
        name="scheduler-capacity-watch",
    )
    pb_grpc.add_SchedulerServicer_to_server(
        SchedulerServicer(election, config.kv_router, tracer, mux_streams=metrics.admit_mux_streams), host.server
    )
    host.add_service(SERVICE_NAME)

    async def stop_components() -> None:
        # Health is NOT_SERVING by now: end the term (held Admits answered, a last fenced batch), release
        # the lease so that a standby takes over at once, then stop the capacity watch and close the store.
        await election.stop()
        await follower.stop()
        try:
            async with asyncio.timeout(config.state_write_timeout_seconds):
                await store.close()
        except TimeoutError:
            log.warning("scheduler state: %s did not close in time", store.description)
        if channel is not None:
            await channel.close()

    host.on_stop(stop_components)
    follower.start()
    try:
        await host.start()
    except BaseException:
        await follower.stop()
        await store.close()
        raise
    running = RunningScheduler(host, None, follower, config, None, election)
    running_ref.append(running)
    election.start()
    log.info(
        "scheduler replica %s started as a standby (advertised %s, state=%s, lease %gs, renew every %gs)",
        election.replica_id,
        config.advertise_addr or host.address,
        store.description,
        config.lease.ttl_s,
        config.lease.renew_s,
    )
    host.write_ready_file(config.ready_file)
    return running
