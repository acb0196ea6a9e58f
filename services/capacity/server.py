"""Composition root: config -> registry, poller, runtime, servicer, ServiceHost."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from opentelemetry import trace

from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from services.capacity.adapters.poller import SglangPoller
from services.capacity.config import CapacityConfig
from services.capacity.core.cards import CardCache, RetentionSettings
from services.capacity.core.registry import Registry, RegistrySettings
from services.capacity.loop import CapacityRuntime
from services.capacity.metrics import CapacityMetrics
from services.capacity.router_loads import RouterLoadHub
from services.capacity.servicer import SERVICE_NAME, CapacityServicer
from services.common.clock import Clock, SystemClock
from services.common.observe.telemetry import Telemetry
from services.common.serve.grpc_server import ServiceHost

log = logging.getLogger("services.capacity")


@dataclass
class RunningCapacity:
    host: ServiceHost
    runtime: CapacityRuntime
    config: CapacityConfig
    router_loads: RouterLoadHub

    @property
    def address(self) -> str:
        return self.host.address

    async def stop(self) -> None:
        await self.host.stop()


async def start_capacity(
    config: CapacityConfig, *, telemetry: Telemetry | None = None, clock: Clock | None = None
) -> RunningCapacity:
    """Build and start the service; returns once it serves gRPC and polls its workers."""
    clock = clock or SystemClock()
    host = ServiceHost(
        "capacity",
        listen=config.listen,
        metrics_port=config.metrics_port,
        telemetry=telemetry,
        shutdown_grace_seconds=config.shutdown_grace_seconds,
        security=config.security,
    )
    tracer = telemetry.tracer("services.capacity") if telemetry else trace.get_tracer("services.capacity")
    retention = RetentionSettings(cap_host_at_gpu=config.cap_host_at_gpu)
    registry = Registry(
        RegistrySettings(
            unhealthy_after_failures=config.unhealthy_after_failures,
            remove_unhealthy_after_seconds=config.remove_unhealthy_after_seconds,
            confirm_increase_polls=config.confirm_increase_polls,
        ),
        retention,
    )
    cache = CardCache()
    metrics = CapacityMetrics(host.registry)
    runtime = CapacityRuntime(
        registry=registry,
        retention=retention,
        poller=SglangPoller(
            config.poll_timeout_seconds,
            cache,
            max_body_bytes=config.max_server_info_bytes,
            worker_client=config.worker_client,
        ),
        clock=clock,
        metrics=metrics,
        tracer=tracer,
        poll_interval_s=config.poll_interval_seconds,
        heartbeat_interval_s=config.watch_heartbeat_seconds,
        transition_log_interval_s=config.transition_log_interval_seconds,
    )
    for worker in config.workers:
        runtime.add_worker(worker.worker_id, worker.url, worker.origin, worker.expectation)
    router_loads = RouterLoadHub(clock, metrics)
    pb_grpc.add_CapacityServicer_to_server(CapacityServicer(runtime, router_loads), host.server)
    host.add_service(SERVICE_NAME)
    host.on_stop(runtime.stop)
    host.on_stop(router_loads.stop)
    await runtime.start()
    router_loads.start()
    try:
        await host.start()
    except BaseException:
        await runtime.stop()
        await router_loads.stop()
        raise
    if config.cap_host_at_gpu:
        log.info("host credit capped at the GPU pool per replica (--cap-host-at-gpu)")
    log.info("capacity: %d static workers, polling every %gs", len(config.workers), config.poll_interval_seconds)
    host.write_ready_file(config.ready_file)
    return RunningCapacity(host, runtime, config, router_loads)
