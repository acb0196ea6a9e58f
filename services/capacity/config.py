"""Capacity service configuration: flags > BANDMASTER_CAPACITY_* environment > defaults.

`load_config(argv, env)` is the one mapping function; each setting is declared once, as a
`setting()` field of `CapacityConfig`, whose `__post_init__` checks the declared bounds and the
relations and raises `ConfigError` naming the rule. A config file (TOML) lists static workers:

    [[workers]]
    url = "http://10.0.0.5:30000"
    id = "gpu-a"                       # optional; default host:port
    expected_gpu_kv_tokens = 416864    # optional; a contradiction with /server_info excludes it
    expected_page_size = 16            # optional
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit

from services.capacity.core.state import Expectation, Origin
from services.common.auth.redact import redact_url
from services.common.auth.security import SecurityConfig, security_group
from services.common.observe.trace_export import TraceExport, trace_export_group
from services.common.settings.config import (
    Serve,
    Setting,
    check_bounds,
    load_groups,
    parse_host_port,
    parse_settings,
    require,
    setting,
    settings_of,
)
from services.common.settings.errors import ConfigError
from services.common.sglang.worker_client import WorkerClientConfig, worker_client_group

ENV_PREFIX = "BANDMASTER_CAPACITY"
PROG = "python -m services.capacity"
_WORKER_KEYS = {"url", "id", "expected_gpu_kv_tokens", "expected_page_size"}
MAX_WORKER_ID_LENGTH = 128
MAX_WORKER_URL_LENGTH = 2048
"""A worker URL goes into every snapshot to every watcher, and prefixes every poll's request line."""
# A real /server_info is a few KB (tens with many DP ranks); anything far larger is not one.
DEFAULT_MAX_SERVER_INFO_BYTES = 8 * 1024 * 1024
MIN_SERVER_INFO_BYTES = 1024  # smaller than any real /server_info
MAX_SERVER_INFO_BYTES = 1024 * 1024 * 1024  # one worker must not be able to make us hold more


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper()}"


def validate_worker_url(url: str) -> str:
    """Canonical http(s)://host:port[/prefix] without a trailing slash; ValueError says what is wrong.

    The message quotes the URL with any credentials redacted (they are refused, never echoed).
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("url is required")
    text = url.strip()
    if len(text) > MAX_WORKER_URL_LENGTH:
        raise ValueError(f"url is longer than {MAX_WORKER_URL_LENGTH} characters")
    shown = redact_url(text)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"url {shown!r}: {redact_url(str(exc))}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"url {shown!r}: scheme must be http or https")
    if not parts.hostname:
        raise ValueError(f"url {shown!r}: host is required")
    if port is None or port == 0:
        raise ValueError(f"url {shown!r}: an explicit non-zero port is required")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"url {shown!r}: no query, fragment or credentials allowed")
    return text.rstrip("/")


def worker_id_for(url: str) -> str:
    """The id a worker gets when none is given: host:port of its URL."""
    return urlsplit(url).netloc


def validate_worker_id(worker_id: str) -> str:
    if (
        not worker_id
        or len(worker_id) > MAX_WORKER_ID_LENGTH
        or not worker_id.isprintable()
        or any(c.isspace() for c in worker_id)
    ):
        raise ValueError(
            f"worker_id {worker_id!r} must be 1..{MAX_WORKER_ID_LENGTH} printable characters without spaces"
        )
    return worker_id


@dataclass(frozen=True)
class StaticWorker:
    """A worker named by a flag or the config file."""

    worker_id: str
    url: str
    origin: Origin
    expectation: Expectation = Expectation()


@dataclass(frozen=True)
class CapacityConfig:
    """Each `setting()` field is also a flag and a BANDMASTER_CAPACITY_* variable (declared once, here)."""

    workers: tuple[StaticWorker, ...] = ()
    """Static workers from --worker-url and the config file, in that order."""
    worker_url: tuple[str, ...] = setting(
        (), "SGLang worker base URL http(s)://host:port (repeatable)", env=_env("worker_urls"), repeated=True
    )
    """As given; `load_config` canonicalises them into `workers`."""
    config_file: str = setting("", "TOML file with [[workers]] url=..., id=... entries", env=_env("config_file"))
    """As given; `load_config` reads its workers into `workers`."""
    poll_interval_seconds: float = setting(
        5.0, "seconds between polls of each worker's /server_info and /health", env=_env("poll_interval_seconds"), gt=0
    )
    poll_timeout_seconds: float = setting(2.0, "deadline of each poll request", env=_env("poll_timeout_seconds"), gt=0)
    """Deadline of each HTTP call of a poll; must fit in one interval."""
    unhealthy_after_failures: int = setting(
        3, "consecutive failed polls that make a worker UNHEALTHY", env=_env("unhealthy_after_failures"), ge=1
    )
    remove_unhealthy_after_seconds: float = setting(
        300.0,
        "remove an RPC-registered worker UNHEALTHY this long (0 = never; flag/config workers are kept)",
        env=_env("remove_unhealthy_after_seconds"),
        ge=0,
        note="(0 = never)",
    )
    watch_heartbeat_seconds: float = setting(
        10.0,
        "WatchWorkers sends a heartbeat snapshot after this much quiet",
        env=_env("watch_heartbeat_seconds"),
        gt=0,
    )
    cap_host_at_gpu: bool = setting(
        False,
        "count at most the GPU pool in host tokens per replica (G + min(H, G)); off = G + H",
        env=_env("cap_host_at_gpu"),
    )
    """[LATEST] cap: count at most G host tokens per replica."""
    max_server_info_bytes: int = setting(
        DEFAULT_MAX_SERVER_INFO_BYTES,
        "a larger /server_info body is a card rejection (body_too_large)",
        env=_env("max_server_info_bytes"),
        ge=MIN_SERVER_INFO_BYTES,
        le=MAX_SERVER_INFO_BYTES,
    )
    """A /server_info body larger than this is rejected (read to its end otherwise)."""
    confirm_increase_polls: int = setting(
        2,
        "consecutive polls a budget raise (recovery, a larger card) must be seen on before it is published; "
        "drops are immediate; 1 = no damping",
        env=_env("confirm_increase_polls"),
        ge=1,
        note="(1 = no damping)",
    )
    transition_log_interval_seconds: float = setting(
        60.0,
        "at most one log line per worker and kind of transition in this many seconds, repeats summarised "
        "(0 = log every transition)",
        env=_env("transition_log_interval_seconds"),
        ge=0,
        note="(0 = log every transition)",
    )
    listen: str = Serve.listen(ENV_PREFIX, "127.0.0.1:50051")
    metrics_port: int = Serve.metrics_port(ENV_PREFIX, 9101)
    log_level: str = Serve.log_level(ENV_PREFIX)
    shutdown_grace_seconds: float = Serve.shutdown_grace_seconds(ENV_PREFIX)
    ready_file: str = Serve.ready_file(ENV_PREFIX)
    trace_sample_ratio: float | None = Serve.trace_sample_ratio(ENV_PREFIX)
    """Root sampling ratio of traces (parent-based); None = OTEL_TRACES_SAMPLER(_ARG), default all."""
    security: SecurityConfig = security_group(ENV_PREFIX)
    """TLS, tokens, reflection (services/common/auth/security.py)."""
    tracing: TraceExport = trace_export_group(ENV_PREFIX)
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/observe/trace_export.py)."""
    worker_client: WorkerClientConfig = worker_client_group(ENV_PREFIX)
    """The workers' API key and TLS to https workers, used by every poll (services/common/sglang/worker_client.py)."""

    def __post_init__(self) -> None:
        check_bounds(self)
        parse_host_port(self.listen, "listen")
        require(
            self.poll_timeout_seconds <= self.poll_interval_seconds,
            "poll_timeout_seconds",
            self.poll_timeout_seconds,
            "poll_timeout_seconds <= poll_interval_seconds (one poll per interval)",
        )
        ids: dict[str, str] = {}
        urls: dict[str, str] = {}
        for w in self.workers:
            require(
                w.worker_id not in ids,
                "workers",
                w.worker_id,
                f"worker ids must be unique (id {w.worker_id!r} names {ids.get(w.worker_id)} and {w.url})",
            )
            require(
                w.url not in urls,
                "workers",
                w.url,
                f"worker urls must be unique (url {w.url} is both {urls.get(w.url)!r} and {w.worker_id!r})",
            )
            ids[w.worker_id] = w.url
            urls[w.url] = w.worker_id


