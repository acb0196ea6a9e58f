"""Composition root of the simworker: engine + driver + HTTP API + KV-event publisher.

`start_simworker(config)` runs everything on the current event loop and returns a
`RunningSimWorker` (`.port`, `.url`, `.engine`, `await .stop()`); `__main__` and in-process
tests use the same function. Shutdown order: health -> 503, stop accepting, abort what is in
flight, stop the engine loop, close the publisher.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Sequence

from aiohttp import web
from opentelemetry import trace

from services.common.observe.telemetry import Telemetry
from services.common.process.ready import write_ready_file
from services.common.serve.ports import binding
from services.common.sglang.tokenizer import ModelTokenizer, load_tokenizer
from services.simworker.chat import render_chat
from services.simworker.config import SimWorkerConfig
from services.simworker.core import build
from services.simworker.core.api import Engine, EngineConfig
from services.simworker.core.timing import TimingProfile
from services.simworker.driver import EngineDriver
from services.simworker.http_api import SimWorkerApi, Tokenizer
from services.simworker.kv_events import KvEventPublisher
from services.simworker.metrics import SimWorkerMetrics
from services.simworker.profiles import load_profile

log = logging.getLogger(__name__)


class _DropHttp2Probes(logging.Filter):
    """sglang-router probes each worker for gRPC (HTTP/2 prior knowledge) before it falls back
    to HTTP; aiohttp logs each such probe as an error with a traceback. They are expected."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and "PRI/Upgrade" in str(exc))


_PROBE_FILTER = _DropHttp2Probes()


class CoreTokenizer:
    """The engine core's tokenizer module and the built-in chat template behind the `Tokenizer` protocol."""

    def __init__(self) -> None:
        from services.simworker.core import tokenizer

        self._module = tokenizer
        self.eos_token_id: int = tokenizer.EOS_TOKEN_ID
        # Chat prompts re-send their history every turn: only the new messages are tokenised (exact).
        self._chat_cache = tokenizer.ChunkCache()

    def encode(self, text: str) -> list[int]:
        return self._module.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._module.decode(ids)

    def chat_ids(self, body: dict) -> list[int]:
        return self._chat_cache.encode(
            render_chat(
                body.get("messages"),
                add_generation_prompt=body.get("add_generation_prompt", True),
                continue_final_message=bool(body.get("continue_final_message", False)),
            )
        )


class ModelPromptTokenizer(CoreTokenizer):
    """Prompts through the model's tokenizer and chat template, exactly as SGLang (and the router with
    the same `--tokenizer`) tokenizes them, so prompt token counts and KV-event block hashes agree.
    Output stays the engine's: it samples ids from the built-in word list, so they are decoded (and
    EOS recognised) with the built-in tokenizer."""

    def __init__(self, model: ModelTokenizer) -> None:
        super().__init__()
        self.model = model

    def encode(self, text: str) -> list[int]:
        return self.model.encode(text)

    def chat_ids(self, body: dict) -> list[int]:
        return self.model.chat_token_ids(body)


def engine_config(config: SimWorkerConfig, kv_bytes_per_token: int) -> EngineConfig:
    return EngineConfig(
        max_total_tokens=config.max_total_tokens,
        page_size=config.page_size,
        max_running_requests=config.max_running_requests,
        chunked_prefill_size=config.chunked_prefill_size,
        context_length=config.context_length,
        enable_hierarchical_cache=config.enable_hierarchical_cache,
        hicache_ratio=config.hicache_ratio,
        hicache_size_tokens=config.hicache_size_tokens(kv_bytes_per_token),
        hicache_write_policy=config.hicache_write_policy,  # type: ignore[arg-type]
        enable_priority_scheduling=config.enable_priority_scheduling,
        schedule_low_priority_values_first=config.schedule_low_priority_values_first,
        disable_priority_preemption=config.disable_priority_preemption,
        priority_scheduling_preemption_threshold=config.priority_scheduling_preemption_threshold,
        seed=config.seed,
        emit_kv_events=config.kv_events is not None,
    )


def build_engine(config: SimWorkerConfig) -> tuple[Engine, TimingProfile]:
    """The real engine for `config` and its timing profile (core/build.py `build_engine`)."""
    profile = load_profile(config.timing_profile, dict(config.timing_overrides) or None)
    return build.build_engine(engine_config(config, profile.kv_bytes_per_token), profile), profile


