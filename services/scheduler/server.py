"""Composition root: config -> core, runtime, capacity follower, servicer, ServiceHost."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import trace

from bandmaster.capacity.v1 import capacity_pb2_grpc as cap_pb_grpc
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.common.clock import Clock, SystemClock
from services.common.grpc_server import ServiceHost
from services.common.telemetry import Telemetry
from services.scheduler.adapters.capacity import CapacityFollower
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore, make_pause_policy
from services.scheduler.loop import SchedulerRuntime
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.servicer import SERVICE_NAME, SchedulerServicer

log = logging.getLogger("services.scheduler")


@dataclass
class RunningScheduler:
    host: ServiceHost
    runtime: SchedulerRuntime
    follower: CapacityFollower
    config: SchedulerConfig

    @property
    def address(self) -> str:
        return self.host.address

    @property
    def core(self) -> SchedulerCore:
        return self.runtime.core

    async def stop(self) -> None:
        await self.host.stop()


async def start_scheduler(config: SchedulerConfig, *, clock: Clock | None = None, telemetry: Telemetry | None = None,
                          capacity_stub: Any = None, tick_loop: bool = True,
                          capacity_idle_timeout_s: float = 60.0) -> RunningScheduler:
    """Build and start the service; returns once it serves gRPC.

    `capacity_stub` replaces the channel to `config.capacity_addr` (tests). `tick_loop=False`
    leaves ticking to the caller (`running.runtime.tick_once()`), for FakeClock-driven tests.
    """
    clock = clock or SystemClock()
    host = ServiceHost("scheduler", listen=config.listen, metrics_port=config.metrics_port, telemetry=telemetry,
                       shutdown_grace_seconds=config.shutdown_grace_seconds)
    tracer = telemetry.tracer("services.scheduler") if telemetry else trace.get_tracer("services.scheduler")
    metrics = SchedulerMetrics(host.registry)
    core = SchedulerCore(config.control, make_pause_policy(config.pause_policy, config.pause_policy_params()),
                         ticket_lease_seconds=config.ticket_lease_seconds)
    runtime = SchedulerRuntime(core, clock=clock, metrics=metrics, tracer=tracer,
                               interval_s=config.control.scheduler_interval_seconds)
    channel = None
    if capacity_stub is None:
        channel = grpc.aio.insecure_channel(config.capacity_addr)
        capacity_stub = cap_pb_grpc.CapacityStub(channel)
    follower = CapacityFollower(capacity_stub, runtime.apply_capacity, metrics, address=config.capacity_addr,
                                idle_timeout_s=capacity_idle_timeout_s)
    pb_grpc.add_SchedulerServicer_to_server(SchedulerServicer(runtime, config.kv_router, tracer), host.server)
    host.add_service(SERVICE_NAME)

    async def stop_components() -> None:
        # Health is NOT_SERVING by now: release held Admits (UNAVAILABLE), then stop the loops.
        await runtime.stop()
        await follower.stop()
        if channel is not None:
            await channel.close()

    host.on_stop(stop_components)
    runtime.start(tick_loop=tick_loop)
    follower.start()
    try:
        await host.start()
    except BaseException:
        await stop_components()
        raise
    c = config.control
    log.info("scheduler started (interval=%ss, pause=%.2f, soft=%.2f, target=%.2f, policy=%s, capacity=%s)",
             c.scheduler_interval_seconds, c.pause_threshold, c.soft_demote_threshold, c.pause_target,
             config.pause_policy, config.capacity_addr)
    host.write_ready_file(config.ready_file)
    return RunningScheduler(host, runtime, follower, config)
