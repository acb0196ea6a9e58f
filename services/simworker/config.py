"""simworker configuration: SGLang's own server-argument names, flags > SIMWORKER_* env > defaults.

`load_config(argv, env)` is the one place flags and environment variables are mapped; the
frozen `SimWorkerConfig` checks every relation in `__post_init__` and raises `ConfigError`
naming the violated rule. Sizes that SGLang gives in GB (`--hicache-size`) are converted to
tokens later, once the timing profile (which knows `kv_bytes_per_token`) is loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from services.common.config import Setting, parse_settings, require, validate_trace_sample_ratio
from services.common.errors import ConfigError
from services.common.trace_export import TraceExport, load_trace_export, trace_export_settings
from services.simworker.core.build import DEFAULT_MODEL_PATH
from services.simworker.core.timing import host_tokens_from_gb

PROG = "python -m services.simworker"
ENV_PREFIX = "SIMWORKER_"
WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
DEFAULT_TIMING_PROFILE = "glm45-fp8-h200"


def _s(name: str, type_: type, default: Any, help_text: str, **kw: Any) -> Setting:
    return Setting(name, type_, default, help_text, env=ENV_PREFIX + name.upper(), **kw)


SETTINGS: tuple[Setting, ...] = (
    _s("host", str, "127.0.0.1", "HTTP listen host"),
    _s(
        "port",
        int,
        30000,
        "HTTP listen port (0 = any free port; the bound port is printed and written to --ready-file)",
    ),
    _s(
        "model_path", str, DEFAULT_MODEL_PATH, "model path reported by /server_info and /model_info (nothing is loaded)"
    ),
    _s("served_model_name", str, "", "model name served on the OpenAI routes (default: --model-path)"),
    _s("model_name", str, "", "alias of --served-model-name"),
    _s(
        "tokenizer_path",
        str,
        "",
        "the model's tokenizer: a directory with tokenizer.json and tokenizer_config.json "
        "(its chat template); prompts are then tokenized as SGLang does (default: the built-in stand-in tokenizer)",
    ),
    _s("tokenizer", str, "", "alias of --tokenizer-path (the router's name for it)"),
    _s("max_total_tokens", int, 65_536, "GPU KV pool size in tokens (SGLang's max_total_num_tokens)"),
    _s("page_size", int, 16, "tokens per KV page (radix cache and KV-event granularity)"),
    _s("max_running_requests", int, 256, "cap on concurrently running requests"),
    _s("chunked_prefill_size", int, 8_192, "prefill token budget per iteration"),
    _s("context_length", int, 131_072, "model context length in tokens"),
    _s("enable_hierarchical_cache", bool, False, "enable the HiCache host (CPU) tier"),
    _s("hicache_ratio", float, 2.0, "host pool size / GPU pool size (used when --hicache-size is 0)"),
    _s(
        "hicache_size",
        float,
        0.0,
        "host pool size in GB (1e9 bytes); > 0 overrides --hicache-ratio; converted to tokens with the "
        "profile's kv_bytes_per_token",
    ),
    _s("hicache_write_policy", str, "write_through", "when GPU pages are copied to host", choices=WRITE_POLICIES),
    _s("hicache_storage_backend", str, "", "L3 storage backend name (accepted and reported, not modeled)"),
    _s("enable_priority_scheduling", bool, False, "honour the request `priority` field"),
    _s(
        "schedule_low_priority_values_first",
        bool,
        False,
        "lower priority values are scheduled first (default: higher first)",
    ),
    _s(
        "disable_priority_preemption",
        bool,
        False,
        "with priority scheduling, never preempt a running request for a higher-priority queued one",
    ),
    _s(
        "priority_scheduling_preemption_threshold",
        int,
        10,
        "with priority scheduling, a queued request that finds --max-running-requests reached preempts "
        "running requests whose priority it beats by more than this",
    ),
    _s("timing_profile", str, DEFAULT_TIMING_PROFILE, "timing profile name or path to a profile file"),
    _s(
        "timing_override",
        str,
        (),
        "override one timing-profile field, key=value (repeatable; env comma-separated)",
        repeated=True,
    ),
    _s("speedup", float, 1.0, "divide every simulated duration by this (> 0)"),
    _s("seed", int, 0, "engine seed (output lengths and token ids)"),
    _s(
        "kv_events_endpoint",
        str,
        "",
        "ZMQ endpoint of the KV-event publisher, e.g. tcp://*:5557 (bound if it contains * or 0.0.0.0, else connected)",
    ),
    _s(
        "kv_events_config",
        str,
        "",
        "SGLang's KV-events JSON: {publisher, endpoint, replay_endpoint, buffer_steps, hwm, topic}",
    ),
    _s("enable_metrics", bool, False, "accepted for compatibility; /metrics is always served"),
    _s("enable_cache_report", bool, False, "report prompt_tokens_details.cached_tokens in OpenAI usage"),
    _s("stream_interval", int, 1, "tokens per streamed chunk"),
    _s("ready_file", str, "", 'write {"port": .., "pid": ..} JSON here once serving (atomic rename)'),
    _s("log_level", str, "INFO", "log level", choices=LOG_LEVELS),
    _s(
        "trace_sample_ratio",
        float,
        None,
        "share of new traces to sample, 0..1, parent-based (default: "
        "OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, else every trace); spans are exported by OTLP when "
        "OTEL_EXPORTER_OTLP_ENDPOINT is set",
    ),
    *trace_export_settings(ENV_PREFIX.rstrip("_")),
    _s("health_generate_timeout_s", float, 20.0, "how long /health_generate waits for its one token"),
    _s(
        "api_key",
        str,
        "",
        "as SGLang's --api-key: every endpoint but /health* and /metrics* (and OPTIONS) requires "
        '`Authorization: Bearer <key>`, else 401 {"error": "Unauthorized"} (default: none)',
    ),
)


@dataclass(frozen=True)
class KvEventsConfig:
    """SGLang's `KVEventsConfig`, restricted to what a single-rank publisher needs."""

    publisher: str = "null"  # "null" | "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        require(
            self.publisher in ("null", "zmq"),
            "kv_events_config.publisher",
            self.publisher,
            "publisher must be 'null' or 'zmq'",
        )
        require(bool(self.endpoint), "kv_events_config.endpoint", self.endpoint, "endpoint must not be empty")
        require(self.buffer_steps >= 0, "kv_events_config.buffer_steps", self.buffer_steps, "buffer_steps >= 0")
        require(self.hwm >= 0, "kv_events_config.hwm", self.hwm, "hwm >= 0")

    @property
    def enabled(self) -> bool:
        return self.publisher == "zmq"

    def to_json(self) -> str:
        return json.dumps(
            {
                "publisher": self.publisher,
                "endpoint": self.endpoint,
                "replay_endpoint": self.replay_endpoint,
                "buffer_steps": self.buffer_steps,
                "hwm": self.hwm,
                "topic": self.topic,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> "KvEventsConfig":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("kv_events_config", text, f"must be a JSON object ({exc.msg})") from None
        require(isinstance(raw, dict), "kv_events_config", text, "must be a JSON object")
        known = {"publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm", "topic"}
        # SGLang has more fields (max_queue_size, snapshot_endpoint); they do not change the wire format.
        kwargs = {k: v for k, v in raw.items() if k in known}
        for key in ("buffer_steps", "hwm"):
            if key in kwargs:
                require(
                    isinstance(kwargs[key], int) and not isinstance(kwargs[key], bool),
                    f"kv_events_config.{key}",
                    kwargs[key],
                    f"{key} must be an integer",
                )
        for key in ("publisher", "endpoint", "topic"):
            if key in kwargs:
                require(isinstance(kwargs[key], str), f"kv_events_config.{key}", kwargs[key], f"{key} must be a string")
        return cls(**kwargs)


@dataclass(frozen=True)
class SimWorkerConfig:
    """Everything one simworker process needs. Field names are SGLang's server-argument names."""

    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = DEFAULT_MODEL_PATH
    served_model_name: str = DEFAULT_MODEL_PATH
    tokenizer_path: str = ""
    """Directory of the model's tokenizer files; empty = the built-in tokenizer. Loaded by `start_simworker`."""
    max_total_tokens: int = 65_536
    page_size: int = 16
    max_running_requests: int = 256
    chunked_prefill_size: int = 8_192
    context_length: int = 131_072
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size: float = 0.0
    """Host pool in GB (SGLang's unit); 0 = use hicache_ratio."""
    hicache_write_policy: str = "write_through"
    hicache_storage_backend: str | None = None
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    disable_priority_preemption: bool = False
    priority_scheduling_preemption_threshold: int = 10
    timing_profile: str = DEFAULT_TIMING_PROFILE
    timing_overrides: Mapping[str, float] = field(default_factory=dict)
    speedup: float = 1.0
    seed: int = 0
    kv_events: KvEventsConfig | None = None
    """None = no KV-event publisher."""
    enable_metrics: bool = False
    enable_cache_report: bool = False
    stream_interval: int = 1
    ready_file: str = ""
    trace_sample_ratio: float | None = None
    """Root sampling ratio of traces (parent-based); None = OTEL_TRACES_SAMPLER(_ARG), default all."""
    tracing: TraceExport = TraceExport()
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/trace_export.py)."""
    log_level: str = "INFO"
    health_generate_timeout_s: float = 20.0
    api_key: str = field(default="", repr=False)
    """SGLang's `--api-key` ("" = none); never in a repr or a log line."""

    def __post_init__(self) -> None:
        require(bool(self.host), "host", self.host, "host must not be empty")
        require(0 <= self.port <= 65535, "port", self.port, "0 <= port <= 65535")
        require(bool(self.model_path), "model_path", self.model_path, "model_path must not be empty")
        require(
            bool(self.served_model_name),
            "served_model_name",
            self.served_model_name,
            "served_model_name must not be empty",
        )
        require(self.page_size >= 1, "page_size", self.page_size, "page_size >= 1")
        require(
            self.max_total_tokens >= self.page_size,
            "max_total_tokens",
            self.max_total_tokens,
            "max_total_tokens >= page_size",
        )
        require(
            self.max_running_requests >= 1,
            "max_running_requests",
            self.max_running_requests,
            "max_running_requests >= 1",
        )
        require(
            self.chunked_prefill_size >= self.page_size,
            "chunked_prefill_size",
            self.chunked_prefill_size,
            "chunked_prefill_size >= page_size",
        )
        require(self.context_length >= 2, "context_length", self.context_length, "context_length >= 2")
        require(
            math.isfinite(self.hicache_ratio) and self.hicache_ratio >= 0,
            "hicache_ratio",
            self.hicache_ratio,
            "hicache_ratio >= 0",
        )
        require(
            math.isfinite(self.hicache_size) and self.hicache_size >= 0,
            "hicache_size",
            self.hicache_size,
            "hicache_size >= 0 (GB)",
        )
        if self.enable_hierarchical_cache and self.hicache_size == 0:
            # SGLang refuses a host pool that is not larger than the device pool.
            require(
                self.hicache_ratio > 1,
                "hicache_ratio",
                self.hicache_ratio,
                "hicache_ratio > 1 when --enable-hierarchical-cache and --hicache-size is 0",
            )
        require(
            self.hicache_write_policy in WRITE_POLICIES,
            "hicache_write_policy",
            self.hicache_write_policy,
            f"hicache_write_policy in {WRITE_POLICIES}",
        )
        require(
            self.hicache_storage_backend is None or self.enable_hierarchical_cache,
            "hicache_storage_backend",
            self.hicache_storage_backend,
            "--hicache-storage-backend requires --enable-hierarchical-cache",
        )
        require(math.isfinite(self.speedup) and self.speedup > 0, "speedup", self.speedup, "speedup > 0")
        require(self.stream_interval >= 1, "stream_interval", self.stream_interval, "stream_interval >= 1")
        require(self.log_level in LOG_LEVELS, "log_level", self.log_level, f"log_level in {LOG_LEVELS}")
        validate_trace_sample_ratio(self.trace_sample_ratio)
        require(
            self.health_generate_timeout_s > 0,
            "health_generate_timeout_s",
            self.health_generate_timeout_s,
            "health_generate_timeout_s > 0",
        )
        require(
            self.schedule_low_priority_values_first is False or self.enable_priority_scheduling,
            "schedule_low_priority_values_first",
            self.schedule_low_priority_values_first,
            "--schedule-low-priority-values-first requires --enable-priority-scheduling",
        )

        require(
            self.priority_scheduling_preemption_threshold >= 0,
            "priority_scheduling_preemption_threshold",
            self.priority_scheduling_preemption_threshold,
            "priority_scheduling_preemption_threshold >= 0",
        )

    def hicache_size_tokens(self, kv_bytes_per_token: int) -> int:
        """--hicache-size GB -> host pool tokens; 0 when the size is not given (ratio applies)."""
        if self.hicache_size <= 0:
            return 0
        return host_tokens_from_gb(self.hicache_size, kv_bytes_per_token)

    @property
    def max_req_input_len(self) -> int:
        # SGLang: min(context_len - 1, max_total_num_tokens - 1).
        return min(self.context_length - 1, self.max_total_tokens - 1)


def parse_overrides(items: Sequence[str]) -> dict[str, float]:
    """('decode_base_ms=5', ...) -> {'decode_base_ms': 5.0}."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        require(
            bool(sep) and key.isidentifier(), "timing_override", item, "expected key=value with a field name as key"
        )
        try:
            number = float(value)
        except ValueError:
            raise ConfigError("timing_override", item, "value must be a number") from None
        require(math.isfinite(number), "timing_override", item, "value must be finite")
        out[key] = number
    return out


def _kv_events(endpoint: str, config_json: str) -> KvEventsConfig | None:
    from_json = KvEventsConfig.from_json(config_json) if config_json else None
    if endpoint:
        if from_json is not None and from_json.enabled and from_json.endpoint != endpoint:
            raise ConfigError(
                "kv_events_endpoint", endpoint, "--kv-events-endpoint and --kv-events-config name different endpoints"
            )
        base = from_json or KvEventsConfig()
        return KvEventsConfig(
            publisher="zmq",
            endpoint=endpoint,
            replay_endpoint=base.replay_endpoint,
            buffer_steps=base.buffer_steps,
            hwm=base.hwm,
            topic=base.topic,
        )
    if from_json is not None and from_json.enabled:
        return from_json
    return None


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> SimWorkerConfig:
    """Map flags and SIMWORKER_* variables onto a validated SimWorkerConfig (raises ConfigError)."""
    v = parse_settings(
        SETTINGS, argv, env, prog=PROG, description="Simulated SGLang server (HTTP API, KV cache, timing model)"
    )
    served = v["served_model_name"]
    alias = v["model_name"]
    if served and alias and served != alias:
        raise ConfigError("model_name", alias, "--model-name is an alias of --served-model-name; they disagree")
    served = served or alias or v["model_path"]
    tokenizer_path, tokenizer_alias = v["tokenizer_path"], v["tokenizer"]
    if tokenizer_path and tokenizer_alias and tokenizer_path != tokenizer_alias:
        raise ConfigError("tokenizer", tokenizer_alias, "--tokenizer is an alias of --tokenizer-path; they disagree")
    return SimWorkerConfig(
        host=v["host"],
        port=v["port"],
        model_path=v["model_path"],
        served_model_name=served,
        tokenizer_path=tokenizer_path or tokenizer_alias,
        max_total_tokens=v["max_total_tokens"],
        page_size=v["page_size"],
        max_running_requests=v["max_running_requests"],
        chunked_prefill_size=v["chunked_prefill_size"],
        context_length=v["context_length"],
        enable_hierarchical_cache=v["enable_hierarchical_cache"],
        hicache_ratio=v["hicache_ratio"],
        hicache_size=v["hicache_size"],
        hicache_write_policy=v["hicache_write_policy"],
        hicache_storage_backend=v["hicache_storage_backend"] or None,
        enable_priority_scheduling=v["enable_priority_scheduling"],
        schedule_low_priority_values_first=v["schedule_low_priority_values_first"],
        disable_priority_preemption=v["disable_priority_preemption"],
        priority_scheduling_preemption_threshold=v["priority_scheduling_preemption_threshold"],
        timing_profile=v["timing_profile"],
        timing_overrides=parse_overrides(v["timing_override"]),
        speedup=v["speedup"],
        seed=v["seed"],
        kv_events=_kv_events(v["kv_events_endpoint"], v["kv_events_config"]),
        enable_metrics=v["enable_metrics"],
        enable_cache_report=v["enable_cache_report"],
        stream_interval=v["stream_interval"],
        ready_file=v["ready_file"],
        log_level=v["log_level"],
        trace_sample_ratio=v["trace_sample_ratio"],
        tracing=load_trace_export(v, env),
        health_generate_timeout_s=v["health_generate_timeout_s"],
        api_key=v["api_key"],
    )
