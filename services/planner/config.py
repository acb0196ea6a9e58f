"""Planner configuration: flags > BANDMASTER_PLANNER_* environment > defaults (reference §6).

`load_config(argv, env)` is the one mapping function; unknown flags are refused. Each setting is
declared once, as a `setting()` field of `PlannerConfig`, whose `__post_init__` checks the declared
bounds and then the relations, raising one `ConfigError` that names the violated rule. The Redis
URL may carry a password: it is never echoed (redacted in errors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence
from urllib.parse import urlsplit

from services.common.auth.redact import redact_url
from services.common.auth.security import SecurityConfig, security_group
from services.common.observe.trace_export import TraceExport, trace_export_group
from services.common.settings.config import (
    Serve,
    Setting,
    check_bounds,
    load_service_config,
    parse_host_port,
    require,
    setting,
    settings_of,
)

ENV_PREFIX = "BANDMASTER_PLANNER"
PROG = "python -m services.planner"
CONNECTORS = ("virtual", "local", "kubernetes")
LEASE_STORES = ("memory", "redis")


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper()}"


@dataclass(frozen=True)
class PlannerConfig:
    """Each `setting()` field is also a flag and a BANDMASTER_PLANNER_* variable (declared once, here)."""

    # Job record
    registry_path: str = setting(
        "planner.sqlite3",
        "SQLite file of the batch jobs planned for: ids, counts, deadlines, no request content "
        "(':memory:' = nothing survives a restart; the batch service re-submits its open batches)",
        env=_env("registry_path"),
    )
    # Pool and tick
    pool_id: str = setting(
        "default",
        "the worker pool this planner owns",
        env=_env("pool_id"),
    )
    work_class: str = setting(
        "default",
        "work class of this planner's batch jobs",
        env=_env("work_class"),
    )
    advisory: bool = setting(
        False,
        "compute and log every decision, actuate nothing (no lease writes, no scaling)",
        env=_env("advisory"),
    )
    tick_interval_seconds: float = setting(
        5.0,
        "seconds between ticks",
        env=_env("tick_interval_seconds"),
        gt=0,
    )
    tick_max_duration_seconds: float = setting(
        10.0,
        "deadline of one tick's observation (over: tick_timeout, zero lease)",
        env=_env("tick_max_duration_seconds"),
        gt=0,
    )
    observe_timeout_seconds: float = setting(
        3.0,
        "deadline of each observation source",
        env=_env("observe_timeout_seconds"),
        gt=0,
    )
    effect_timeout_seconds: float = setting(
        5.0,
        "deadline of each effect (lease write, scale call); over = outcome unknown",
        env=_env("effect_timeout_seconds"),
        gt=0,
    )
    # Batch policy
    safe_rps_per_replica: float = setting(
        0.0,
        "requests/s one ready replica sustains safely (0 = derive from the timing "
        "profile at --throughput-isl/--throughput-osl/--itl-ms)",
        env=_env("safe_rps_per_replica"),
        ge=0,
    )
    safe_rps_fraction: float = setting(
        0.8,
        "fraction of the profile's engine rps taken as safe when deriving it",
        env=_env("safe_rps_fraction"),
        gt=0,
        le=1,
    )
    cold_start_margin_seconds: float = setting(
        30.0,
        "time a new replica needs before it serves",
        env=_env("cold_start_margin_seconds"),
        ge=0,
    )
    finalization_margin_seconds: float = setting(
        5.0,
        "time kept before a deadline to finalize a batch",
        env=_env("finalization_margin_seconds"),
        ge=0,
    )
    max_observation_age_seconds: float = setting(
        30.0,
        "older observations are stale (the policy pauses)",
        env=_env("max_observation_age_seconds"),
        ge=0,
    )
    drain_lease_duration_seconds: float = setting(
        60.0,
        "how long a published lease is valid",
        env=_env("drain_lease_duration_seconds"),
        gt=0,
    )
    min_replicas: int = setting(
        0,
        "replica floor while work is active; the exact warm target when all is idle",
        env=_env("min_replicas"),
        ge=0,
    )
    max_replicas: int = setting(
        8,
        "replica ceiling",
        env=_env("max_replicas"),
    )
    scale_from_zero_replicas: int = setting(
        1,
        "replicas started for a fresh job when the pool is at zero",
        env=_env("scale_from_zero_replicas"),
    )
    max_batch_admission_rps: float = setting(
        -1.0,
        "cap on the batch admission rate (-1 = none, 0 = always paused)",
        env=_env("max_batch_admission_rps"),
    )
    assume_no_online_traffic: bool = setting(
        False,
        "declare that this pool serves no online traffic (online rate 0) "
        "when no router or scheduler is configured; otherwise unknown traffic keeps admission closed",
        env=_env("assume_no_online_traffic"),
    )
    # Lease store
    lease_store: str = setting(
        "memory",
        "where leases are published",
        env=_env("lease_store"),
        choices=LEASE_STORES,
    )
    redis_url: str = setting(
        "",
        "redis:// or rediss:// URL of the lease store (--lease-store redis)",
        env=_env("redis_url"),
    )
    redis_control_key: str = setting(
        "",
        "Redis hash of the lease (default bandmaster:drain-limit:<pool_id>)",
        env=_env("redis_control_key"),
    )
    redis_connect_timeout_seconds: float = setting(
        2.0,
        "Redis connect timeout",
        env=_env("redis_connect_timeout_seconds"),
        gt=0,
    )
    redis_socket_timeout_seconds: float = setting(
        2.0,
        "Redis socket timeout",
        env=_env("redis_socket_timeout_seconds"),
        gt=0,
    )
    # Connector
    connector: str = setting(
        "virtual",
        "how replica targets are applied",
        env=_env("connector"),
        choices=CONNECTORS,
    )
    virtual_initial_replicas: int = setting(
        0,
        "replicas the virtual connector starts with",
        env=_env("virtual_initial_replicas"),
        ge=0,
    )
    virtual_ready_delay_seconds: float = setting(
        0.0,
        "start-up time of a virtual replica",
        env=_env("virtual_ready_delay_seconds"),
        ge=0,
    )
    local_worker_arg: tuple[str, ...] = setting(
        (),
        "argument passed to each local simworker (repeatable; env comma-separated)",
        env=_env("local_worker_arg"),
        repeated=True,
    )
    local_max_workers: int = setting(
        16,
        "most simworker processes the local connector starts",
        env=_env("local_max_workers"),
        ge=1,
        le=256,
    )
    k8s_deployment: str = setting(
        "",
        "worker Deployment to scale (--connector kubernetes)",
        env=_env("k8s_deployment"),
    )
    k8s_namespace: str = setting(
        "default",
        "its namespace",
        env=_env("k8s_namespace"),
    )
    k8s_api_server: str = setting(
        "",
        "API server URL (default: in-cluster config, else kubeconfig)",
        env=_env("k8s_api_server"),
    )
    k8s_writer_fence: bool = setting(
        True,
        "claim a writer annotation on the Deployment and refuse to scale without it",
        env=_env("k8s_writer_fence"),
    )
    # Observation sources
    capacity: str = setting(
        "",
        "capacity service gRPC address (inventory health and load; local workers register there)",
        env=_env("capacity"),
    )
    scheduler: str = setting(
        "",
        "scheduler gRPC address (program signal; online traffic when no router is given); active/standby "
        "replicas: every address, comma-separated (the calls follow the leader)",
        env=_env("scheduler"),
    )
    router_metrics_url: tuple[str, ...] = setting(
        (),
        "router base URL whose /metrics gives online traffic (repeatable)",
        env=_env("router_metrics_url"),
        repeated=True,
    )
    # Scaling proposals
    enable_load_scaling: bool = setting(
        True,
        "reactive scaling from the workers' KV usage and queues (needs --capacity)",
        env=_env("enable_load_scaling"),
    )
    load_scale_up_kv_usage: float = setting(
        0.9,
        "scale up when any worker's KV usage is above this",
        env=_env("load_scale_up_kv_usage"),
    )
    load_scale_down_kv_usage: float = setting(
        0.3,
        "scale down when every worker's KV usage is below this",
        env=_env("load_scale_down_kv_usage"),
    )
    load_scale_up_queued: int = setting(
        4,
        "scale up when any worker queues this many requests",
        env=_env("load_scale_up_queued"),
        ge=1,
    )
    enable_throughput_scaling: bool = setting(
        False,
        "predictive scaling: online rps / the profile's engine rps",
        env=_env("enable_throughput_scaling"),
    )
    throughput_interval_seconds: float = setting(
        60.0,
        "how often throughput scaling is evaluated (replayed between)",
        env=_env("throughput_interval_seconds"),
        gt=0,
    )
    timing_profile: str = setting(
        "glm45-fp8-h200",
        "worker timing profile: a simworker profile name or a file path",
        env=_env("timing_profile"),
    )
    worker_model: str = setting(
        "",
        "the model the workers serve (e.g. meta-llama/Llama-3.1-8B-Instruct); when set, the timing "
        "profile must name the same model or the planner refuses to start ('' = unchecked)",
        env=_env("worker_model"),
    )
    throughput_isl: int = setting(
        2048,
        "typical prompt tokens for the throughput model",
        env=_env("throughput_isl"),
        ge=0,
    )
    throughput_osl: int = setting(
        256,
        "typical output tokens for the throughput model",
        env=_env("throughput_osl"),
        ge=1,
    )
    itl_ms: float = setting(
        50.0,
        "inter-token latency target of the throughput model",
        env=_env("itl_ms"),
        gt=0,
    )
    enable_program_scaling: bool = setting(
        True,
        "program-aware scaling from the scheduler (needs --scheduler)",
        env=_env("enable_program_scaling"),
    )
    program_pause_window_seconds: float = setting(
        30.0,
        "a program paused this long proposes a scale-up",
        env=_env("program_pause_window_seconds"),
        ge=0,
    )
    utilization_window_seconds: float = setting(
        30.0,
        "how long utilisation must stay past a band to count",
        env=_env("utilization_window_seconds"),
        ge=0,
    )
    scale_up_utilization: float = setting(
        0.95,
        "retention utilisation at or above this (sustained) proposes +1",
        env=_env("scale_up_utilization"),
    )
    scale_down_utilization: float = setting(
        0.5,
        "retention utilisation below this (sustained) proposes -1",
        env=_env("scale_down_utilization"),
    )
    startup_reduction_window_seconds: float = setting(
        30.0,
        "a cut of in-progress start-up needs the same explicit evidence for this long",
        env=_env("startup_reduction_window_seconds"),
        ge=0,
    )
    # Budgets
    gpus_per_replica: float = setting(
        1.0,
        "GPUs one replica costs",
        env=_env("gpus_per_replica"),
        gt=0,
    )
    max_gpu_budget: float = setting(
        -1.0,
        "GPUs the pool may use (-1 = no budget)",
        env=_env("max_gpu_budget"),
    )
    watts_per_replica: float = setting(
        0.0,
        "watts one replica draws",
        env=_env("watts_per_replica"),
        ge=0,
    )
    total_power_limit_watts: float = setting(
        -1.0,
        "watts the pool may draw (-1 = no budget)",
        env=_env("total_power_limit_watts"),
    )
    listen: str = Serve.listen(ENV_PREFIX, "127.0.0.1:50061")
    metrics_port: int = Serve.metrics_port(ENV_PREFIX, 9105)
    log_level: str = Serve.log_level(ENV_PREFIX)
    shutdown_grace_seconds: float = Serve.shutdown_grace_seconds(ENV_PREFIX)
    ready_file: str = Serve.ready_file(ENV_PREFIX)
    trace_sample_ratio: float | None = Serve.trace_sample_ratio(ENV_PREFIX)
    """Root sampling ratio of traces (parent-based); None = OTEL_TRACES_SAMPLER(_ARG), default all."""
    security: SecurityConfig = security_group(ENV_PREFIX)
    """TLS, tokens, reflection of the gRPC server and channels (services/common/auth/security.py)."""
    tracing: TraceExport = trace_export_group(ENV_PREFIX)
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/observe/trace_export.py)."""

    @property
    def control_key(self) -> str:
        return self.redis_control_key or f"bandmaster:drain-limit:{self.pool_id}"

    @property
    def minimum_lease_seconds(self) -> float:
        """A healthy planner must renew before its lease expires (reference §3.11): one observation,
        two worst-case ticks, one interval, and two lease writes of two attempts each."""
        store = 0.0
        if self.lease_store == "redis":
            store = 2 * 2 * (self.redis_connect_timeout_seconds + self.redis_socket_timeout_seconds)
        else:
            store = 2 * self.effect_timeout_seconds
        return self.observe_timeout_seconds + 2 * self.tick_max_duration_seconds + self.tick_interval_seconds + store

    def __post_init__(self) -> None:
        check_bounds(self)
        parse_host_port(self.listen, "listen")
        require(bool(self.registry_path), "registry_path", self.registry_path, "registry_path must not be empty")
        require(bool(self.pool_id.strip()), "pool_id", self.pool_id, "pool_id must not be empty")
        require(bool(self.work_class.strip()), "work_class", self.work_class, "work_class must not be empty")
        require(
            self.observe_timeout_seconds <= self.tick_max_duration_seconds,
            "observe_timeout_seconds",
            self.observe_timeout_seconds,
            "observe_timeout_seconds <= tick_max_duration_seconds",
        )
        require(
            self.max_replicas >= max(1, self.min_replicas),
            "max_replicas",
            self.max_replicas,
            "max_replicas >= max(1, min_replicas)",
        )
        require(
            1 <= self.scale_from_zero_replicas <= self.max_replicas,
            "scale_from_zero_replicas",
            self.scale_from_zero_replicas,
            "1 <= scale_from_zero_replicas <= max_replicas",
        )
        # -1 = no cap / no budget: below it, a value is a cap.
        for name, what in (("max_batch_admission_rps", "no cap"), ("max_gpu_budget", "none")):
            value = getattr(self, name)
            require(value == -1 or value >= 0, name, value, f"{name} >= 0 (or -1 = {what})")
        require(
            self.total_power_limit_watts == -1 or (self.total_power_limit_watts >= 0 and self.watts_per_replica > 0),
            "total_power_limit_watts",
            self.total_power_limit_watts,
            "a power budget (>= 0) needs watts_per_replica > 0 (or -1 = none)",
        )
        require(
            self.drain_lease_duration_seconds >= self.minimum_lease_seconds or self.advisory,
            "drain_lease_duration_seconds",
            self.drain_lease_duration_seconds,
            "drain_lease_duration_seconds >= observe_timeout + 2*tick_max_duration + tick_interval + two lease "
            f"writes (= {self.minimum_lease_seconds:g}s), so a healthy planner renews before expiry",
        )
        if self.lease_store == "redis":
            require(bool(self.redis_url), "redis_url", "", "--redis-url is required with --lease-store redis")
            parts = urlsplit(self.redis_url)
            require(
                parts.scheme in ("redis", "rediss") and bool(parts.hostname),
                "redis_url",
                redact_url(self.redis_url),
                "redis_url must be redis://host:port[/db] or rediss://...",
            )
        if self.connector == "kubernetes":
            require(
                bool(self.k8s_deployment),
                "k8s_deployment",
                "",
                "--k8s-deployment is required with --connector kubernetes",
            )
        for url in self.router_metrics_url:
            p = urlsplit(url)
            require(
                p.scheme in ("http", "https") and bool(p.hostname),
                "router_metrics_url",
                redact_url(url),
                "router_metrics_url must be an http(s) URL",
            )
        require(
            0 <= self.load_scale_down_kv_usage < self.load_scale_up_kv_usage,
            "load_scale_down_kv_usage",
            self.load_scale_down_kv_usage,
            "0 <= load_scale_down_kv_usage < load_scale_up_kv_usage",
        )
        require(
            0 <= self.scale_down_utilization < self.scale_up_utilization,
            "scale_down_utilization",
            self.scale_down_utilization,
            "0 <= scale_down_utilization < scale_up_utilization",
        )


SETTINGS: list[Setting] = settings_of(PlannerConfig)
"""The flags and environment variables: PlannerConfig's fields and groups (security, span export)."""


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> PlannerConfig:
    """Flags and environment -> validated config. Raises ConfigError naming the violated rule."""
    return load_service_config(
        PlannerConfig,
        argv,
        env,
        prog=PROG,
        description="Bandmaster planner: batch job demand, drain leases, replica targets (control only: no tokens)",
    )