def host_total_tokens(config: SimWorkerConfig, kv_bytes_per_token: int) -> int:
    """HiCache host pool in tokens: --hicache-size GB if given, else ratio x GPU pool (core/build.py
    `host_total_tokens`)."""
    if not config.enable_hierarchical_cache:
        return 0
    return build.host_total_tokens(engine_config(config, kv_bytes_per_token))


@dataclass
class RunningSimWorker:
    config: SimWorkerConfig
    port: int
    engine: Engine
    driver: EngineDriver
    api: SimWorkerApi
    runner: web.AppRunner
    publisher: KvEventPublisher | None
    telemetry: Telemetry | None = None

    @property
    def url(self) -> str:
        host = self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    @property
    def kv_events_endpoint(self) -> str | None:
        return self.publisher.endpoint if self.publisher else None

    async def stop(self) -> None:
        """Graceful stop; safe to call twice."""
        if self.api.state == "stopped":
            return
        self.api.state = "shutting_down"
        for rid in self.driver.in_flight():
            self.driver.abort(rid)
        await self.driver.stop()
        await self.runner.cleanup()
        if self.publisher is not None:
            await self.publisher.close()
        if self.telemetry is not None:
            self.telemetry.shutdown()
        self.api.state = "stopped"
        log.info("simworker stopped (port %d)", self.port)


async def start_simworker(
    config: SimWorkerConfig,
    *,
    engine: Engine | None = None,
    tokenizer: Tokenizer | None = None,
    profile: TimingProfile | None = None,
    telemetry: Telemetry | None = None,
) -> RunningSimWorker:
    """Start a simworker on the running loop.

    `engine` and `tokenizer` default to the core's SimEngine and tokenizer (the model's, with
    `--tokenizer-path`; a ConfigError if it cannot be loaded); a caller that passes its own
    engine may pass the `profile` it was built with (for kv_bytes_per_token and the frontend
    latency), else the configured profile is loaded. Spans go to `telemetry`'s provider (the global
    one without it).
    """
    if tokenizer is None and config.tokenizer_path:
        tokenizer = ModelPromptTokenizer(load_tokenizer(config.tokenizer_path))
    if engine is None:
        engine, profile = build_engine(config)
    elif profile is None:
        profile = load_profile(config.timing_profile, dict(config.timing_overrides) or None)
    kv_bytes = profile.kv_bytes_per_token
    tokenizer = tokenizer or CoreTokenizer()
    server_log = logging.getLogger("aiohttp.server")
    if _PROBE_FILTER not in server_log.filters:
        server_log.addFilter(_PROBE_FILTER)
    publisher = KvEventPublisher(config.kv_events) if config.kv_events is not None else None
    try:
        if publisher is not None:
            await publisher.start()
        driver = EngineDriver(engine, config.speedup, publish_kv_events=publisher.publish if publisher else None)
        metrics = SimWorkerMetrics(engine.stats, config.served_model_name)

        api = SimWorkerApi(
            config,
            driver,
            tokenizer,
            metrics,
            kv_bytes_per_token=kv_bytes,
            host_total_tokens=host_total_tokens(config, kv_bytes),
            frontend_s=profile.frontend_s,
            tracer=(
                telemetry.tracer("bandmaster.simworker")
                if telemetry is not None
                else trace.get_tracer("bandmaster.simworker")
            ),
        )
        api.kv_events_bound_endpoint = publisher.endpoint if publisher is not None else None
        # handler_cancellation: a client that disconnects cancels its handler, whose
        # `finally` aborts the engine request (SGLang aborts on disconnect too).
        runner = web.AppRunner(api.build_app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
        with binding(config.host, config.port, "simworker HTTP", "--port"):
            await site.start()
    except BaseException:
        if publisher is not None:
            await publisher.close()
        raise
    port = runner.addresses[0][1]
    driver.start()
    api.state = "ready"
    worker = RunningSimWorker(
        config=config,
        port=port,
        engine=engine,
        driver=driver,
        api=api,
        runner=runner,
        publisher=publisher,
        telemetry=telemetry,
    )
    if config.ready_file:
        write_ready_file(
            config.ready_file,
            {"port": port, "pid": os.getpid(), "url": worker.url, "kv_events_endpoint": worker.kv_events_endpoint},
        )
    log.info(
        "simworker serving %s on %s (profile %s, speedup %g, KV %d tokens, page %d, tokenizer %s)",
        config.served_model_name,
        worker.url,
        config.timing_profile,
        config.speedup,
        config.max_total_tokens,
        config.page_size,
        config.tokenizer_path or "built-in",
    )
    return worker