SETTINGS: list[Setting] = settings_of(CapacityConfig)
"""The flags and environment variables: CapacityConfig's fields and groups (security, span export, the worker
client)."""


def _file_int(value: Any, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(field_name, value, "must be an integer >= 0")
    return value


def read_config_file(path: str) -> tuple[StaticWorker, ...]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("config_file", path, f"cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config_file", path, f"invalid TOML: {exc}") from None
    unknown = set(data) - {"workers"}
    if unknown:
        raise ConfigError("config_file", sorted(unknown), "unknown top-level keys (only [[workers]] is allowed)")
    entries = data.get("workers", [])
    if not isinstance(entries, list):
        raise ConfigError("config_file.workers", entries, "must be an array of tables ([[workers]])")
    out = []
    for i, entry in enumerate(entries):
        where = f"config_file.workers[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, entry, "must be a table")
        extra = set(entry) - _WORKER_KEYS
        if extra:
            raise ConfigError(where, sorted(extra), f"unknown keys (allowed: {', '.join(sorted(_WORKER_KEYS))})")
        try:
            url = validate_worker_url(entry.get("url", ""))
        except ValueError as exc:
            raw = entry.get("url")
            raise ConfigError(f"{where}.url", redact_url(raw) if isinstance(raw, str) else raw, str(exc)) from None
        worker_id = entry.get("id", worker_id_for(url))
        if not isinstance(worker_id, str):
            raise ConfigError(f"{where}.id", worker_id, "must be a string")
        try:
            validate_worker_id(worker_id)
        except ValueError as exc:
            raise ConfigError(f"{where}.id", worker_id, str(exc)) from None
        expectation = Expectation(
            gpu_kv_tokens=_file_int(entry.get("expected_gpu_kv_tokens", 0), f"{where}.expected_gpu_kv_tokens"),
            page_size=_file_int(entry.get("expected_page_size", 0), f"{where}.expected_page_size"),
        )
        out.append(StaticWorker(worker_id, url, Origin.CONFIG_FILE, expectation))
    return tuple(out)


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> CapacityConfig:
    """Flags and environment -> validated config. Raises ConfigError naming the violated rule."""
    values = parse_settings(
        SETTINGS, argv, env, prog=PROG, description="Bandmaster capacity service: worker registry and retention budgets"
    )
    load_groups(CapacityConfig, values, env)  # security, span export, worker client
    workers: list[StaticWorker] = []
    for url in values["worker_url"]:
        try:
            canonical = validate_worker_url(url)
        except ValueError as exc:
            raise ConfigError("worker_url", redact_url(url), str(exc)) from None
        workers.append(StaticWorker(worker_id_for(canonical), canonical, Origin.FLAG))
    config_file = values["config_file"]
    if config_file:
        workers.extend(read_config_file(config_file))
    return CapacityConfig(workers=tuple(workers), **values)
