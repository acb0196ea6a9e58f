"""Planner configuration: flags > BANDMASTER_PLANNER_* environment > defaults (reference §6).

`load_config(argv, env)` is the one mapping function; unknown flags are refused, and
`PlannerConfig.__post_init__` checks every relation, raising one `ConfigError` that names the
violated rule. The Redis URL may carry a password: it is never echoed (redacted in errors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from services.common.config import Setting, parse_settings, require, serve_settings, validate_serve
from services.common.redact import redact_url
from services.common.security import SecurityConfig, load_security, security_settings
from services.common.trace_export import TraceExport, load_trace_export, trace_export_settings

ENV_PREFIX = "BANDMASTER_PLANNER"
PROG = "python -m services.planner"
CONNECTORS = ("virtual", "local", "kubernetes")
LEASE_STORES = ("memory", "redis")


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper()}"


def _s(name: str, type_: type, default: Any, help_text: str, **kw: Any) -> Setting:
    return Setting(name, type_, default, help_text, env=_env(name), **kw)


SETTINGS: list[Setting] = [
    # Job record
    _s(
        "registry_path",
        str,
        "planner.sqlite3",
        "SQLite file of the batch jobs planned for: ids, counts, deadlines, no request content "
        "(':memory:' = nothing survives a restart; the batch service re-submits its open batches)",
    ),
    # Pool and tick
    _s("pool_id", str, "default", "the worker pool this planner owns"),
    _s("work_class", str, "default", "work class of this planner's batch jobs"),
    _s("advisory", bool, False, "compute and log every decision, actuate nothing (no lease writes, no scaling)"),
    _s("tick_interval_seconds", float, 5.0, "seconds between ticks"),
    _s("tick_max_duration_seconds", float, 10.0, "deadline of one tick's observation (over: tick_timeout, zero lease)"),
    _s("observe_timeout_seconds", float, 3.0, "deadline of each observation source"),
    _s(
        "effect_timeout_seconds",
        float,
        5.0,
        "deadline of each effect (lease write, scale call); over = outcome unknown",
    ),
    # Batch policy
    _s(
        "safe_rps_per_replica",
        float,
        0.0,
        "requests/s one ready replica sustains safely (0 = derive from the timing "
        "profile at --throughput-isl/--throughput-osl/--itl-ms)",
    ),
    _s("safe_rps_fraction", float, 0.8, "fraction of the profile's engine rps taken as safe when deriving it"),
    _s("cold_start_margin_seconds", float, 30.0, "time a new replica needs before it serves"),
    _s("finalization_margin_seconds", float, 5.0, "time kept before a deadline to finalize a batch"),
    _s("max_observation_age_seconds", float, 30.0, "older observations are stale (the policy pauses)"),
    _s("drain_lease_duration_seconds", float, 60.0, "how long a published lease is valid"),
    _s("min_replicas", int, 0, "replica floor while work is active; the exact warm target when all is idle"),
    _s("max_replicas", int, 8, "replica ceiling"),
    _s("scale_from_zero_replicas", int, 1, "replicas started for a fresh job when the pool is at zero"),
    _s("max_batch_admission_rps", float, -1.0, "cap on the batch admission rate (-1 = none, 0 = always paused)"),
    _s(
        "assume_no_online_traffic",
        bool,
        False,
        "declare that this pool serves no online traffic (online rate 0) "
        "when no router or scheduler is configured; otherwise unknown traffic keeps admission closed",
    ),
    # Lease store
    _s("lease_store", str, "memory", "where leases are published", choices=LEASE_STORES),
    _s("redis_url", str, "", "redis:// or rediss:// URL of the lease store (--lease-store redis)"),
    _s("redis_control_key", str, "", "Redis hash of the lease (default bandmaster:drain-limit:<pool_id>)"),
    _s("redis_connect_timeout_seconds", float, 2.0, "Redis connect timeout"),
    _s("redis_socket_timeout_seconds", float, 2.0, "Redis socket timeout"),
    # Connector
    _s("connector", str, "virtual", "how replica targets are applied", choices=CONNECTORS),
    _s("virtual_initial_replicas", int, 0, "replicas the virtual connector starts with"),
    _s("virtual_ready_delay_seconds", float, 0.0, "start-up time of a virtual replica"),
    _s(
        "local_worker_arg",
        str,
        (),
        "argument passed to each local simworker (repeatable; env comma-separated)",
        repeated=True,
    ),
    _s("local_max_workers", int, 16, "most simworker processes the local connector starts"),
    _s("k8s_deployment", str, "", "worker Deployment to scale (--connector kubernetes)"),
    _s("k8s_namespace", str, "default", "its namespace"),
    _s("k8s_api_server", str, "", "API server URL (default: in-cluster config, else kubeconfig)"),
    _s("k8s_writer_fence", bool, True, "claim a writer annotation on the Deployment and refuse to scale without it"),
    # Observation sources
    _s("capacity", str, "", "capacity service gRPC address (inventory health and load; local workers register there)"),
    _s(
        "scheduler",
        str,
        "",
        "scheduler gRPC address (program signal; online traffic when no router is given); active/standby "
        "replicas: every address, comma-separated (the calls follow the leader)",
    ),
    _s(
        "router_metrics_url", str, (), "router base URL whose /metrics gives online traffic (repeatable)", repeated=True
    ),
    # Scaling proposals
    _s("enable_load_scaling", bool, True, "reactive scaling from the workers' KV usage and queues (needs --capacity)"),
    _s("load_scale_up_kv_usage", float, 0.9, "scale up when any worker's KV usage is above this"),
    _s("load_scale_down_kv_usage", float, 0.3, "scale down when every worker's KV usage is below this"),
    _s("load_scale_up_queued", int, 4, "scale up when any worker queues this many requests"),
    _s("enable_throughput_scaling", bool, False, "predictive scaling: online rps / the profile's engine rps"),
    _s("throughput_interval_seconds", float, 60.0, "how often throughput scaling is evaluated (replayed between)"),
    _s("timing_profile", str, "glm45-fp8-h200", "worker timing profile: a simworker profile name or a file path"),
    _s("throughput_isl", int, 2048, "typical prompt tokens for the throughput model"),
    _s("throughput_osl", int, 256, "typical output tokens for the throughput model"),
    _s("itl_ms", float, 50.0, "inter-token latency target of the throughput model"),
    _s("enable_program_scaling", bool, True, "program-aware scaling from the scheduler (needs --scheduler)"),
    _s("program_pause_window_seconds", float, 30.0, "a program paused this long proposes a scale-up"),
    _s("utilization_window_seconds", float, 30.0, "how long utilisation must stay past a band to count"),
    _s("scale_up_utilization", float, 0.95, "retention utilisation at or above this (sustained) proposes +1"),
    _s("scale_down_utilization", float, 0.5, "retention utilisation below this (sustained) proposes -1"),
    _s(
        "startup_reduction_window_seconds",
        float,
        30.0,
        "a cut of in-progress start-up needs the same explicit evidence for this long",
    ),
    # Budgets
    _s("gpus_per_replica", float, 1.0, "GPUs one replica costs"),
    _s("max_gpu_budget", float, -1.0, "GPUs the pool may use (-1 = no budget)"),
    _s("watts_per_replica", float, 0.0, "watts one replica draws"),
    _s("total_power_limit_watts", float, -1.0, "watts the pool may draw (-1 = no budget)"),
    *serve_settings(ENV_PREFIX, "127.0.0.1:50061", 9105),
    *security_settings(ENV_PREFIX),
    *trace_export_settings(ENV_PREFIX),
]


@dataclass(frozen=True)
class PlannerConfig:
    registry_path: str = "planner.sqlite3"
    pool_id: str = "default"
    work_class: str = "default"
    advisory: bool = False
    tick_interval_seconds: float = 5.0
    tick_max_duration_seconds: float = 10.0
    observe_timeout_seconds: float = 3.0
    effect_timeout_seconds: float = 5.0
    safe_rps_per_replica: float = 0.0
    safe_rps_fraction: float = 0.8
    cold_start_margin_seconds: float = 30.0
    finalization_margin_seconds: float = 5.0
    max_observation_age_seconds: float = 30.0
    drain_lease_duration_seconds: float = 60.0
    min_replicas: int = 0
    max_replicas: int = 8
    scale_from_zero_replicas: int = 1
    max_batch_admission_rps: float = -1.0
    assume_no_online_traffic: bool = False
    lease_store: str = "memory"
    redis_url: str = ""
    redis_control_key: str = ""
    redis_connect_timeout_seconds: float = 2.0
    redis_socket_timeout_seconds: float = 2.0
    connector: str = "virtual"
    virtual_initial_replicas: int = 0
    virtual_ready_delay_seconds: float = 0.0
    local_worker_arg: tuple[str, ...] = ()
    local_max_workers: int = 16
    k8s_deployment: str = ""
    k8s_namespace: str = "default"
    k8s_api_server: str = ""
    k8s_writer_fence: bool = True
    capacity: str = ""
    scheduler: str = ""
    router_metrics_url: tuple[str, ...] = ()
    enable_load_scaling: bool = True
    load_scale_up_kv_usage: float = 0.9
    load_scale_down_kv_usage: float = 0.3
    load_scale_up_queued: int = 4
    enable_throughput_scaling: bool = False
    throughput_interval_seconds: float = 60.0
    timing_profile: str = "glm45-fp8-h200"
    throughput_isl: int = 2048
    throughput_osl: int = 256
    itl_ms: float = 50.0
    enable_program_scaling: bool = True
    program_pause_window_seconds: float = 30.0
    utilization_window_seconds: float = 30.0
    scale_up_utilization: float = 0.95
    scale_down_utilization: float = 0.5
    startup_reduction_window_seconds: float = 30.0
    gpus_per_replica: float = 1.0
    max_gpu_budget: float = -1.0
    watts_per_replica: float = 0.0
    total_power_limit_watts: float = -1.0
    listen: str = "127.0.0.1:50061"
    metrics_port: int = 9105
    log_level: str = "INFO"
    shutdown_grace_seconds: float = 5.0
    ready_file: str = ""
    trace_sample_ratio: float | None = None
    """Root sampling ratio of traces (parent-based); None = OTEL_TRACES_SAMPLER(_ARG), default all."""
    tracing: TraceExport = TraceExport()
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/trace_export.py)."""
    security: SecurityConfig = SecurityConfig()
    """TLS, tokens, reflection of the gRPC server and channels (services/common/security.py)."""

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
        validate_serve(
            {
                "listen": self.listen,
                "metrics_port": self.metrics_port,
                "shutdown_grace_seconds": self.shutdown_grace_seconds,
                "trace_sample_ratio": self.trace_sample_ratio,
            }
        )
        require(bool(self.registry_path), "registry_path", self.registry_path, "registry_path must not be empty")
        require(bool(self.pool_id.strip()), "pool_id", self.pool_id, "pool_id must not be empty")
        require(bool(self.work_class.strip()), "work_class", self.work_class, "work_class must not be empty")
        for name in (
            "tick_interval_seconds",
            "tick_max_duration_seconds",
            "observe_timeout_seconds",
            "effect_timeout_seconds",
            "drain_lease_duration_seconds",
            "redis_connect_timeout_seconds",
            "redis_socket_timeout_seconds",
            "throughput_interval_seconds",
            "itl_ms",
        ):
            v = getattr(self, name)
            require(math.isfinite(v) and v > 0, name, v, f"{name} > 0")
        for name in (
            "cold_start_margin_seconds",
            "finalization_margin_seconds",
            "max_observation_age_seconds",
            "virtual_ready_delay_seconds",
            "program_pause_window_seconds",
            "utilization_window_seconds",
            "startup_reduction_window_seconds",
            "safe_rps_per_replica",
            "watts_per_replica",
        ):
            v = getattr(self, name)
            require(math.isfinite(v) and v >= 0, name, v, f"{name} >= 0")
        require(
            self.observe_timeout_seconds <= self.tick_max_duration_seconds,
            "observe_timeout_seconds",
            self.observe_timeout_seconds,
            "observe_timeout_seconds <= tick_max_duration_seconds",
        )
        require(
            0 < self.safe_rps_fraction <= 1, "safe_rps_fraction", self.safe_rps_fraction, "0 < safe_rps_fraction <= 1"
        )
        require(self.min_replicas >= 0, "min_replicas", self.min_replicas, "min_replicas >= 0")
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
        require(
            self.max_batch_admission_rps == -1 or self.max_batch_admission_rps >= 0,
            "max_batch_admission_rps",
            self.max_batch_admission_rps,
            "max_batch_admission_rps >= 0 (or -1 = no cap)",
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
        require(
            self.virtual_initial_replicas >= 0,
            "virtual_initial_replicas",
            self.virtual_initial_replicas,
            "virtual_initial_replicas >= 0",
        )
        require(
            1 <= self.local_max_workers <= 256,
            "local_max_workers",
            self.local_max_workers,
            "1 <= local_max_workers <= 256",
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
            self.load_scale_up_queued >= 1,
            "load_scale_up_queued",
            self.load_scale_up_queued,
            "load_scale_up_queued >= 1",
        )
        require(
            0 <= self.scale_down_utilization < self.scale_up_utilization,
            "scale_down_utilization",
            self.scale_down_utilization,
            "0 <= scale_down_utilization < scale_up_utilization",
        )
        require(
            self.throughput_isl >= 0 and self.throughput_osl >= 1,
            "throughput_osl",
            self.throughput_osl,
            "throughput_isl >= 0 and throughput_osl >= 1",
        )
        require(self.gpus_per_replica > 0, "gpus_per_replica", self.gpus_per_replica, "gpus_per_replica > 0")
        require(
            self.max_gpu_budget == -1 or self.max_gpu_budget >= 0,
            "max_gpu_budget",
            self.max_gpu_budget,
            "max_gpu_budget >= 0 (or -1 = none)",
        )
        require(
            self.total_power_limit_watts == -1 or (self.total_power_limit_watts >= 0 and self.watts_per_replica > 0),
            "total_power_limit_watts",
            self.total_power_limit_watts,
            "a power budget (>= 0) needs watts_per_replica > 0 (or -1 = none)",
        )


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> PlannerConfig:
    """Flags and environment -> validated config. Raises ConfigError naming the violated rule."""
    values = parse_settings(
        SETTINGS,
        argv,
        env,
        prog=PROG,
        description="Bandmaster planner: batch job demand, drain leases, replica targets (control only: no tokens)",
    )
    values["security"] = load_security(values, env)
    values["tracing"] = load_trace_export(values, env)
    known = {f.name for f in fields(PlannerConfig)}
    assert set(values) <= known, set(values) - known
    return PlannerConfig(**values)
