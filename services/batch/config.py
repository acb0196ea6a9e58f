"""Batch service configuration: flags > BANDMASTER_BATCH_* environment > defaults.

`load_config(argv, env)` is the one mapping function; unknown flags are refused. Each setting is
declared once, as a `setting()` field of `BatchConfig`, whose `__post_init__` checks the declared
bounds and the relations, raising one `ConfigError` that names the violated rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence
from urllib.parse import urlsplit

from services.batch.core.batch_api import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_REQUESTS, check_id
from services.batch.core.expiry import DEFAULT_RETENTION_S, MIN_EXPIRES_AFTER_S
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
from services.common.settings.errors import ConfigError

ENV_PREFIX = "BANDMASTER_BATCH"
PROG = "python -m services.batch"


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper()}"


@dataclass(frozen=True)
class BatchConfig:
    """Each `setting()` field is also a flag and a BANDMASTER_BATCH_* variable (declared once, here)."""

    # Batch API
    http_listen: str = setting(
        "127.0.0.1:8090",
        "Batch API (OpenAI /v1/files, /v1/batches) HTTP listen host:port (port 0 = any)",
        env=_env("http_listen"),
    )
    registry_path: str = setting(
        "batch.sqlite3",
        "SQLite file of batch files, batches, per-request state and results (':memory:' = nothing survives a restart)",
        env=_env("registry_path"),
    )
    max_batch_requests: int = setting(
        DEFAULT_MAX_REQUESTS,
        "most requests in one batch input file (above: 413)",
        env=_env("max_batch_requests"),
        ge=1,
        le=1_000_000,
    )
    max_file_bytes: int = setting(
        DEFAULT_MAX_FILE_BYTES,
        "largest batch input file in bytes (above: 413)",
        env=_env("max_file_bytes"),
        ge=1024,
        le=1 << 31,
        note="(2 GiB)",
    )
    file_retention_seconds: int = setting(
        DEFAULT_RETENTION_S,
        "seconds a stored file (input, output, error) is kept when its upload (expires_after) or its batch "
        "(output_expires_after) sets no expiry; then the cleanup loop deletes it",
        env=_env("file_retention_seconds"),
        ge=MIN_EXPIRES_AFTER_S,
        le=10 * 365 * 86400,
        note="(10 years)",
    )
    cleanup_interval_seconds: float = setting(
        60.0,
        "seconds between passes of the loop that deletes expired files",
        env=_env("cleanup_interval_seconds"),
        gt=0,
    )
    cleanup_max_files_per_pass: int = setting(
        100,
        "most expired files one cleanup pass deletes (the rest: next pass)",
        env=_env("cleanup_max_files_per_pass"),
        ge=1,
    )
    # The planner
    planner: str = setting(
        "",
        "planner gRPC address host:port: batches become its jobs, its drain lease sets the send rate, progress "
        "is reported to it (required: without a lease nothing is sent)",
        env=_env("planner"),
    )
    pool_id: str = setting(
        "default", "the worker pool whose lease this service follows (the planner's --pool-id)", env=_env("pool_id")
    )
    report_interval_seconds: float = setting(
        1.0, "seconds between progress reports to the planner", env=_env("report_interval_seconds"), gt=0
    )
    planner_timeout_seconds: float = setting(
        3.0, "deadline of each call to the planner", env=_env("planner_timeout_seconds"), gt=0
    )
    # Dispatcher
    dispatch_url: str = setting(
        "",
        "OpenAI-compatible base URL batch requests are sent to (the router) (required)",
        env=_env("dispatch_url"),
    )
    dispatch_max_inflight: int = setting(16, "most batch requests in flight", env=_env("dispatch_max_inflight"), ge=1)
    dispatch_timeout_seconds: float = setting(
        600.0, "deadline of one batch request", env=_env("dispatch_timeout_seconds"), gt=0
    )
    dispatch_max_attempts: int = setting(
        3,
        "sends of one request before a retryable failure becomes an error line",
        env=_env("dispatch_max_attempts"),
        ge=1,
    )
    dispatch_priority: int | None = setting(
        None, "SGLang priority put in each batch request body (unset = none)", env=_env("dispatch_priority")
    )
    listen: str = Serve.listen(ENV_PREFIX, "127.0.0.1:50063")
    """gRPC (health only) host:port."""
    metrics_port: int = Serve.metrics_port(ENV_PREFIX, 9106)
    log_level: str = Serve.log_level(ENV_PREFIX)
    shutdown_grace_seconds: float = Serve.shutdown_grace_seconds(ENV_PREFIX)
    ready_file: str = Serve.ready_file(ENV_PREFIX)
    trace_sample_ratio: float | None = Serve.trace_sample_ratio(ENV_PREFIX)
    security: SecurityConfig = security_group(ENV_PREFIX)
    """TLS, tokens of the gRPC server, the Batch API and the channel to the planner
    (services/common/auth/security.py)."""
    tracing: TraceExport = trace_export_group(ENV_PREFIX)
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/observe/trace_export.py)."""

    def __post_init__(self) -> None:
        check_bounds(self)
        parse_host_port(self.listen, "listen")
        parse_host_port(self.http_listen, "http_listen")
        require(bool(self.registry_path), "registry_path", self.registry_path, "registry_path must not be empty")
        require(bool(self.planner), "planner", "", "--planner (the planner's gRPC host:port) is required")
        parse_host_port(self.planner, "planner")
        try:
            check_id(self.pool_id, "pool_id")
        except ValueError as exc:
            raise ConfigError("pool_id", self.pool_id, str(exc)) from None
        require(bool(self.dispatch_url), "dispatch_url", "", "--dispatch-url (the router's base URL) is required")
        p = urlsplit(self.dispatch_url)
        require(
            p.scheme in ("http", "https") and bool(p.hostname) and not p.username,
            "dispatch_url",
            redact_url(self.dispatch_url),
            "dispatch_url must be an http(s) URL without credentials",
        )


SETTINGS: list[Setting] = settings_of(BatchConfig)
"""The flags and environment variables: BatchConfig's fields and groups (security, span export)."""


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> BatchConfig:
    """Flags and environment -> validated config. Raises ConfigError naming the violated rule."""
    return load_service_config(
        BatchConfig,
        argv,
        env,
        prog=PROG,
        description="Bandmaster batch service: the OpenAI Batch API and its dispatcher, paced by the planner's lease",
    )
