"""Flag + environment mapping shared by every service.

Each service declares its settings once as `Setting`s; `parse_settings` maps command-line flags
and environment variables onto them (flag wins over environment, environment over default) and
turns every malformed value into a `ConfigError` naming the setting. Relations between settings
are checked by the service's frozen config dataclass in `__post_init__`.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from services.common.errors import ConfigError

FLAG_BOOLEANS: Mapping[str, bool] = {
    **dict.fromkeys(("1", "true", "yes", "on"), True),
    **dict.fromkeys(("0", "false", "no", "off"), False),
}
"""What a boolean flag or environment variable may say (any case)."""

TRUE_OR_FALSE: Mapping[str, bool] = {"true": True, "false": False}
"""The strict vocabulary of a protocol header (`X-Dynamo-Session-Final`): `1`, `yes` or `on` are refused."""


def parse_bool(text: str, words: Mapping[str, bool] = FLAG_BOOLEANS) -> bool:
    """The one boolean parser: `text` trimmed and in any case must be one of `words`, else ValueError."""
    value = words.get(text.strip().lower())
    if value is None:
        raise ValueError(f"expected one of {sorted(words)}")
    return value


def parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def parse_int(text: str) -> int:
    return int(text.strip(), 10)


_PARSERS: dict[type, Callable[[str], Any]] = {
    bool: parse_bool,
    float: parse_float,
    int: parse_int,
    str: str,
}


@dataclass(frozen=True)
class Setting:
    """One configurable value.

    `name` is the config field (snake_case); `flag` defaults to `--name-with-dashes`.
    `repeated` settings collect every occurrence of the flag; their environment variable is
    comma-separated.
    """

    name: str
    type: type
    default: Any
    help: str
    env: str | None = None
    flag: str | None = None
    repeated: bool = False
    choices: tuple[str, ...] | None = None

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so that errors become ConfigError."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError("argv", None, message)


def build_parser(prog: str, description: str, settings: Sequence[Setting]) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=description, allow_abbrev=False)
    for s in settings:
        env_note = f" [env {s.env}]" if s.env else ""
        # --help shows every default; a None one is resolved by the service (its help says how, else "none").
        if s.repeated:
            default_note = f" (default: {', '.join(map(str, s.default))})" if s.default else " (default: none)"
        elif s.default is not None:
            default_note = f" (default: {s.default!r})"
        else:
            default_note = "" if "default" in s.help.lower() else " (default: none)"
        help_text = f"{s.help}{default_note}{env_note}"
        if s.type is bool:
            parser.add_argument(
                s.flag_name, dest=s.name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif s.repeated:
            parser.add_argument(s.flag_name, dest=s.name, action="append", default=None, help=help_text)
        else:
            parser.add_argument(s.flag_name, dest=s.name, default=None, help=help_text)
    return parser


def _convert(s: Setting, raw: Any, source: str) -> Any:
    if raw is None:
        return None
    if s.type is bool and isinstance(raw, bool):
        return raw
    try:
        value = _PARSERS[s.type](raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(s.name, raw, f"{source}: expected {s.type.__name__} ({exc})") from None
    if s.choices is not None and value not in s.choices:
        raise ConfigError(s.name, raw, f"{source}: must be one of {', '.join(s.choices)}")
    return value


def parse_settings(
    settings: Sequence[Setting],
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    prog: str,
    description: str = "",
) -> dict[str, Any]:
    """Resolve every setting from flags, then environment, then default.

    Returns `{name: value}`. Raises `ConfigError` for unknown flags and malformed values.
    """
    names = [s.name for s in settings]
    if len(set(names)) != len(names):
        raise ValueError("duplicate setting names")
    args = build_parser(prog, description, settings).parse_args(list(argv))
    out: dict[str, Any] = {}
    for s in settings:
        flag_value = getattr(args, s.name)
        env_value = env.get(s.env) if s.env else None
        if env_value is not None and env_value.strip() == "":
            env_value = None
        if s.repeated:
            if flag_value:
                out[s.name] = tuple(_convert(s, v, s.flag_name) for v in flag_value)
            elif env_value is not None:
                parts = [p.strip() for p in env_value.split(",") if p.strip()]
                out[s.name] = tuple(_convert(s, p, s.env or "") for p in parts)
            else:
                out[s.name] = tuple(s.default or ())
        elif flag_value is not None:
            out[s.name] = _convert(s, flag_value, s.flag_name)
        elif env_value is not None:
            out[s.name] = _convert(s, env_value, s.env or "")
        else:
            out[s.name] = s.default
    return out


def require(condition: bool, field_name: str, value: Any, reason: str) -> None:
    """Raise ConfigError(field_name, value, reason) unless `condition` holds."""
    if not condition:
        raise ConfigError(field_name, value, reason)


def parse_host_port(text: str, field_name: str) -> tuple[str, int]:
    """'host:port' -> (host, port); port 0 means 'pick a free one'."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(field_name, text, "expected host:port")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(field_name, text, "port must be an integer") from None
    if not 0 <= port <= 65535:
        raise ConfigError(field_name, text, "0 <= port <= 65535")
    return host.strip("[]"), port


def serve_settings(prefix: str, grpc_default: str, metrics_default: int) -> list[Setting]:
    """The listen/metrics/log settings every gRPC service has, with its own env prefix."""
    return [
        Setting(
            "listen",
            str,
            grpc_default,
            "gRPC listen address host:port (port 0 = any free port)",
            env=f"{prefix}_LISTEN",
        ),
        Setting(
            "metrics_port",
            int,
            metrics_default,
            "Prometheus /metrics HTTP port on the listen host (0 = any free port, -1 = off)",
            env=f"{prefix}_METRICS_PORT",
        ),
        Setting(
            "log_level",
            str,
            "INFO",
            "log level",
            env=f"{prefix}_LOG_LEVEL",
            choices=("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"),
        ),
        Setting(
            "shutdown_grace_seconds",
            float,
            5.0,
            "seconds in-flight RPCs get on shutdown",
            env=f"{prefix}_SHUTDOWN_GRACE_SECONDS",
        ),
        Setting(
            "ready_file",
            str,
            "",
            "write the bound gRPC and metrics ports as JSON to this file once serving (used by `bandmaster up`)",
            env=f"{prefix}_READY_FILE",
        ),
        Setting(
            "trace_sample_ratio",
            float,
            None,
            "share of new traces to sample, 0..1, parent-based: a request "
            "that arrives with a sampled traceparent is always traced (default: OTEL_TRACES_SAMPLER and "
            "OTEL_TRACES_SAMPLER_ARG, else every trace)",
            env=f"{prefix}_TRACE_SAMPLE_RATIO",
        ),
    ]


def validate_serve(values: Mapping[str, Any]) -> None:
    parse_host_port(values["listen"], "listen")
    require(
        -1 <= values["metrics_port"] <= 65535, "metrics_port", values["metrics_port"], "-1 <= metrics_port <= 65535"
    )
    require(
        values["shutdown_grace_seconds"] >= 0,
        "shutdown_grace_seconds",
        values["shutdown_grace_seconds"],
        "shutdown_grace_seconds >= 0",
    )
    validate_trace_sample_ratio(values.get("trace_sample_ratio"))


def validate_trace_sample_ratio(ratio: float | None) -> None:
    require(ratio is None or 0.0 <= ratio <= 1.0, "trace_sample_ratio", ratio, "0 <= trace_sample_ratio <= 1")
