"""Router configuration: flags > BANDMASTER_ROUTER_* environment > defaults, mapped in `load_config` only.

The KvRouter settings (`--router-temperature`, ...) default to "not given" (None): a value given here
wins, otherwise the scheduler's `GetRouterConfig` answer is used, otherwise the selection core's
defaults. `--block-size` not given follows the workers' `page_size`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from services.common import kv_router_flags
from services.common.config import Setting, parse_host_port, parse_settings, require, serve_settings, validate_serve
from services.common.security import SecurityConfig, load_security, security_settings
from services.common.trace_export import TraceExport, load_trace_export, trace_export_settings
from services.common.worker_client import WorkerClientConfig, load_worker_client, worker_client_settings
from services.router.core.breaker import BreakerParams
from services.router.core.deadline import DeadlineParams
from services.router.core.limits import ClientLimitParams

PROG = "python -m services.router"
MAX_PROCESSES = 64
ENV_PREFIX = "BANDMASTER_ROUTER"


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper()}"


ROUTER_SETTINGS = [
    Setting(
        "scheduler_addr",
        str,
        "127.0.0.1:50052",
        "scheduler gRPC address host:port; active/standby replicas: every address, comma-separated (calls "
        "follow the leader)",
        env=_env("scheduler_addr"),
    ),
    Setting("capacity_addr", str, "127.0.0.1:50051", "capacity gRPC address host:port", env=_env("capacity_addr")),
    Setting(
        "http_port",
        int,
        8000,
        "OpenAI/SGLang HTTP API port on the listen host (0 = any free port)",
        env=_env("http_port"),
    ),
    Setting(
        "processes",
        int,
        1,
        "router processes sharing the HTTP and gRPC ports (SO_REUSEPORT), to use more than one core; each "
        "keeps its own worker view and KV index, and this process serves /metrics for all of them "
        "(label router_process); see docs/router.md",
        env=_env("processes"),
    ),
    Setting(
        "reuse_port",
        bool,
        False,
        "bind the HTTP and gRPC ports with SO_REUSEPORT, unchecked (what --processes gives its children)",
        env=_env("reuse_port"),
    ),
    Setting(
        "use_scheduler",
        bool,
        True,
        "call the scheduler; --no-scheduler = KV-aware routing only (a benchmark arm)",
        env=_env("scheduler"),
        flag="--scheduler",
    ),
    Setting(
        "max_body_bytes",
        int,
        8 * 1024 * 1024,
        "largest accepted request body (larger -> 413)",
        env=_env("max_body_bytes"),
    ),
    Setting(
        "admit_decision_timeout_seconds",
        float,
        2.0,
        "longest wait for the scheduler's first answer to Admit (a decision, or 'held'); no answer = the "
        "turn fails open and the scheduler counts as down until a probe answers",
        env=_env("admit_decision_timeout_seconds"),
    ),
    Setting(
        "admit_hold_timeout_seconds",
        float,
        3600.0,
        "cap of a held turn's wait (a paused program); the scheduler's announced bound (its resume "
        "timeout) plus the decision timeout applies when shorter; past it the turn fails open",
        env=_env("admit_hold_timeout_seconds"),
    ),
    Setting(
        "scheduler_retry_seconds",
        float,
        1.0,
        "while the scheduler is down, turns fail open at once except one probe Admit per this interval",
        env=_env("scheduler_retry_seconds"),
    ),
    Setting(
        "scheduler_timeout_seconds",
        float,
        2.0,
        "deadline of Bind, Complete, Release and GetRouterConfig",
        env=_env("scheduler_timeout_seconds"),
    ),
    Setting(
        "scheduler_failover_seconds",
        float,
        5.0,
        "with several --scheduler-addr replicas: how long Admit, Complete and Release look for the new leader "
        "before the turn fails open (a failover takes about the lease, 2 s)",
        env=_env("scheduler_failover_seconds"),
    ),
    Setting(
        "upstream_connect_timeout_seconds",
        float,
        5.0,
        "connect timeout to a worker",
        env=_env("upstream_connect_timeout_seconds"),
    ),
    Setting(
        "upstream_first_token_timeout_seconds",
        float,
        60.0,
        "streamed turns: longest wall time from dispatch to the worker's first token; past it the turn "
        "is retried once on another worker",
        env=_env("upstream_first_token_timeout_seconds"),
    ),
    Setting(
        "upstream_inter_token_timeout_seconds",
        float,
        30.0,
        "streamed turns: longest silence between chunks after the first; past it the stream ends with an error event",
        env=_env("upstream_inter_token_timeout_seconds"),
    ),
    Setting(
        "upstream_response_timeout_seconds",
        float,
        600.0,
        "non-streamed turns: longest wall time from dispatch to the whole answer",
        env=_env("upstream_response_timeout_seconds"),
    ),
    Setting(
        "worker_failure_threshold",
        int,
        3,
        "consecutive failures (refused, reset, 5xx, timeouts) that take a worker out of rotation (0 = never)",
        env=_env("worker_failure_threshold"),
    ),
    Setting(
        "worker_eject_seconds",
        float,
        5.0,
        "time a worker stays out of rotation before one probe turn; doubles after each failed probe",
        env=_env("worker_eject_seconds"),
    ),
    Setting(
        "worker_eject_max_seconds",
        float,
        60.0,
        "cap of the doubling of worker_eject_seconds",
        env=_env("worker_eject_max_seconds"),
    ),
    Setting(
        "http_header_timeout_seconds",
        float,
        10.0,
        "longest a client may take to send a request's headers (from connect, or from its first byte on "
        "a kept-alive connection); the connection is then closed",
        env=_env("http_header_timeout_seconds"),
    ),
    Setting(
        "http_body_timeout_seconds",
        float,
        30.0,
        "longest a client may take to send a request body (-> 408)",
        env=_env("http_body_timeout_seconds"),
    ),
    Setting(
        "http_keepalive_timeout_seconds",
        float,
        60.0,
        "an idle kept-alive connection is closed after this",
        env=_env("http_keepalive_timeout_seconds"),
    ),
    Setting(
        "http_max_connections",
        int,
        2048,
        "open client connections on the HTTP port; more are answered 503 and closed",
        env=_env("http_max_connections"),
    ),
    # Issue 21: the connection share of one client.
    Setting(
        "http_max_connections_per_client",
        int,
        1024,
        "open connections one client (its address; its data token's identity once a request proved it) may "
        "hold; more are answered 503. At --http-max-connections, a client's new connection closes the longest "
        "idle one of the client holding the most (0 = no cap of its own)",
        env=_env("http_max_connections_per_client"),
    ),
    Setting(
        "http_metrics",
        bool,
        False,
        "also serve /metrics on the public HTTP port (the metrics port always serves it)",
        env=_env("http_metrics"),
    ),
    Setting(
        "http_server_version",
        bool,
        False,
        "name the HTTP framework and its version in the Server header (off: 'Server: bandmaster')",
        env=_env("http_server_version"),
    ),
    Setting(
        "client_max_programs",
        int,
        2048,
        "programs (session ids) one client (bearer token, else address) may hold open; more -> 429 (0 = no cap)",
        env=_env("client_max_programs"),
    ),
    Setting(
        "client_new_programs_per_second",
        float,
        50.0,
        "sustained rate of new programs per client; faster -> 429 (0 = no limit)",
        env=_env("client_new_programs_per_second"),
    ),
    Setting(
        "client_new_programs_burst",
        int,
        200,
        "new programs a client may start at once before the rate applies",
        env=_env("client_new_programs_burst"),
    ),
    Setting(
        "client_program_idle_seconds",
        float,
        900.0,
        "a program not seen for this long stops counting against its client's cap",
        env=_env("client_program_idle_seconds"),
    ),
    Setting(
        "sweep_interval_seconds",
        float,
        5.0,
        "period of the selection core's sweep (stale load, expired history)",
        env=_env("sweep_interval_seconds"),
    ),
    Setting(
        "capacity_retry_max_seconds",
        float,
        5.0,
        "longest back-off between capacity watch reconnects",
        env=_env("capacity_retry_max_seconds"),
    ),
    Setting(
        "batch_url",
        str,
        "",
        "the batch service's Batch API base URL (http(s)://host:port): /v1/files* and /v1/batches* are forwarded "
        "there; empty = those routes answer 404",
        env=_env("batch_url"),
    ),
    Setting(
        "batch_priority",
        int,
        -10,
        "SGLang priority of requests marked X-Bandmaster-Traffic: batch (larger runs first; online turns get "
        "the scheduler's, -2..+1 by default)",
        env=_env("batch_priority"),
    ),
    # Bounded waits of a turn that has sent nothing to its client (issue 21; services/router/core/deadline.py).
    Setting(
        "failover_floor_seconds",
        float,
        2.0,
        "a turn's deadline for its worker's first token (non-streamed: its answer) is this plus its uncached "
        "prompt tokens / the worker's prefill rate (capped by the first-token timeout); past it a worker that "
        "does not answer a health probe is taken for frozen and the turn fails over",
        env=_env("failover_floor_seconds"),
    ),
    Setting(
        "failover_prefill_tokens_per_second",
        float,
        4000.0,
        "prefill rate assumed for a worker until its streamed turns measured it",
        env=_env("failover_prefill_tokens_per_second"),
    ),
    Setting(
        "failover_probe_timeout_seconds",
        float,
        3.0,
        "a worker past a turn's deadline must answer GET /health within this, else the turn fails over",
        env=_env("failover_probe_timeout_seconds"),
    ),
    Setting(
        "context_length_check",
        bool,
        True,
        "refuse (400 context_length_exceeded) a prompt that cannot fit the workers' context_length, before "
        "Admit; off for workers that truncate long prompts (SGLang --allow-auto-truncate)",
        env=_env("context_length_check"),
    ),
    Setting(
        "admission_fast_path",
        bool,
        True,
        "start a turn of a program whose last admission was not held on that admission at once, its Admit "
        "sent in the background, while the scheduler's event stream is live (issue 20: docs/router.md)",
        env=_env("admission_fast_path"),
    ),
    Setting("seed", int, -1, "seed of the selection core's random source (-1 = from the OS)", env=_env("seed")),
    Setting(
        "tokenizer",
        str,
        "",
        "the model's tokenizer: a directory with tokenizer.json and tokenizer_config.json (its chat template). "
        "Text prompts are then tokenized exactly and routed on token pages, which KV events can match; "
        "empty = approximate text-chunk mode",
        env=_env("tokenizer"),
    ),
    # KvRouter flags (reference/kvrouter_sglang.md §A.9); None = take the scheduler's value.
    *kv_router_flags.router_settings(
        "router_temperature", "kv_overlap_score_weight", "use_kv_events", "router_track_output_blocks"
    ),
    # The router's own: the prefix index must use the engine's pages, so it follows the workers (the
    # scheduler's router_block_size, from the same environment variable, only when no worker says).
    Setting(
        "block_size",
        int,
        None,
        "KV block size in tokens (default: the workers' page_size)",
        env="DYN_ROUTER_BLOCK_SIZE",
    ),
    *kv_router_flags.router_settings("router_ttl_secs"),
]

KV_FROM_SCHEDULER = tuple(s.name for s in ROUTER_SETTINGS if s.name in kv_router_flags.BY_NAME)
"""The KvRouter flags the router overrides the scheduler's values with."""

