"""Composition root of the router: wires the capacity watch, the selection core, the scheduler client,
the KV-event feeds, the HTTP API and the gRPC service, and shuts them down in order.

    running = await start_router(config)          # serving once it returns
    running.http_port, running.grpc_port, running.host
    await running.stop()
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from dataclasses import dataclass

from aiohttp import web

from services.common.clock import SystemClock
from services.common.grpc_server import ServiceHost
from services.common.telemetry import Telemetry, setup_telemetry
from services.common.tokenizer import load_tokenizer
from services.router.adapters.capacity import CapacityWatch
from services.router.adapters.kv_events import KvEventFeeds
from services.router.config import RouterConfig
from services.router.control import SchedulerClient
from services.router.grpc_api import SERVICE_NAME, RouterServicer, add_to_server
from services.router.http_api import HttpApi
from services.router.metrics import RouterMetrics
from services.router.prompts import PromptTokenizer
from services.router.turns import Fleet, TurnRunner, resolve_params
from services.router.upstream import Upstream

log = logging.getLogger(__name__)


@dataclass
class RunningRouter:
    config: RouterConfig
    host_: ServiceHost
    http_runner: web.AppRunner
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
        return f"http://{self.host}:{self.http_port}"

    async def stop(self) -> None:
        await self.host_.stop()

    async def wait_for_termination(self) -> None:
        await self.host_.wait_for_termination()


def write_ready_file(path: str, payload: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ready-", dir=directory)
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


async def _sweep_loop(fleet: Fleet, interval_s: float, clock: SystemClock) -> None:
    while True:
        await asyncio.sleep(interval_s)
        if fleet.core is not None:
            result = fleet.core.sweep(clock.monotonic())
            if result.expired_requests:
                log.warning("sweep force-freed %d requests that never finished", len(result.expired_requests))


def _log_prompt_mode(config: RouterConfig, prompts: PromptTokenizer | None, use_kv_events: bool) -> None:
    if prompts is None:
        if use_kv_events:
            log.warning("KV events are on but no --tokenizer is given: chat and text prompts are hashed as text "
                        "chunks, which the event index never matches (only token-id prompts use it)")
        return
    tokenizer = prompts.tokenizer
    log.info("prompts: tokenized with %s (vocabulary %d, chat template %s)", config.tokenizer, tokenizer.vocab_size,
             "yes" if tokenizer.has_chat_template else "none: chat prompts use the text approximation")


async def start_router(config: RouterConfig, *, telemetry: Telemetry | None = None) -> RunningRouter:
    """Start every component on the running loop; return once the HTTP and gRPC APIs serve.
    Raises ConfigError, before anything is started, for a tokenizer that cannot be loaded."""
    prompts = PromptTokenizer(load_tokenizer(config.tokenizer)) if config.tokenizer else None
    telemetry = telemetry or setup_telemetry("bandmaster-router")
    tracer = telemetry.tracer("bandmaster.router")
    metrics = RouterMetrics()
    clock = SystemClock()
    host = ServiceHost("router", listen=config.listen, metrics_port=config.metrics_port, registry=metrics.registry,
                       telemetry=telemetry, shutdown_grace_seconds=config.shutdown_grace_seconds)

    scheduler = None if config.no_scheduler else SchedulerClient(
        config.scheduler_addr, metrics, call_timeout_s=config.scheduler_timeout_seconds)
    scheduler_config = None
    if scheduler is not None:
        scheduler_config = await scheduler.router_config()
        if scheduler_config is None:
            log.warning("scheduler %s: no router config (unreachable); using flags and defaults",
                        config.scheduler_addr)

    fleet = Fleet(lambda page_size: resolve_params(config.kv, scheduler_config, page_size), config.seed)
    _log_prompt_mode(config, prompts, resolve_params(config.kv, scheduler_config, None).use_kv_events)
    upstream = Upstream(connect_timeout_s=config.upstream_connect_timeout_seconds,
                        idle_timeout_s=config.upstream_idle_timeout_seconds)
    runner = TurnRunner(fleet, upstream, scheduler, metrics, tracer, admit_timeout_s=config.admit_timeout_seconds,
                        prompts=prompts)
    feeds = KvEventFeeds(fleet.apply_kv_event, metrics, upstream.session)

    def on_workers(workers) -> None:
        if fleet.subscribes_to_kv_events:
            feeds.update(workers)

    fleet.on_workers.append(on_workers)
    watch = CapacityWatch(config.capacity_addr, metrics, fleet.update, retry_max_s=config.capacity_retry_max_seconds)

    add_to_server(RouterServicer(runner, metrics, tracer), host.server)
    host.add_service(SERVICE_NAME)
    api = HttpApi(runner, metrics, tracer, max_body_bytes=config.max_body_bytes, has_scheduler=scheduler is not None)
    http_runner = web.AppRunner(api.build_app(), handler_cancellation=True, access_log=None)

    await host.start()
    await http_runner.setup()
    site = web.TCPSite(http_runner, host.host, config.http_port, reuse_address=True)
    await site.start()
    http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    watch.start()
    sweeper = asyncio.create_task(_sweep_loop(fleet, config.sweep_interval_seconds, clock), name="router-sweep")

    async def stop_components() -> None:
        # Stop taking requests, let in-flight turns finish within the grace period, then the rest.
        await http_runner.shutdown()
        await http_runner.cleanup()
        sweeper.cancel()
        await watch.stop()
        await feeds.stop()
        await runner.drain()
        await upstream.close()
        if scheduler is not None:
            await scheduler.close()

    host.on_stop(stop_components)
    running = RunningRouter(config, host, http_runner, http_port, fleet, runner, metrics, [])
    if config.ready_file:
        write_ready_file(config.ready_file, {"service": "router", "grpc": host.address,
                                             "metrics_port": host.metrics_port, "http_port": http_port,
                                             "pid": os.getpid()})
    log.info("router serving HTTP on %s:%d (scheduler %s, capacity %s)", host.host, http_port,
             "off" if scheduler is None else config.scheduler_addr, config.capacity_addr)
    return running
