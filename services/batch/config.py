"""Batch service configuration: flags > BANDMASTER_BATCH_* environment > defaults.

`load_config(argv, env)` is the one mapping function; unknown flags are refused, and
`BatchConfig.__post_init__` checks every relation, raising one `ConfigError` that names the
violated rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from services.batch.core.batch_api import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_REQUESTS, check_id
from services.batch.core.expiry import DEFAULT_RETENTION_S, MIN_EXPIRES_AFTER_S
from services.common.config import Setting, parse_host_port, parse_settings, require, serve_settings, validate_serve
from services.common.errors import ConfigError
from services.common.redact import redact_url
from services.common.security import SecurityConfig, load_security, security_settings
from services.common.trace_export import TraceExport, load_trace_export, trace_export_settings

ENV_PREFIX = "BANDMASTER_BATCH"
PROG = "python -m services.batch"


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper()}"


def _s(name: str, type_: type, default: Any, help_text: str, **kw: Any) -> Setting:
    return Setting(name, type_, default, help_text, env=_env(name), **kw)


SETTINGS: list[Setting] = [
    # Batch API
    _s(
        "http_listen",
        str,
        "127.0.0.1:8090",
        "Batch API (OpenAI /v1/files, /v1/batches) HTTP listen host:port (port 0 = any)",
    ),
    _s(
        "registry_path",
        str,
        "batch.sqlite3",
        "SQLite file of batch files, batches, per-request state and results (':memory:' = nothing survives a restart)",
    ),
    _s("max_batch_requests", int, DEFAULT_MAX_REQUESTS, "most requests in one batch input file (above: 413)"),
    _s("max_file_bytes", int, DEFAULT_MAX_FILE_BYTES, "largest batch input file in bytes (above: 413)"),
    _s(
        "file_retention_seconds",
        int,
        DEFAULT_RETENTION_S,
        "seconds a stored file (input, output, error) is kept when its upload (expires_after) or its batch "
        "(output_expires_after) sets no expiry; then the cleanup loop deletes it",
    ),
    _s("cleanup_interval_seconds", float, 60.0, "seconds between passes of the loop that deletes expired files"),
    _s("cleanup_max_files_per_pass", int, 100, "most expired files one cleanup pass deletes (the rest: next pass)"),
    # The planner
    _s(
        "planner",
        str,
        "",
        "planner gRPC address host:port: batches become its jobs, its drain lease sets the send rate, progress "
        "is reported to it (required: without a lease nothing is sent)",
    ),
    _s("pool_id", str, "default", "the worker pool whose lease this service follows (the planner's --pool-id)"),
    _s("report_interval_seconds", float, 1.0, "seconds between progress reports to the planner"),
    _s("planner_timeout_seconds", float, 3.0, "deadline of each call to the planner"),
    # Dispatcher
    _s(
        "dispatch_url",
        str,
        "",
        "OpenAI-compatible base URL batch requests are sent to (the router) (required)",
    ),
    _s("dispatch_max_inflight", int, 16, "most batch requests in flight"),
    _s("dispatch_timeout_seconds", float, 600.0, "deadline of one batch request"),
    _s("dispatch_max_attempts", int, 3, "sends of one request before a retryable failure becomes an error line"),
    _s("dispatch_priority", int, None, "SGLang priority put in each batch request body (unset = none)"),
    *serve_settings(ENV_PREFIX, "127.0.0.1:50063", 9106),
    *security_settings(ENV_PREFIX),
    *trace_export_settings(ENV_PREFIX),
]


@dataclass(frozen=True)
class BatchConfig:
    http_listen: str = "127.0.0.1:8090"
    """Batch API HTTP host:port."""
    registry_path: str = "batch.sqlite3"
    """The SQLite file of files, batches, request state and results."""
    max_batch_requests: int = DEFAULT_MAX_REQUESTS
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    file_retention_seconds: int = DEFAULT_RETENTION_S
    """Default lifetime of a stored file (OpenAI's: 30 days)."""
    cleanup_interval_seconds: float = 60.0
    cleanup_max_files_per_pass: int = 100
    planner: str = ""
    """The planner's gRPC address (required)."""
    pool_id: str = "default"
    report_interval_seconds: float = 1.0
    planner_timeout_seconds: float = 3.0
    dispatch_url: str = ""
    """Where batch requests go: the router's OpenAI base URL (required)."""
    dispatch_max_inflight: int = 16
    dispatch_timeout_seconds: float = 600.0
    dispatch_max_attempts: int = 3
    dispatch_priority: int | None = None
    listen: str = "127.0.0.1:50063"
    """gRPC (health only) host:port."""
    metrics_port: int = 9106
    log_level: str = "INFO"
    shutdown_grace_seconds: float = 5.0
    ready_file: str = ""
    trace_sample_ratio: float | None = None
    tracing: TraceExport = TraceExport()
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/trace_export.py)."""
    security: SecurityConfig = SecurityConfig()
    """TLS, tokens of the gRPC server, the Batch API and the channel to the planner (services/common/security.py)."""

    def __post_init__(self) -> None:
        validate_serve(
            {
                "listen": self.listen,
                "metrics_port": self.metrics_port,
                "shutdown_grace_seconds": self.shutdown_grace_seconds,
                "trace_sample_ratio": self.trace_sample_ratio,
            }
        )
        parse_host_port(self.http_listen, "http_listen")
        require(bool(self.registry_path), "registry_path", self.registry_path, "registry_path must not be empty")
        require(
            1 <= self.max_batch_requests <= 1_000_000,
            "max_batch_requests",
            self.max_batch_requests,
            "1 <= max_batch_requests <= 1000000",
        )
        require(
            1024 <= self.max_file_bytes <= 1 << 31,
            "max_file_bytes",
            self.max_file_bytes,
            "1024 <= max_file_bytes <= 2 GiB",
        )
        require(
            MIN_EXPIRES_AFTER_S <= self.file_retention_seconds <= 10 * 365 * 86400,
            "file_retention_seconds",
            self.file_retention_seconds,
            f"{MIN_EXPIRES_AFTER_S} <= file_retention_seconds <= 10 years",
        )
        require(
            math.isfinite(self.cleanup_interval_seconds) and self.cleanup_interval_seconds > 0,
            "cleanup_interval_seconds",
            self.cleanup_interval_seconds,
            "cleanup_interval_seconds > 0",
        )
        require(
            self.cleanup_max_files_per_pass >= 1,
            "cleanup_max_files_per_pass",
            self.cleanup_max_files_per_pass,
            "cleanup_max_files_per_pass >= 1",
        )
        require(bool(self.planner), "planner", "", "--planner (the planner's gRPC host:port) is required")
        parse_host_port(self.planner, "planner")
        try:
            check_id(self.pool_id, "pool_id")
        except ValueError as exc:
            raise ConfigError("pool_id", self.pool_id, str(exc)) from None
        for name in ("report_interval_seconds", "planner_timeout_seconds", "dispatch_timeout_seconds"):
            v = getattr(self, name)
            require(math.isfinite(v) and v > 0, name, v, f"{name} > 0")
        require(
            self.dispatch_max_inflight >= 1,
            "dispatch_max_inflight",
            self.dispatch_max_inflight,
            "dispatch_max_inflight >= 1",
        )
        require(
            self.dispatch_max_attempts >= 1,
            "dispatch_max_attempts",
            self.dispatch_max_attempts,
            "dispatch_max_attempts >= 1",
        )
        require(bool(self.dispatch_url), "dispatch_url", "", "--dispatch-url (the router's base URL) is required")
        p = urlsplit(self.dispatch_url)
        require(
            p.scheme in ("http", "https") and bool(p.hostname) and not p.username,
            "dispatch_url",
            redact_url(self.dispatch_url),
            "dispatch_url must be an http(s) URL without credentials",
        )


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> BatchConfig:
    """Flags and environment -> validated config. Raises ConfigError naming the violated rule."""
    values = parse_settings(
        SETTINGS,
        argv,
        env,
        prog=PROG,
        description="Bandmaster batch service: the OpenAI Batch API and its dispatcher, paced by the planner's lease",
    )
    values["security"] = load_security(values, env)
    values["tracing"] = load_trace_export(values, env)
    known = {f.name for f in fields(BatchConfig)}
    assert set(values) <= known, set(values) - known
    return BatchConfig(**values)
