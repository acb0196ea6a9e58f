"""Composition root of the router: wires the capacity watch, the selection core, the scheduler client,
the KV-event feeds, the HTTP API and the gRPC service, and shuts them down in order.

    running = await start_router(config)          # serving once it returns
    running.http_port, running.grpc_port, running.host
    await running.stop()
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import ssl
import time
from dataclasses import dataclass

from aiohttp import web

from bandmaster.capacity.v1 import capacity_pb2_grpc as cap_pb_grpc
from services.common.auth.security import bearer_guard
from services.common.clock import SystemClock
from services.common.observe.telemetry import Telemetry, setup_telemetry
from services.common.outbound.capacity_watch import CapacityWatch
from services.common.process.ready import write_ready_file
from services.common.serve.grpc_server import ServiceHost
from services.common.serve.ports import require_free
from services.common.sglang.tokenizer import load_tokenizer
from services.router.adapters.batch_api import BatchApiProxy
from services.router.adapters.capacity import WorkerSet
from services.router.adapters.kv_events import KvEventFeeds
from services.router.adapters.peer_sync import TTL_INTERVALS, PeerSync, new_router_id
from services.router.adapters.scheduler import SchedulerClient
from services.router.adapters.upstream import Upstream
from services.router.config import RouterConfig
from services.router.core.admission_cache import AdmissionCache
from services.router.core.limits import ClientLimits
from services.router.core.peer_loads import PeerLoads
from services.router.ingress.grpc_api import SERVICE_NAME, RouterServicer, add_to_server
from services.router.ingress.http_api import HttpApi
from services.router.ingress.http_server import HttpLimits, start_http, token_identity
from services.router.observe.lean_tracer import LeanTracer
from services.router.observe.metrics import RouterMetrics
from services.router.observe.redaction import install_log_redaction
from services.router.turn.prompts import PromptTokenizer
from services.router.turn.turns import TurnRunner
from services.router.workers.circuits import WorkerCircuits
from services.router.workers.fleet import Fleet, resolve_params
from services.router.workers.health import FleetHealth

log = logging.getLogger(__name__)


@dataclass
class RunningRouter:
    config: RouterConfig
    host_: ServiceHost
    http_runner: web.BaseRunner
    http_port: int
    fleet: Fleet
    runner: TurnRunner
    metrics: RouterMetrics
    _stoppers: list

    @property
    def host(self) -> str:
        return self.host_.host

    @property
    def grpc_port(self) -> int:
        return self.host_.grpc_port

    @property
    def grpc_address(self) -> str:
        return self.host_.address

    @property
    def metrics_port(self) -> int:
        return self.host_.metrics_port

    @property
    def base_url(self) -> str:
        scheme = "https" if self.config.security.tls else "http"
        return f"{scheme}://{self.host}:{self.http_port}"

    async def stop(self) -> None:
        await self.host_.stop()

    async def wait_for_termination(self) -> None:
        await self.host_.wait_for_termination()


async def _sweep_loop(fleet: Fleet, limits: ClientLimits | None, interval_s: float, clock: SystemClock) -> None:
    while True:
        await asyncio.sleep(interval_s)
        if fleet.core is not None:
            result = fleet.core.sweep(clock.monotonic())
            if result.expired_requests:
                log.warning("sweep force-freed %d requests that never finished", len(result.expired_requests))
        if limits is not None:
            limits.sweep(time.monotonic())


def _check_file_limit(max_connections: int) -> None:
    """Each client connection and each in-flight turn's worker connection is a file descriptor: make
    sure the process may open enough for the connection cap (raise the soft limit when the hard one
    allows), or say plainly that the cap will not be reached."""
    needed = 2 * max_connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "open-file limit %d is below the %d that --http-max-connections %d needs: the process runs out "
            "of file descriptors before the cap applies",
            soft,
            needed,
            max_connections,
        )


def _log_prompt_mode(config: RouterConfig, prompts: PromptTokenizer | None, use_kv_events: bool) -> None:
    if prompts is None:
        if use_kv_events:
            log.warning(
                "KV events are on but no --tokenizer is given: chat and text prompts are hashed as text "
                "chunks, which the event index never matches (only token-id prompts use it)"
            )
        return
    tokenizer = prompts.tokenizer
    log.info(
        "prompts: tokenized with %s (vocabulary %d, chat template %s)",
        config.tokenizer,
        tokenizer.vocab_size,
        "yes" if tokenizer.has_chat_template else "none: chat prompts use the text approximation",
    )


def _batch_ssl(config: RouterConfig) -> ssl.SSLContext | None:
    """An https batch service is verified against --tls-ca when one is given, else the system roots."""
    if not config.batch_url.startswith("https://") or not config.security.ca_pem:
        return None
    return ssl.create_default_context(cadata=config.security.ca_pem.decode())


async def start_router(
    config: RouterConfig, *, telemetry: Telemetry | None = None, capacity_idle_timeout_s: float = 60.0
) -> RunningRouter:
    """Start every component on the running loop; return once the HTTP and gRPC APIs serve.
    Raises ConfigError, before anything is started, for a tokenizer that cannot be loaded.
    `capacity_idle_timeout_s`: a capacity stream silent this long (no snapshot, no heartbeat) is reopened."""
    prompts = PromptTokenizer(load_tokenizer(config.tokenizer)) if config.tokenizer else None
    install_log_redaction()
    telemetry = telemetry or setup_telemetry(
        "bandmaster-router", sample_ratio=config.trace_sample_ratio, export=config.tracing
    )
    # Without an exporter the router's spans only carry context: LeanTracer (services/router/observe/lean_tracer.py).
    tracer = telemetry.tracer("bandmaster.router") if telemetry.exporting else LeanTracer(telemetry.provider)
    metrics = RouterMetrics()
    clock = SystemClock()
    host = ServiceHost(
        "router",
        listen=config.listen,
        metrics_port=config.metrics_port,
        registry=metrics.registry,
        telemetry=telemetry,
        shutdown_grace_seconds=config.shutdown_grace_seconds,
        security=config.security,
        reuse_port=config.reuse_port,
    )
    # Taken ports are reported before anything that would need closing is built (with --reuse-port the
    # ports are shared on purpose: the parent of --processes checked them).
    host.check_ports()
    if not config.reuse_port:
        require_free(host.host, config.http_port, "router HTTP", "--http-port")

    scheduler = (
        None
        if not config.use_scheduler
        else SchedulerClient(
            config.scheduler_addr,
            metrics,
            call_timeout_s=config.scheduler_timeout_seconds,
            decision_timeout_s=config.admit_decision_timeout_seconds,
            hold_timeout_s=config.admit_hold_timeout_seconds,
            breaker=config.scheduler_breaker,
            tracer=tracer,
            # The instrumentation's CLIENT spans on Bind/Complete only when spans leave the process.
            channel_factory=lambda address: config.security.channel(
                address,
                interceptors=telemetry.grpc_client_interceptors() if telemetry.exporting else (),
            ),
            failover_s=config.scheduler_failover_seconds,
            loop_lag=host.loop_lag,
            inject_context=not telemetry.exporting,
            mux=config.scheduler_mux,
        )
    )
    scheduler_config = None
    if scheduler is not None:
        scheduler_config = await scheduler.router_config()
        if scheduler_config is None:
            log.warning("scheduler %s: no router config (unreachable); using flags and defaults", config.scheduler_addr)

    interval_s = config.replica_sync_interval_ms / 1000.0
    peers = PeerLoads(new_router_id(), interval_s * TTL_INTERVALS) if config.router_replica_sync else None
    fleet = Fleet(lambda page_size: resolve_params(config.kv, scheduler_config, page_size), config.seed, peers)
    _log_prompt_mode(config, prompts, resolve_params(config.kv, scheduler_config, None).use_kv_events)
    upstream = Upstream(
        connect_timeout_s=config.upstream_connect_timeout_seconds,
        first_token_timeout_s=config.upstream_first_token_timeout_seconds,
        inter_token_timeout_s=config.upstream_inter_token_timeout_seconds,
        response_timeout_s=config.upstream_response_timeout_seconds,
        headers=config.worker_client.headers,
        worker_ssl=config.worker_client.ssl_context(),
    )
    circuits = WorkerCircuits(config.worker_breaker, metrics)
    limit_params = config.client_limits
    limits = ClientLimits(limit_params) if limit_params.max_programs or limit_params.new_programs_per_s else None
    runner = TurnRunner(
        fleet,
        upstream,
        scheduler,
        metrics,
        tracer,
        circuits=circuits,
        limits=limits,
        prompts=prompts,
        batch_priority=config.batch_priority,
        deadlines=config.answer_deadlines,
        probe_timeout_s=config.failover_probe_timeout_seconds,
        context_check=config.context_length_check,
        fast_path=config.admission_fast_path and scheduler is not None,
    )
    if scheduler is not None:
        # The event stream keeps the fast path's cache in step (consulted only with --admission-fast-path)
        # and tells this router of programs that ended through another router.
        scheduler.on_program_ended = runner.program_ended
        scheduler.start_watching(AdmissionCache())
    batch_proxy = (
        BatchApiProxy(
            config.batch_url,
            connect_timeout_s=config.upstream_connect_timeout_seconds,
            read_timeout_s=config.upstream_response_timeout_seconds,
            body_timeout_s=config.http_body_timeout_seconds,
            ssl_context=_batch_ssl(config),
        )
        if config.batch_url
        else None
    )
    feeds = KvEventFeeds(fleet.apply_kv_event, metrics, upstream.session)

    def on_workers(workers) -> None:
        circuits.forget(workers)
        if fleet.subscribes_to_kv_events:
            feeds.update(workers)

    fleet.on_workers.append(on_workers)
    capacity_channel = config.security.channel(config.capacity_addr)
    capacity_stub = cap_pb_grpc.CapacityStub(capacity_channel)
    worker_set = WorkerSet(metrics, fleet.update)
    watch = CapacityWatch(
        capacity_stub,
        worker_set.take,
        address=config.capacity_addr,
        logger=logging.getLogger("services.router.adapters.capacity"),
        on_connected=worker_set.connected,
        initial_backoff_s=0.1,
        max_backoff_s=config.capacity_retry_max_seconds,
        idle_timeout_s=capacity_idle_timeout_s,
        name="router-capacity-watch",
    )

    # --router-replica-sync: report this router's load and follow its peers' on the same channel.
    peer_sync = (
        None
        if peers is None
        else PeerSync(
            capacity_stub,
            peers,
            lambda: fleet.core.load.own_loads() if fleet.core is not None else {},
            clock,
            metrics,
            interval_s=interval_s,
            address=config.capacity_addr,
            idle_timeout_s=capacity_idle_timeout_s,
            max_backoff_s=config.capacity_retry_max_seconds,
        )
    )

    add_to_server(RouterServicer(runner, metrics, tracer), host.server)
    host.add_service(SERVICE_NAME)
    http_limits = HttpLimits(
        header_timeout_s=config.http_header_timeout_seconds,
        keepalive_timeout_s=config.http_keepalive_timeout_seconds,
        max_connections=config.http_max_connections,
        max_connections_per_client=config.http_max_connections_per_client,
        max_body_bytes=config.max_body_bytes,
        server_version=config.http_server_version,
    )
    api = HttpApi(
        runner,
        metrics,
        tracer,
        limits=http_limits,
        body_timeout_s=config.http_body_timeout_seconds,
        serve_metrics=config.http_metrics,
        has_scheduler=scheduler is not None,
        batch_proxy=batch_proxy,
    )
    _check_file_limit(config.http_max_connections)

    await host.start()
    # grpc.health.v1 follows the fleet like /health: NOT_SERVING until a healthy worker is known.
    fleet_health = FleetHealth(host.health, ["", SERVICE_NAME])
    await fleet_health.apply(bool(fleet.workers))
    fleet.on_workers.append(fleet_health.on_workers)
    # The data-plane token guards every path but /health (off when no token is configured).
    handler = bearer_guard(
        api.handle,
        config.security.control_tokens,
        config.security.data_tokens,
        headers=http_limits.server_header,
        on_refusal=host.count_refusal,
    )
    http_runner, http_port = await start_http(
        handler,
        http_limits,
        metrics,
        host.host,
        config.http_port,
        ssl_context=config.security.http_ssl_context(),
        reuse_port=config.reuse_port,
        identify=token_identity(config.security.control_tokens, config.security.data_tokens),
    )
    watch.start()
    if peer_sync is not None:
        peer_sync.start()
    sweeper = asyncio.create_task(_sweep_loop(fleet, limits, config.sweep_interval_seconds, clock), name="router-sweep")

    async def stop_components() -> None:
        # Stop taking requests, let in-flight turns finish within the grace period, then the rest.
        await http_runner.shutdown()
        await http_runner.cleanup()
        sweeper.cancel()
        await watch.stop()
        if peer_sync is not None:
            await peer_sync.stop()
        await capacity_channel.close()
        await feeds.stop()
        await runner.drain()
        await upstream.close()
        if batch_proxy is not None:
            await batch_proxy.close()
        if scheduler is not None:
            await scheduler.close()

    host.on_stop(stop_components)
    running = RunningRouter(config, host, http_runner, http_port, fleet, runner, metrics, [])
    if config.ready_file:
        write_ready_file(
            config.ready_file,
            {
                "service": "router",
                "grpc": host.address,
                "metrics_port": host.metrics_port,
                "http_port": http_port,
                "pid": os.getpid(),
            },
        )
    log.info(
        "router serving HTTP on %s:%d (scheduler %s, capacity %s, Batch API %s)",
        host.host,
        http_port,
        "off" if scheduler is None else config.scheduler_addr,
        config.capacity_addr,
        config.batch_url or "off",
    )
    return running
