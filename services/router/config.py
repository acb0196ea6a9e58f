"""Router configuration: flags > BANDMASTER_ROUTER_* environment > defaults, mapped in `load_config` only.

The KvRouter settings (`--router-temperature`, ...) default to "not given" (None): a value given here
wins, otherwise the scheduler's `GetRouterConfig` answer is used, otherwise the selection core's
defaults. `--block-size` not given follows the workers' `page_size`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from services.common.config import Setting, parse_host_port, parse_settings, require, serve_settings, validate_serve

PROG = "python -m services.router"
ENV_PREFIX = "BANDMASTER_ROUTER"


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper()}"


ROUTER_SETTINGS = [
    Setting("scheduler_addr", str, "127.0.0.1:50052", "scheduler gRPC address host:port", env=_env("scheduler_addr")),
    Setting("capacity_addr", str, "127.0.0.1:50051", "capacity gRPC address host:port", env=_env("capacity_addr")),
    Setting("http_port", int, 8000, "OpenAI/SGLang HTTP API port on the listen host (0 = any free port)",
            env=_env("http_port")),
    Setting("use_scheduler", bool, True, "call the scheduler; --no-scheduler = KV-aware routing only (a benchmark arm)",
            env=_env("scheduler"), flag="--scheduler"),
    Setting("max_body_bytes", int, 8 * 1024 * 1024, "largest accepted request body (larger -> 413)",
            env=_env("max_body_bytes")),
    Setting("admit_timeout_seconds", float, 3600.0,
            "longest a turn waits in scheduler Admit (a paused program) before failing open",
            env=_env("admit_timeout_seconds")),
    Setting("scheduler_timeout_seconds", float, 2.0, "deadline of Bind, Complete, Release and GetRouterConfig",
            env=_env("scheduler_timeout_seconds")),
    Setting("upstream_connect_timeout_seconds", float, 5.0, "connect timeout to a worker",
            env=_env("upstream_connect_timeout_seconds")),
    Setting("upstream_idle_timeout_seconds", float, 300.0,
            "longest silence from a worker (before the first byte or between chunks) before the turn fails",
            env=_env("upstream_idle_timeout_seconds")),
    Setting("sweep_interval_seconds", float, 5.0, "period of the selection core's sweep (stale load, expired history)",
            env=_env("sweep_interval_seconds")),
    Setting("capacity_retry_max_seconds", float, 5.0, "longest back-off between capacity watch reconnects",
            env=_env("capacity_retry_max_seconds")),
    Setting("seed", int, -1, "seed of the selection core's random source (-1 = from the OS)", env=_env("seed")),
    Setting("tokenizer", str, "",
            "the model's tokenizer: a directory with tokenizer.json and tokenizer_config.json (its chat template). "
            "Text prompts are then tokenized exactly and routed on token pages, which KV events can match; "
            "empty = approximate text-chunk mode", env=_env("tokenizer")),
    # KvRouter flags (reference/kvrouter_sglang.md §A.9); None = take the scheduler's value.
    Setting("router_temperature", float, None, "softmax temperature of worker selection (0 = argmin)",
            env="DYN_ROUTER_TEMPERATURE"),
    Setting("kv_overlap_score_weight", float, None, "weight of the prefill (uncached tokens) term",
            env="DYN_KV_OVERLAP_SCORE_WEIGHT"),
    Setting("use_kv_events", bool, None, "index the workers' ZMQ KV events (else routing history with a TTL)",
            env="DYN_USE_KV_EVENTS"),
    Setting("router_track_output_blocks", bool, None, "count generated tokens as decode blocks",
            env="DYN_ROUTER_TRACK_OUTPUT_BLOCKS"),
    Setting("block_size", int, None, "KV block size in tokens (default: the workers' page_size)",
            env="DYN_ROUTER_BLOCK_SIZE"),
    Setting("router_ttl_secs", float, None, "approximate mode: seconds a routing decision is remembered",
            env="DYN_ROUTER_TTL_SECS"),
]

SETTINGS = [*ROUTER_SETTINGS, *serve_settings(ENV_PREFIX, "127.0.0.1:50053", 9103)]


@dataclass(frozen=True)
class KvOverrides:
    """KvRouter settings given on the command line; None = not given."""

    router_temperature: float | None = None
    kv_overlap_score_weight: float | None = None
    use_kv_events: bool | None = None
    router_track_output_blocks: bool | None = None
    block_size: int | None = None
    router_ttl_secs: float | None = None

    def __post_init__(self) -> None:
        t, w = self.router_temperature, self.kv_overlap_score_weight
        require(t is None or t >= 0, "router_temperature", t, "router_temperature >= 0")
        require(w is None or w >= 0, "kv_overlap_score_weight", w, "kv_overlap_score_weight >= 0")
        require(self.block_size is None or self.block_size > 1, "block_size", self.block_size, "block_size > 1")
        require(self.router_ttl_secs is None or self.router_ttl_secs > 0, "router_ttl_secs", self.router_ttl_secs,
                "router_ttl_secs > 0")


@dataclass(frozen=True)
class RouterConfig:
    """Everything one router process needs. Invalid values raise `ConfigError` naming the rule."""

    scheduler_addr: str = "127.0.0.1:50052"
    capacity_addr: str = "127.0.0.1:50051"
    listen: str = "127.0.0.1:0"
    """gRPC `Router` service; its host is also the HTTP and metrics host."""
    http_port: int = 0
    metrics_port: int = -1
    log_level: str = "INFO"
    shutdown_grace_seconds: float = 5.0
    ready_file: str = ""
    no_scheduler: bool = False
    max_body_bytes: int = 8 * 1024 * 1024
    admit_timeout_seconds: float = 3600.0
    scheduler_timeout_seconds: float = 2.0
    upstream_connect_timeout_seconds: float = 5.0
    upstream_idle_timeout_seconds: float = 300.0
    sweep_interval_seconds: float = 5.0
    capacity_retry_max_seconds: float = 5.0
    seed: int = -1
    tokenizer: str = ""
    """Directory of the model's tokenizer files; empty = approximate text mode. Loaded by `start_router`."""
    kv: KvOverrides = KvOverrides()

    def __post_init__(self) -> None:
        parse_host_port(self.capacity_addr, "capacity_addr")
        if not self.no_scheduler:
            parse_host_port(self.scheduler_addr, "scheduler_addr")
        validate_serve({"listen": self.listen, "metrics_port": self.metrics_port,
                        "shutdown_grace_seconds": self.shutdown_grace_seconds})
        require(0 <= self.http_port <= 65535, "http_port", self.http_port, "0 <= http_port <= 65535")
        require(self.max_body_bytes >= 1024, "max_body_bytes", self.max_body_bytes, "max_body_bytes >= 1024")
        for name in ("admit_timeout_seconds", "scheduler_timeout_seconds", "upstream_connect_timeout_seconds",
                     "upstream_idle_timeout_seconds", "sweep_interval_seconds", "capacity_retry_max_seconds"):
            value = getattr(self, name)
            require(value > 0, name, value, f"{name} > 0")
        require(self.scheduler_timeout_seconds <= self.admit_timeout_seconds, "scheduler_timeout_seconds",
                self.scheduler_timeout_seconds, "scheduler_timeout_seconds <= admit_timeout_seconds")

    @property
    def host(self) -> str:
        return parse_host_port(self.listen, "listen")[0]


def config_from_values(values: Mapping[str, Any]) -> RouterConfig:
    kv_names = ("router_temperature", "kv_overlap_score_weight", "use_kv_events", "router_track_output_blocks",
                "block_size", "router_ttl_secs")
    kv = KvOverrides(**{n: values[n] for n in kv_names})
    rest = {k: v for k, v in values.items() if k not in kv_names and k != "use_scheduler"}
    return RouterConfig(kv=kv, no_scheduler=not values["use_scheduler"], **rest)


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> RouterConfig:
    """The one mapping from flags and environment to a validated `RouterConfig`."""
    values = parse_settings(SETTINGS, argv, env, prog=PROG, description="Bandmaster router (data plane)")
    return config_from_values(values)
