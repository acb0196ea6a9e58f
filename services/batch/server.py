"""Composition root of the batch service: config -> registry, planner link, dispatcher, Batch API (HTTP) and
the gRPC host (health and /metrics), started in this order:

    1. the registry (requests interrupted by the last stop go back to the queue)
    2. the planner link (lease watch, progress reports) and the dispatcher: nothing is sent before a
       lease arrives from the planner; the cleanup loop (expired files, cleanup.py)
    3. the Batch API, then gRPC health

and stopped in reverse. The batch service carries the tokens of batch work; the planner only decides
(jobs, leases, scaling) from the ids, counts and rates this service reports.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from bandmaster.planner.v1 import planner_pb2_grpc as planner_grpc
from services.batch.adapters.planner import PlannerLink
from services.batch.adapters.registry import Registry
from services.batch.cleanup import Cleanup
from services.batch.config import BatchConfig
from services.batch.dispatcher import Dispatcher
from services.batch.http_api import BatchApi
from services.batch.metrics import BatchMetrics
from services.common.clock import Clock, SystemClock
from services.common.observe.telemetry import Telemetry
from services.common.process.ready import write_ready_file
from services.common.serve.grpc_server import ServiceHost
from services.common.settings.config import parse_host_port

log = logging.getLogger("services.batch")


@dataclass
class RunningBatch:
    host: ServiceHost
    registry: Registry
    api: BatchApi
    dispatcher: Dispatcher
    planner: PlannerLink
    config: BatchConfig
    cleanup: Cleanup

    @property
    def address(self) -> str:
        return self.host.address

    @property
    def http_url(self) -> str:
        host, _ = parse_host_port(self.config.http_listen, "http_listen")
        scheme = "https" if self.config.security.tls else "http"
        return f"{scheme}://{host}:{self.api.port}"

    async def stop(self) -> None:
        await self.host.stop()


async def start_batch(
    config: BatchConfig, *, telemetry: Telemetry | None = None, clock: Clock | None = None
) -> RunningBatch:
    clock = clock or SystemClock()
    host = ServiceHost(
        "batch",
        listen=config.listen,
        metrics_port=config.metrics_port,
        telemetry=telemetry,
        shutdown_grace_seconds=config.shutdown_grace_seconds,
        security=config.security,
    )
    metrics = BatchMetrics(host.registry)
    registry = Registry(config.registry_path, file_retention_s=config.file_retention_seconds)
    cleanup = Cleanup(
        registry,
        clock,
        interval_s=config.cleanup_interval_seconds,
        max_files=config.cleanup_max_files_per_pass,
        metrics=metrics,
    )
    # A planner that restarts is found again within seconds (gRPC's default back-off grows to minutes).
    channel = config.security.channel(
        config.planner, options=[("grpc.initial_reconnect_backoff_ms", 250), ("grpc.max_reconnect_backoff_ms", 2000)]
    )
    link_ref: list[PlannerLink] = []
    dispatcher = Dispatcher(
        registry,
        lambda: link_ref[0].current_lease(),
        clock,
        base_url=config.dispatch_url,
        max_inflight=config.dispatch_max_inflight,
        timeout_s=config.dispatch_timeout_seconds,
        max_attempts=config.dispatch_max_attempts,
        priority=config.dispatch_priority,
        metrics=metrics,
        token=_dispatch_token(config),
        ssl_context=_dispatch_ssl(config),
        on_transition=lambda moved: _log_transitions(moved, metrics, link_ref),
    )
    link = PlannerLink(
        planner_grpc.PlannerStub(channel),
        registry,
        clock,
        pool_id=config.pool_id,
        feedback=dispatcher.feedback,
        interval_s=config.report_interval_seconds,
        timeout_s=config.planner_timeout_seconds,
        on_lease=dispatcher.wake,
        metrics=metrics,
    )
    link_ref.append(link)

    def changed() -> None:
        dispatcher.wake()
        link.report_soon()

    api = BatchApi(
        registry,
        clock,
        max_requests=config.max_batch_requests,
        max_file_bytes=config.max_file_bytes,
        pool_id=config.pool_id,
        on_change=changed,
        on_delete=lambda deleted: metrics.record_deleted(deleted, "client"),
        security=config.security,
    )

    async def close_all() -> None:
        await api.stop()
        await cleanup.stop()
        await dispatcher.stop()
        await link.stop()
        await channel.close()
        registry.close()

    host.on_stop(close_all)
    try:
        await dispatcher.start()
        link.start()
        cleanup.start()
        http_host, http_port = parse_host_port(config.http_listen, "http_listen")
        await api.start(http_host, http_port)
        await host.start()
    except BaseException:
        await close_all()
        raise
    running = RunningBatch(host, registry, api, dispatcher, link, config, cleanup)
    log.info(
        "batch service: Batch API on %s, pool %s, lease and reports with the planner at %s, dispatch to %s",
        running.http_url,
        config.pool_id,
        config.planner,
        config.dispatch_url,
    )
    write_ready_file(
        config.ready_file,
        {
            "service": "batch",
            "grpc": running.address,
            "metrics_port": host.metrics_port,
            "http": running.http_url,
            "pid": os.getpid(),
        },
    )
    return running


def _dispatch_token(config: BatchConfig) -> str:
    """The router's HTTP API takes a data (or control) token: the first data token, else the first control one."""
    sec = config.security
    if sec.data_tokens is not None:
        return sec.data_tokens.first
    return sec.control_tokens.first if sec.control_tokens is not None else ""


def _dispatch_ssl(config: BatchConfig):
    """Verify an https dispatch target against --tls-ca when one is given (else the system roots)."""
    if not config.dispatch_url.startswith("https://") or config.security.ca_pem is None:
        return None
    import ssl

    return ssl.create_default_context(cadata=config.security.ca_pem.decode())


def _log_transitions(moved: list, metrics: BatchMetrics, link_ref: list[PlannerLink]) -> None:
    for batch_id, old, new in moved:
        metrics.batches.labels(new).inc()
        log.info("batch %s: %s -> %s", batch_id, old, new)
    if moved and link_ref:
        link_ref[0].report_soon()  # an ended batch: tell the planner now
