"""Router configuration: flags > BANDMASTER_ROUTER_* environment > defaults, mapped in `load_config` only.

The KvRouter settings (`--router-temperature`, ...) default to "not given" (None): a value given here
wins, otherwise the scheduler's `GetRouterConfig` answer is used, otherwise the selection core's
defaults. `--block-size` not given follows the workers' `page_size`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from services.common.auth.security import SecurityConfig, security_group
from services.common.observe.trace_export import TraceExport, trace_export_group
from services.common.settings import kv_router_flags
from services.common.settings.config import (
    Serve,
    Setting,
    check_bounds,
    group,
    load_groups,
    parse_host_port,
    parse_settings,
    require,
    setting,
    settings_of,
)
from services.common.sglang.worker_client import WorkerClientConfig, worker_client_group
from services.router.core.breaker import BreakerParams
from services.router.core.deadline import DeadlineParams
from services.router.core.limits import ClientLimitParams

PROG = "python -m services.router"
MAX_PROCESSES = 64
ENV_PREFIX = "BANDMASTER_ROUTER"


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper()}"


@dataclass(frozen=True)
class KvOverrides:
    """KvRouter settings given on the command line; None = not given (the scheduler's value is used)."""

    # KvRouter flags (reference/kvrouter_sglang.md §A.9), declared in services/common/settings/kv_router_flags.py.
    router_temperature: float | None = kv_router_flags.override("router_temperature")
    kv_overlap_score_weight: float | None = kv_router_flags.override("kv_overlap_score_weight")
    use_kv_events: bool | None = kv_router_flags.override("use_kv_events")
    router_track_output_blocks: bool | None = kv_router_flags.override("router_track_output_blocks")
    # The router's own: the prefix index must use the engine's pages, so it follows the workers (the
    # scheduler's router_block_size, from the same environment variable, only when no worker says).
    block_size: int | None = setting(
        None, "KV block size in tokens (default: the workers' page_size)", env="DYN_ROUTER_BLOCK_SIZE", gt=1
    )
    router_ttl_secs: float | None = kv_router_flags.override("router_ttl_secs")

    def __post_init__(self) -> None:
        check_bounds(self)


KV_FROM_SCHEDULER = tuple(f.name for f in fields(KvOverrides) if f.name in kv_router_flags.BY_NAME)
"""The KvRouter flags the router overrides the scheduler's values with."""


@dataclass(frozen=True)
class RouterConfig:
    """Everything one router process needs. Invalid values raise `ConfigError` naming the rule.

    Each `setting()` field is also a flag and an environment variable (declared once, here)."""

    scheduler_addr: str = setting(
        "127.0.0.1:50052",
        "scheduler gRPC address host:port; active/standby replicas: every address, comma-separated (calls "
        "follow the leader)",
        env=_env("scheduler_addr"),
    )
    capacity_addr: str = setting(
        "127.0.0.1:50051",
        "capacity gRPC address host:port",
        env=_env("capacity_addr"),
    )
    http_port: int = setting(
        8000,
        "OpenAI/SGLang HTTP API port on the listen host (0 = any free port)",
        env=_env("http_port"),
        ge=0,
        le=65535,
    )
    processes: int = setting(
        1,
        "router processes sharing the HTTP and gRPC ports (SO_REUSEPORT), to use more than one core; each "
        "keeps its own worker view and KV index, and this process serves /metrics for all of them "
        "(label router_process); see docs/router.md",
        env=_env("processes"),
        ge=1,
        le=MAX_PROCESSES,
    )
    """Router processes on the same ports (`services/router/processes.py`); 1 = this process serves."""
    reuse_port: bool = setting(
        False,
        "bind the HTTP and gRPC ports with SO_REUSEPORT, unchecked (what --processes gives its children)",
        env=_env("reuse_port"),
    )
    """Bind HTTP and gRPC with SO_REUSEPORT, without the taken-port check (a child of `processes`)."""
    use_scheduler: bool = setting(
        True,
        "call the scheduler; --no-scheduler = KV-aware routing only (a benchmark arm)",
        env=_env("scheduler"),
        flag="--scheduler",
    )
    scheduler_mux: bool = setting(
        True,
        "admit and complete turns on one AdmitMux stream per scheduler replica (a scheduler without it gets "
        "the calls of their own); --no-scheduler-mux = an AdmitStream and a Complete call per turn",
        env=_env("scheduler_mux"),
        flag="--scheduler-mux",
    )
    max_body_bytes: int = setting(
        8 * 1024 * 1024,
        "largest accepted request body (larger -> 413)",
        env=_env("max_body_bytes"),
        ge=1024,
    )
    admit_decision_timeout_seconds: float = setting(
        2.0,
        "longest wait for the scheduler's first answer to Admit (a decision, or 'held'); no answer = the "
        "turn fails open and the scheduler counts as down until a probe answers",
        env=_env("admit_decision_timeout_seconds"),
        gt=0,
    )
    admit_hold_timeout_seconds: float = setting(
        3600.0,
        "cap of a held turn's wait (a paused program); the scheduler's announced bound (its resume "
        "timeout) plus the decision timeout applies when shorter; past it the turn fails open",
        env=_env("admit_hold_timeout_seconds"),
        gt=0,
    )
    scheduler_retry_seconds: float = setting(
        1.0,
        "while the scheduler is down, turns fail open at once except one probe Admit per this interval",
        env=_env("scheduler_retry_seconds"),
        gt=0,
    )
    scheduler_timeout_seconds: float = setting(
        2.0,
        "deadline of Bind, Complete, Release and GetRouterConfig",
        env=_env("scheduler_timeout_seconds"),
        gt=0,
    )
    scheduler_failover_seconds: float = setting(
        5.0,
        "with several --scheduler-addr replicas: how long Admit, Complete and Release look for the new leader "
        "before the turn fails open (a failover takes about the lease, 2 s)",
        env=_env("scheduler_failover_seconds"),
        gt=0,
    )
    upstream_connect_timeout_seconds: float = setting(
        5.0,
        "connect timeout to a worker",
        env=_env("upstream_connect_timeout_seconds"),
        gt=0,
    )
    upstream_first_token_timeout_seconds: float = setting(
        60.0,
        "streamed turns: longest wall time from dispatch to the worker's first token; past it the turn "
        "is retried once on another worker",
        env=_env("upstream_first_token_timeout_seconds"),
        gt=0,
    )
    upstream_inter_token_timeout_seconds: float = setting(
        30.0,
        "streamed turns: longest silence between chunks after the first; past it the stream ends with an error event",
        env=_env("upstream_inter_token_timeout_seconds"),
        gt=0,
    )
    upstream_response_timeout_seconds: float = setting(
        600.0,
        "non-streamed turns: longest wall time from dispatch to the whole answer",
        env=_env("upstream_response_timeout_seconds"),
        gt=0,
    )
    worker_failure_threshold: int = setting(
        3,
        "consecutive failures (refused, reset, 5xx, timeouts) that take a worker out of rotation (0 = never)",
        env=_env("worker_failure_threshold"),
        ge=0,
        note="(0 = off)",
    )
    worker_eject_seconds: float = setting(
        5.0,
        "time a worker stays out of rotation before one probe turn; doubles after each failed probe",
        env=_env("worker_eject_seconds"),
        gt=0,
    )
    worker_eject_max_seconds: float = setting(
        60.0,
        "cap of the doubling of worker_eject_seconds",
        env=_env("worker_eject_max_seconds"),
    )
    http_header_timeout_seconds: float = setting(
        10.0,
        "longest a client may take to send a request's headers (from connect, or from its first byte on "
        "a kept-alive connection); the connection is then closed",
        env=_env("http_header_timeout_seconds"),
        gt=0,
    )
    http_body_timeout_seconds: float = setting(
        30.0,
        "longest a client may take to send a request body (-> 408)",
        env=_env("http_body_timeout_seconds"),
        gt=0,
    )
    http_keepalive_timeout_seconds: float = setting(
        60.0,
        "an idle kept-alive connection is closed after this",
        env=_env("http_keepalive_timeout_seconds"),
        gt=0,
    )
    http_max_connections: int = setting(
        2048,
        "open client connections on the HTTP port; more are answered 503 and closed",
        env=_env("http_max_connections"),
        ge=1,
    )
    # Issue 21: the connection share of one client.
    http_max_connections_per_client: int = setting(
        1024,
        "open connections one client (its address; its data token's identity once a request proved it) may "
        "hold; more are answered 503. At --http-max-connections, a client's new connection closes the longest "
        "idle one of the client holding the most (0 = no cap of its own)",
        env=_env("http_max_connections_per_client"),
        ge=0,
        note="(0 = off)",
    )
    http_metrics: bool = setting(
        False,
        "also serve /metrics on the public HTTP port (the metrics port always serves it)",
        env=_env("http_metrics"),
    )
    """Serve /metrics on the public HTTP port too (off: only on the metrics port)."""
    http_server_version: bool = setting(
        False,
        "name the HTTP framework and its version in the Server header (off: 'Server: bandmaster')",
        env=_env("http_server_version"),
    )
    """Send the framework's `Server` header (name and version) instead of `bandmaster`."""
    client_max_programs: int = setting(
        2048,
        "programs (session ids) one client (bearer token, else address) may hold open; more -> 429 (0 = no cap)",
        env=_env("client_max_programs"),
        ge=0,
        note="(0 = off)",
    )
    client_new_programs_per_second: float = setting(
        50.0,
        "sustained rate of new programs per client; faster -> 429 (0 = no limit)",
        env=_env("client_new_programs_per_second"),
        ge=0,
        note="(0 = off)",
    )
    client_new_programs_burst: int = setting(
        200,
        "new programs a client may start at once before the rate applies",
        env=_env("client_new_programs_burst"),
        ge=1,
    )
    client_program_idle_seconds: float = setting(
        900.0,
        "a program not seen for this long stops counting against its client's cap",
        env=_env("client_program_idle_seconds"),
        gt=0,
    )
    sweep_interval_seconds: float = setting(
        5.0,
        "period of the selection core's sweep (stale load, expired history)",
        env=_env("sweep_interval_seconds"),
        gt=0,
    )
    capacity_retry_max_seconds: float = setting(
        5.0,
        "longest back-off between capacity watch reconnects",
        env=_env("capacity_retry_max_seconds"),
        gt=0,
    )
    router_replica_sync: bool = setting(
        False,
        "share this router's active load with the other routers of the fleet through the capacity service "
        'and add theirs to its own (Dynamo\'s KvRouter flag; docs/router.md "Router replica sync")',
        env="DYN_ROUTER_REPLICA_SYNC",
    )
    replica_sync_interval_ms: int = setting(
        100,
        "with --router-replica-sync: shortest interval between load reports (one is sent when the load "
        "changed); a report lives 10 intervals, so a killed router's load leaves its peers' view within that",
        env=_env("replica_sync_interval_ms"),
        ge=10,
        le=5000,
    )
    batch_url: str = setting(
        "",
        "the batch service's Batch API base URL (http(s)://host:port): /v1/files* and /v1/batches* are forwarded "
        "there; empty = those routes answer 404",
        env=_env("batch_url"),
    )
    """The batch service's Batch API base URL; empty = `/v1/files*` and `/v1/batches*` answer 404."""
    batch_priority: int = setting(
        -10,
        "SGLang priority of requests marked X-Bandmaster-Traffic: batch (larger runs first; online turns get "
        "the scheduler's, -2..+1 by default)",
        env=_env("batch_priority"),
    )
    """SGLang `priority` of batch traffic (`X-Bandmaster-Traffic: batch`), in place of the scheduler's."""
    # Bounded waits of a turn that has sent nothing to its client (issue 21; services/router/core/deadline.py).
    failover_floor_seconds: float = setting(
        2.0,
        "a turn's deadline for its worker's first token (non-streamed: its answer) is this plus its uncached "
        "prompt tokens / the worker's prefill rate (capped by the first-token timeout); past it a worker that "
        "does not answer a health probe is taken for frozen and the turn fails over",
        env=_env("failover_floor_seconds"),
        gt=0,
    )
    failover_prefill_tokens_per_second: float = setting(
        4000.0,
        "prefill rate assumed for a worker until its streamed turns measured it",
        env=_env("failover_prefill_tokens_per_second"),
        gt=0,
    )
    failover_probe_timeout_seconds: float = setting(
        3.0,
        "a worker past a turn's deadline must answer GET /health within this, else the turn fails over",
        env=_env("failover_probe_timeout_seconds"),
        gt=0,
    )
    context_length_check: bool = setting(
        True,
        "refuse (400 context_length_exceeded) a prompt that cannot fit the workers' context_length, before "
        "Admit; off for workers that truncate long prompts (SGLang --allow-auto-truncate)",
        env=_env("context_length_check"),
    )
    """Bounded waits (issue 21): see `answer_deadlines` and docs/router.md, Failure semantics."""
    admission_fast_path: bool = setting(
        True,
        "start a turn of a program whose last admission was not held on that admission at once, its Admit "
        "sent in the background, while the scheduler's event stream is live (issue 20: docs/router.md)",
        env=_env("admission_fast_path"),
    )
    """Issue 20 item 4: a turn of an ACTIVE program starts on its cached admission (core/admission_cache.py)."""
    seed: int = setting(
        -1,
        "seed of the selection core's random source (-1 = from the OS)",
        env=_env("seed"),
    )
    tokenizer: str = setting(
        "",
        "the model's tokenizer: a directory with tokenizer.json and tokenizer_config.json (its chat template). "
        "Text prompts are then tokenized exactly and routed on token pages, which KV events can match; "
        "empty = approximate text-chunk mode",
        env=_env("tokenizer"),
    )
    """Directory of the model's tokenizer files; empty = approximate text mode. Loaded by `start_router`."""
    kv: KvOverrides = group(KvOverrides())
    listen: str = Serve.listen(ENV_PREFIX, "127.0.0.1:50053")
    """gRPC `Router` service; its host is also the HTTP and metrics host."""
    metrics_port: int = Serve.metrics_port(ENV_PREFIX, 9103)
    log_level: str = Serve.log_level(ENV_PREFIX)
    shutdown_grace_seconds: float = Serve.shutdown_grace_seconds(ENV_PREFIX)
    ready_file: str = Serve.ready_file(ENV_PREFIX)
    trace_sample_ratio: float | None = Serve.trace_sample_ratio(ENV_PREFIX)
    """Root sampling ratio of traces (parent-based); None = OTEL_TRACES_SAMPLER(_ARG), default all."""
    security: SecurityConfig = security_group(ENV_PREFIX)
    """TLS (gRPC, and HTTPS on the HTTP port), tokens, reflection (services/common/auth/security.py)."""
    tracing: TraceExport = trace_export_group(ENV_PREFIX)
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/observe/trace_export.py)."""
    worker_client: WorkerClientConfig = worker_client_group(ENV_PREFIX)
    """The workers' API key and TLS to https workers (services/common/sglang/worker_client.py)."""

    def __post_init__(self) -> None:
        check_bounds(self)
        parse_host_port(self.listen, "listen")
        parse_host_port(self.capacity_addr, "capacity_addr")
        if self.use_scheduler:
            for address in self.scheduler_addr.split(","):
                parse_host_port(address.strip(), "scheduler_addr")
        require(
            self.admit_decision_timeout_seconds <= self.admit_hold_timeout_seconds,
            "admit_decision_timeout_seconds",
            self.admit_decision_timeout_seconds,
            "admit_decision_timeout_seconds <= admit_hold_timeout_seconds",
        )
        require(
            self.worker_eject_max_seconds >= self.worker_eject_seconds,
            "worker_eject_max_seconds",
            self.worker_eject_max_seconds,
            "worker_eject_max_seconds >= worker_eject_seconds",
        )
        if self.batch_url:
            validate_base_url(self.batch_url, "batch_url")

    @property
    def worker_breaker(self) -> BreakerParams:
        return BreakerParams(self.worker_failure_threshold, self.worker_eject_seconds, self.worker_eject_max_seconds)

    @property
    def answer_deadlines(self) -> DeadlineParams:
        return DeadlineParams(self.failover_floor_seconds, self.failover_prefill_tokens_per_second)

    @property
    def scheduler_breaker(self) -> BreakerParams:
        """Threshold 1: one unanswered Admit and turns fail open at once until a probe answers."""
        return BreakerParams(1, self.scheduler_retry_seconds, self.scheduler_retry_seconds)

    @property
    def client_limits(self) -> ClientLimitParams:
        return ClientLimitParams(
            self.client_max_programs,
            self.client_new_programs_per_second,
            self.client_new_programs_burst,
            self.client_program_idle_seconds,
        )

    @property
    def host(self) -> str:
        return parse_host_port(self.listen, "listen")[0]


def validate_base_url(url: str, field: str) -> None:
    """An http(s)://host:port base URL with no path beyond `/`, query or credentials."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    require(
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and port is not None
        and port > 0
        and parts.path in ("", "/")
        and not parts.query
        and not parts.fragment
        and parts.username is None,
        field,
        url,
        f"{field} must be http(s)://host:port with an explicit port and no path",
    )


SETTINGS: list[Setting] = settings_of(RouterConfig)
"""The flags and environment variables: RouterConfig's fields and groups (the KvRouter overrides, security,
span export, the worker client)."""

_KV_NAMES = tuple(f.name for f in fields(KvOverrides))


def config_from_values(values: Mapping[str, Any]) -> RouterConfig:
    kv = KvOverrides(**{n: values[n] for n in _KV_NAMES})
    return RouterConfig(kv=kv, **{k: v for k, v in values.items() if k not in _KV_NAMES})


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> RouterConfig:
    """The one mapping from flags and environment to a validated `RouterConfig`."""
    kv_router_flags.refuse_unsupported(argv, env)
    values = parse_settings(SETTINGS, argv, env, prog=PROG, description="Bandmaster router (data plane)")
    load_groups(RouterConfig, values, env)  # security, span export, worker client
    return config_from_values(values)