SETTINGS = [
    *ROUTER_SETTINGS,
    *serve_settings(ENV_PREFIX, "127.0.0.1:50053", 9103),
    *security_settings(ENV_PREFIX),
    *trace_export_settings(ENV_PREFIX),
    *worker_client_settings(ENV_PREFIX),  # the workers' API key and TLS (services/common/worker_client.py)
]


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
        kv_router_flags.validate({name: getattr(self, name) for name in KV_FROM_SCHEDULER})
        require(self.block_size is None or self.block_size > 1, "block_size", self.block_size, "block_size > 1")


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
    trace_sample_ratio: float | None = None
    """Root sampling ratio of traces (parent-based); None = OTEL_TRACES_SAMPLER(_ARG), default all."""
    tracing: TraceExport = TraceExport()
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/trace_export.py)."""
    no_scheduler: bool = False
    processes: int = 1
    """Router processes on the same ports (`services/router/processes.py`); 1 = this process serves."""
    reuse_port: bool = False
    """Bind HTTP and gRPC with SO_REUSEPORT, without the taken-port check (a child of `processes`)."""
    max_body_bytes: int = 8 * 1024 * 1024
    admit_decision_timeout_seconds: float = 2.0
    admit_hold_timeout_seconds: float = 3600.0
    scheduler_retry_seconds: float = 1.0
    scheduler_timeout_seconds: float = 2.0
    scheduler_failover_seconds: float = 5.0
    upstream_connect_timeout_seconds: float = 5.0
    upstream_first_token_timeout_seconds: float = 60.0
    upstream_inter_token_timeout_seconds: float = 30.0
    upstream_response_timeout_seconds: float = 600.0
    worker_failure_threshold: int = 3
    worker_eject_seconds: float = 5.0
    worker_eject_max_seconds: float = 60.0
    http_header_timeout_seconds: float = 10.0
    http_body_timeout_seconds: float = 30.0
    http_keepalive_timeout_seconds: float = 60.0
    http_max_connections: int = 2048
    http_max_connections_per_client: int = 1024
    http_metrics: bool = False
    """Serve /metrics on the public HTTP port too (off: only on the metrics port)."""
    http_server_version: bool = False
    """Send the framework's `Server` header (name and version) instead of `bandmaster`."""
    client_max_programs: int = 2048
    client_new_programs_per_second: float = 50.0
    client_new_programs_burst: int = 200
    client_program_idle_seconds: float = 900.0
    sweep_interval_seconds: float = 5.0
    capacity_retry_max_seconds: float = 5.0
    batch_url: str = ""
    """The batch service's Batch API base URL; empty = `/v1/files*` and `/v1/batches*` answer 404."""
    batch_priority: int = -10
    """SGLang `priority` of batch traffic (`X-Bandmaster-Traffic: batch`), in place of the scheduler's."""
    failover_floor_seconds: float = 2.0
    failover_prefill_tokens_per_second: float = 4000.0
    failover_probe_timeout_seconds: float = 3.0
    context_length_check: bool = True
    """Bounded waits (issue 21): see `answer_deadlines` and docs/router.md, Failure semantics."""
    admission_fast_path: bool = True
    """Issue 20 item 4: a turn of an ACTIVE program starts on its cached admission (core/admission_cache.py)."""
    seed: int = -1
    tokenizer: str = ""
    """Directory of the model's tokenizer files; empty = approximate text mode. Loaded by `start_router`."""
    kv: KvOverrides = KvOverrides()
    security: SecurityConfig = SecurityConfig()
    """TLS (gRPC, and HTTPS on the HTTP port), tokens, reflection (services/common/security.py)."""
    worker_client: WorkerClientConfig = WorkerClientConfig()
    """The workers' API key and TLS to https workers (services/common/worker_client.py)."""

    def __post_init__(self) -> None:
        parse_host_port(self.capacity_addr, "capacity_addr")
        if not self.no_scheduler:
            for address in self.scheduler_addr.split(","):
                parse_host_port(address.strip(), "scheduler_addr")
        validate_serve(
            {
                "listen": self.listen,
                "metrics_port": self.metrics_port,
                "shutdown_grace_seconds": self.shutdown_grace_seconds,
                "trace_sample_ratio": self.trace_sample_ratio,
            }
        )
        require(0 <= self.http_port <= 65535, "http_port", self.http_port, "0 <= http_port <= 65535")
        require(1 <= self.processes <= MAX_PROCESSES, "processes", self.processes, f"1 <= processes <= {MAX_PROCESSES}")
        require(self.max_body_bytes >= 1024, "max_body_bytes", self.max_body_bytes, "max_body_bytes >= 1024")
        for name in (
            "admit_decision_timeout_seconds",
            "admit_hold_timeout_seconds",
            "scheduler_retry_seconds",
            "scheduler_timeout_seconds",
            "scheduler_failover_seconds",
            "upstream_connect_timeout_seconds",
            "upstream_first_token_timeout_seconds",
            "upstream_inter_token_timeout_seconds",
            "upstream_response_timeout_seconds",
            "worker_eject_seconds",
            "http_header_timeout_seconds",
            "http_body_timeout_seconds",
            "http_keepalive_timeout_seconds",
            "client_program_idle_seconds",
            "sweep_interval_seconds",
            "capacity_retry_max_seconds",
            "failover_floor_seconds",
            "failover_prefill_tokens_per_second",
            "failover_probe_timeout_seconds",
        ):
            value = getattr(self, name)
            require(value > 0, name, value, f"{name} > 0")
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
        for name in ("worker_failure_threshold", "client_max_programs", "client_new_programs_per_second"):
            value = getattr(self, name)
            require(value >= 0, name, value, f"{name} >= 0 (0 = off)")
        if self.batch_url:
            validate_base_url(self.batch_url, "batch_url")
        require(
            self.http_max_connections >= 1,
            "http_max_connections",
            self.http_max_connections,
            "http_max_connections >= 1",
        )
        require(
            self.http_max_connections_per_client >= 0,
            "http_max_connections_per_client",
            self.http_max_connections_per_client,
            "http_max_connections_per_client >= 0 (0 = off)",
        )
        require(
            self.client_new_programs_burst >= 1,
            "client_new_programs_burst",
            self.client_new_programs_burst,
            "client_new_programs_burst >= 1",
        )

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


def config_from_values(values: Mapping[str, Any]) -> RouterConfig:
    kv_names = (*KV_FROM_SCHEDULER, "block_size")
    kv = KvOverrides(**{n: values[n] for n in kv_names})
    rest = {k: v for k, v in values.items() if k not in kv_names and k != "use_scheduler"}
    return RouterConfig(kv=kv, no_scheduler=not values["use_scheduler"], **rest)


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> RouterConfig:
    """The one mapping from flags and environment to a validated `RouterConfig`."""
    kv_router_flags.refuse_unsupported(argv, env)
    values = parse_settings(SETTINGS, argv, env, prog=PROG, description="Bandmaster router (data plane)")
    security = load_security(values, env)
    worker_client = load_worker_client(values, env)
    tracing = load_trace_export(values, env)
    return config_from_values({**values, "security": security, "worker_client": worker_client, "tracing": tracing})
