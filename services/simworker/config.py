"""simworker configuration: SGLang's own server-argument names, flags > SIMWORKER_* env > defaults.

`load_config(argv, env)` is the one place flags and environment variables are mapped; each
setting is declared once, as a `setting()` field of the frozen `SimWorkerConfig`, whose
`__post_init__` checks the declared bounds and the relations and raises `ConfigError` naming
the violated rule. Sizes that SGLang gives in GB (`--hicache-size`) are converted to
tokens later, once the timing profile (which knows `kv_bytes_per_token`) is loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from services.common.observe.trace_export import TraceExport, trace_export_group
from services.common.settings.config import (
    LOG_LEVELS,
    Setting,
    check_bounds,
    load_groups,
    parse_settings,
    require,
    setting,
    settings_of,
)
from services.common.settings.errors import ConfigError
from services.simworker.core.build import DEFAULT_MODEL_PATH
from services.simworker.core.timing import host_tokens_from_gb

PROG = "python -m services.simworker"
ENV_PREFIX = "SIMWORKER_"
WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
DEFAULT_TIMING_PROFILE = "glm45-fp8-h200"


def _env(name: str) -> str:
    return ENV_PREFIX + name.upper()


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
    """Everything one simworker process needs. Field names are SGLang's server-argument names.

    Each `setting()` field is also a flag and a SIMWORKER_* variable (declared once, here)."""

    host: str = setting("127.0.0.1", "HTTP listen host", env=_env("host"))
    port: int = setting(
        30000,
        "HTTP listen port (0 = any free port; the bound port is printed and written to --ready-file)",
        env=_env("port"),
        ge=0,
        le=65535,
    )
    model_path: str = setting(
        DEFAULT_MODEL_PATH,
        "model path reported by /server_info and /model_info (nothing is loaded)",
        env=_env("model_path"),
    )
    served_model_name: str = setting(
        "", "model name served on the OpenAI routes (default: --model-path)", env=_env("served_model_name")
    )
    """Empty = model_path (resolved in __post_init__)."""
    model_name: str = setting("", "alias of --served-model-name", env=_env("model_name"))
    """As given; `load_config` folds it into served_model_name."""
    tokenizer_path: str = setting(
        "",
        "the model's tokenizer: a directory with tokenizer.json and tokenizer_config.json "
        "(its chat template); prompts are then tokenized as SGLang does (default: the built-in stand-in tokenizer)",
        env=_env("tokenizer_path"),
    )
    """Directory of the model's tokenizer files; empty = the built-in tokenizer. Loaded by `start_simworker`."""
    tokenizer: str = setting("", "alias of --tokenizer-path (the router's name for it)", env=_env("tokenizer"))
    """As given; `load_config` folds it into tokenizer_path."""
    max_total_tokens: int = setting(
        65_536, "GPU KV pool size in tokens (SGLang's max_total_num_tokens)", env=_env("max_total_tokens")
    )
    page_size: int = setting(
        16, "tokens per KV page (radix cache and KV-event granularity)", env=_env("page_size"), ge=1
    )
    max_running_requests: int = setting(
        256, "cap on concurrently running requests", env=_env("max_running_requests"), ge=1
    )
    chunked_prefill_size: int = setting(8_192, "prefill token budget per iteration", env=_env("chunked_prefill_size"))
    context_length: int = setting(131_072, "model context length in tokens", env=_env("context_length"), ge=2)
    enable_hierarchical_cache: bool = setting(
        False, "enable the HiCache host (CPU) tier", env=_env("enable_hierarchical_cache")
    )
    hicache_ratio: float = setting(
        2.0, "host pool size / GPU pool size (used when --hicache-size is 0)", env=_env("hicache_ratio"), ge=0
    )
    hicache_size: float = setting(
        0.0,
        "host pool size in GB (1e9 bytes); > 0 overrides --hicache-ratio; converted to tokens with the "
        "profile's kv_bytes_per_token",
        env=_env("hicache_size"),
        ge=0,
        note="(GB)",
    )
    """Host pool in GB (SGLang's unit); 0 = use hicache_ratio."""
    hicache_write_policy: str = setting(
        "write_through", "when GPU pages are copied to host", env=_env("hicache_write_policy"), choices=WRITE_POLICIES
    )
    hicache_storage_backend: str = setting(
        "", "L3 storage backend name (accepted and reported, not modeled)", env=_env("hicache_storage_backend")
    )
    """Empty = none (/server_info reports null)."""
    enable_priority_scheduling: bool = setting(
        False, "honour the request `priority` field", env=_env("enable_priority_scheduling")
    )
    schedule_low_priority_values_first: bool = setting(
        False,
        "lower priority values are scheduled first (default: higher first)",
        env=_env("schedule_low_priority_values_first"),
    )
    disable_priority_preemption: bool = setting(
        False,
        "with priority scheduling, never preempt a running request for a higher-priority queued one",
        env=_env("disable_priority_preemption"),
    )
    priority_scheduling_preemption_threshold: int = setting(
        10,
        "with priority scheduling, a queued request that finds --max-running-requests reached preempts "
        "running requests whose priority it beats by more than this",
        env=_env("priority_scheduling_preemption_threshold"),
        ge=0,
    )
    timing_profile: str = setting(
        DEFAULT_TIMING_PROFILE, "timing profile name or path to a profile file", env=_env("timing_profile")
    )
    timing_override: tuple[str, ...] = setting(
        (),
        "override one timing-profile field, key=value (repeatable; env comma-separated)",
        env=_env("timing_override"),
        repeated=True,
    )
    """As given; `load_config` parses them into timing_overrides."""
    timing_overrides: Mapping[str, float] = field(default_factory=dict)
    speedup: float = setting(1.0, "divide every simulated duration by this (> 0)", env=_env("speedup"), gt=0)
    seed: int = setting(0, "engine seed (output lengths and token ids)", env=_env("seed"))
    kv_events_endpoint: str = setting(
        "",
        "ZMQ endpoint of the KV-event publisher, e.g. tcp://*:5557 (bound if it contains * or 0.0.0.0, else connected)",
        env=_env("kv_events_endpoint"),
    )
    """As given; `load_config` folds it into kv_events."""
    kv_events_config: str = setting(
        "",
        "SGLang's KV-events JSON: {publisher, endpoint, replay_endpoint, buffer_steps, hwm, topic}",
        env=_env("kv_events_config"),
    )
    """As given; `load_config` folds it into kv_events."""
    kv_events: KvEventsConfig | None = None
    """None = no KV-event publisher."""
    enable_metrics: bool = setting(
        False, "accepted for compatibility; /metrics is always served", env=_env("enable_metrics")
    )
    enable_cache_report: bool = setting(
        False, "report prompt_tokens_details.cached_tokens in OpenAI usage", env=_env("enable_cache_report")
    )
    stream_interval: int = setting(1, "tokens per streamed chunk", env=_env("stream_interval"), ge=1)
    ready_file: str = setting(
        "", 'write {"port": .., "pid": ..} JSON here once serving (atomic rename)', env=_env("ready_file")
    )
    log_level: str = setting("INFO", "log level", env=_env("log_level"), choices=LOG_LEVELS)
    trace_sample_ratio: float | None = setting(
        None,
        "share of new traces to sample, 0..1, parent-based (default: "
        "OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, else every trace); spans are exported by OTLP when "
        "OTEL_EXPORTER_OTLP_ENDPOINT is set",
        env=_env("trace_sample_ratio"),
        ge=0,
        le=1,
    )
    """Root sampling ratio of traces (parent-based); None = OTEL_TRACES_SAMPLER(_ARG), default all."""
    health_generate_timeout_s: float = setting(
        20.0, "how long /health_generate waits for its one token", env=_env("health_generate_timeout_s"), gt=0
    )
    api_key: str = setting(
        "",
        "as SGLang's --api-key: every endpoint but /health* and /metrics* (and OPTIONS) requires "
        '`Authorization: Bearer <key>`, else 401 {"error": "Unauthorized"} (default: none)',
        env=_env("api_key"),
        secret=True,
    )
    """SGLang's `--api-key` ("" = none); never in a repr or a log line."""
    tracing: TraceExport = trace_export_group(ENV_PREFIX.rstrip("_"))
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/observe/trace_export.py)."""

    def __post_init__(self) -> None:
        check_bounds(self)
        if not self.served_model_name:
            object.__setattr__(self, "served_model_name", self.model_path)
        require(bool(self.host), "host", self.host, "host must not be empty")
        require(bool(self.model_path), "model_path", self.model_path, "model_path must not be empty")
        require(
            self.max_total_tokens >= self.page_size,
            "max_total_tokens",
            self.max_total_tokens,
            "max_total_tokens >= page_size",
        )
        require(
            self.chunked_prefill_size >= self.page_size,
            "chunked_prefill_size",
            self.chunked_prefill_size,
            "chunked_prefill_size >= page_size",
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
            not self.hicache_storage_backend or self.enable_hierarchical_cache,
            "hicache_storage_backend",
            self.hicache_storage_backend,
            "--hicache-storage-backend requires --enable-hierarchical-cache",
        )
        require(
            self.schedule_low_priority_values_first is False or self.enable_priority_scheduling,
            "schedule_low_priority_values_first",
            self.schedule_low_priority_values_first,
            "--schedule-low-priority-values-first requires --enable-priority-scheduling",
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
    load_groups(SimWorkerConfig, v, env)  # the --trace-* values -> tracing
    return SimWorkerConfig(
        **{
            **v,
            "served_model_name": served,
            "tokenizer_path": tokenizer_path or tokenizer_alias,
            "timing_overrides": parse_overrides(v["timing_override"]),
            "kv_events": _kv_events(v["kv_events_endpoint"], v["kv_events_config"]),
        }
    )


SETTINGS: list[Setting] = settings_of(SimWorkerConfig)
"""The flags and SIMWORKER_* variables: SimWorkerConfig's fields, the span-export group last."""
