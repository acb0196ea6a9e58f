"""Composition root: config -> core, runtime, capacity watch, servicer, ServiceHost."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from bandmaster.capacity.v1 import capacity_pb2_grpc as cap_pb_grpc
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.common.capacity_watch import CapacityWatch
from services.common.clock import Clock, SystemClock
from services.common.errors import ConfigError
from services.common.grpc_server import ServiceHost
from services.common.redact import redact_url
from services.common.telemetry import Telemetry
from services.scheduler.adapters.proto import capacity_from_proto
from services.scheduler.adapters.state_store import (
    RedisStateStore,
    SqliteStateStore,
    StateStore,
    StoreError,
    StoreLocked,
)
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore, make_pause_policy
from services.scheduler.loop import SchedulerRuntime
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.persist import StatePersister
from services.scheduler.servicer import SERVICE_NAME, SchedulerServicer

log = logging.getLogger("services.scheduler")


@dataclass
class RunningScheduler:
    host: ServiceHost
    runtime: SchedulerRuntime
    follower: CapacityWatch
    config: SchedulerConfig
    persister: StatePersister | None = None

    @property
    def address(self) -> str:
        return self.host.address

    @property
    def core(self) -> SchedulerCore:
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
    host = ServiceHost(
        "scheduler",
        listen=config.listen,
        metrics_port=config.metrics_port,
        telemetry=telemetry,
        shutdown_grace_seconds=config.shutdown_grace_seconds,
        security=config.security,
    )
    tracer = telemetry.tracer("services.scheduler") if telemetry else trace.get_tracer("services.scheduler")
    metrics = SchedulerMetrics(host.registry)
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
    pb_grpc.add_SchedulerServicer_to_server(SchedulerServicer(runtime, config.kv_router, tracer), host.server)
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
        "scheduler started (interval=%ss, pause=%.2f, soft=%.2f, target=%.2f, policy=%s, capacity=%s, "
        "state=%s, ticket lease=%gs)",
        c.scheduler_interval_seconds,
        c.pause_threshold,
        c.soft_demote_threshold,
        c.pause_target,
        config.pause_policy,
        config.capacity_addr,
        persister.store.description if persister is not None else "memory",
        config.ticket_lease_seconds,
    )
    host.write_ready_file(config.ready_file)
    return RunningScheduler(host, runtime, follower, config, persister)


def _state_store(config: SchedulerConfig) -> StateStore | None:
    if config.state_store == "redis":
        return RedisStateStore(config.state_redis_url, config.state_redis_prefix, config.state_write_timeout_seconds)
    if config.state_store == "sqlite":
        return SqliteStateStore(config.state_path)
    return None


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
