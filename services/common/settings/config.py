"""Flag + environment mapping shared by every service.

A service declares each setting once, as a field of its frozen config dataclass made by `setting()`
(default, help, environment variable, flag, bounds, choices):

    poll_interval_seconds: float = setting(5.0, "seconds between polls", env="X_POLL_INTERVAL_SECONDS", gt=0)

A group of settings that several services share (security, span export, the worker client) is a small
dataclass of `setting()` fields whose environment names start with `{prefix}`, composed into each
service's config by a `group(..., prefix=ENV_PREFIX, load=...)` field; `load_groups` builds those fields
from the parsed values, and `load_service_config` is the whole `load_config` of a service that needs
nothing more (parse, load the groups, construct).

`settings_of(Config)` derives the `Setting` list from those fields; `parse_settings` maps
command-line flags and environment variables onto it (flag wins over environment, environment over
default) and turns every malformed value into a `ConfigError` naming the setting. `check_bounds(config)`,
called first in the config's `__post_init__`, enforces every declared bound and choice with a
`ConfigError` naming the setting and the rule ("1 <= page_size <= 1024"); relations between settings
stay as explicit code after it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from services.common.settings.errors import ConfigError

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


_SPEC = "bandmaster.setting"
"""The dataclass-field metadata key under which `setting()` stores its declaration."""


@dataclass(frozen=True)
class Bounds:
    """The declared rule of a numeric setting: any of ge (>=), gt (>), le (<=), lt (<)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def rule(self, name: str) -> str:
        """The rule as text, e.g. "1 <= page_size <= 1024" or "poll_interval_seconds > 0"."""
        low = f"{_num(self.ge)} <= " if self.ge is not None else f"{_num(self.gt)} < " if self.gt is not None else ""
        high = f" <= {_num(self.le)}" if self.le is not None else f" < {_num(self.lt)}" if self.lt is not None else ""
        if low and high:
            return f"{low}{name}{high}"
        if low:  # one-sided: the name first, as people write it
            return f"{name} >= {_num(self.ge)}" if self.ge is not None else f"{name} > {_num(self.gt)}"
        return f"{name}{high}"

    def holds(self, value: float) -> bool:
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )


def _num(bound: float | None) -> str:
    return str(int(bound)) if isinstance(bound, float) and bound.is_integer() else str(bound)


@dataclass(frozen=True)
class _Spec:
    help: str
    env: str | None
    flag: str | None
    repeated: bool
    choices: tuple[str, ...] | None
    bounds: Bounds
    note: str
    type: type | None


def setting(
    default: Any,
    help: str,
    *,
    env: str | None = None,
    flag: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Sequence[str] | None = None,
    repeated: bool = False,
    note: str = "",
    type: type | None = None,
    secret: bool = False,
) -> Any:
    """Declare a config field that is also a flag and an environment variable.

    Returns a `dataclasses.field`; the flag's type comes from the field's annotation (`float | None`
    is a float, `tuple[str, ...]` with `repeated=True` a repeatable str) unless `type` is given.
    `ge`/`gt`/`le`/`lt` bound the value (None always passes); `note` is appended to the bound's
    error message, e.g. "(0 = never)". The value is checked by `check_bounds`. A `secret` value
    (an API key) is left out of the config's repr.
    """
    spec = _Spec(
        help, env, flag, repeated, tuple(choices) if choices is not None else None, Bounds(ge, gt, le, lt), note, type
    )
    return dataclasses.field(default=default, repr=not secret, metadata={_SPEC: spec})


_GROUP = "bandmaster.setting_group"

Loader = Callable[[dict[str, Any], Mapping[str, str]], Any]
"""Builds a group field from the parsed values, popping its flags' names (`load_security(values, env)`)."""


@dataclass(frozen=True)
class _Group:
    flags: type | None
    prefix: str | None
    load: Loader | None


def group(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    flags: Any = None,
    prefix: str | None = None,
    load: Loader | None = None,
) -> Any:
    """A nested config whose flags are listed in its place among the outer config's.

    Without `flags` the field's own dataclass declares them with `setting()` fields
    (`kv: KvOverrides = group(KvOverrides())`) and checks its own bounds; with `flags` that dataclass
    declares them and the field is built from their values (a core parameter set that knows nothing of
    flags: `lease: LeaseParams = group(default_factory=LeaseParams, flags=LeaseFlags)`): by `load`
    when given (`load_groups`), else by the service's `load_config`. `prefix` fills the `{prefix}` of
    the flags' environment names (a group shared by services: `<prefix>_TLS_CERT`).
    """
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={_GROUP: _Group(flags, prefix, load)}
    )


def setting_like(cls: type, name: str, *, default: Any, help_suffix: str = "") -> Any:
    """The `setting()` field `name` of `cls` again, with another default and `help_suffix` added: the
    same env, flag, bounds and choices (the router's overrides of the KvRouter flags)."""
    spec = _spec(cls, name)
    return dataclasses.field(default=default, metadata={_SPEC: dataclasses.replace(spec, help=spec.help + help_suffix)})


def _spec(cls: type, name: str) -> _Spec:
    return _specs(cls)[name]


_SPECS: dict[type, dict[str, _Spec]] = {}


def _specs(cls: type) -> dict[str, _Spec]:
    """`cls`'s `setting()` fields by name, cached (a dataclass's fields never change once it is made)."""
    if cls not in _SPECS:
        _SPECS[cls] = {f.name: f.metadata[_SPEC] for f in dataclasses.fields(cls) if _SPEC in f.metadata}
    return _SPECS[cls]


def _flag_type(annotation: Any) -> type:
    """`float | None` -> float, `tuple[str, ...]` -> str, `int` -> int."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        origin = typing.get_origin(annotation)
    if origin is tuple:
        annotation = typing.get_args(annotation)[0]
    if annotation not in _PARSERS:
        raise TypeError(f"no flag parser for {annotation!r}")
    return typing.cast(type, annotation)


def settings_of(cls: type, *, prefix: str | None = None) -> list[Setting]:
    """The `Setting`s declared by `cls`'s `setting()` fields (and its `group()`s'), in field order.
    `prefix` fills the `{prefix}` of environment names (a group's own prefix wins)."""
    hints = typing.get_type_hints(cls)
    out: list[Setting] = []
    for f in dataclasses.fields(cls):
        if _GROUP in f.metadata:
            g: _Group = f.metadata[_GROUP]
            out.extend(settings_of(g.flags or hints[f.name], prefix=g.prefix or prefix))
        elif _SPEC in f.metadata:
            spec = f.metadata[_SPEC]
            out.append(
                Setting(
                    f.name,
                    spec.type or _flag_type(hints[f.name]),
                    f.default,
                    spec.help,
                    env=_env_name(cls, f.name, spec.env, prefix),
                    flag=spec.flag,
                    repeated=spec.repeated,
                    choices=spec.choices,
                )
            )
    return out


def _env_name(cls: type, name: str, env: str | None, prefix: str | None) -> str | None:
    if env is None or "{prefix}" not in env:
        return env
    if prefix is None:
        raise TypeError(f"{cls.__name__}.{name}: env {env!r} needs a prefix (group(..., prefix=ENV_PREFIX))")
    return env.format(prefix=prefix)


def pop_group(values: dict[str, Any], flags: type) -> dict[str, Any]:
    """Pop the values of `flags`' `setting()` fields out of `values` (from `parse_settings`), checked
    against their declared bounds and choices (ConfigError naming the rule)."""
    raw = {name: values.pop(name) for name in _specs(flags)}
    check_values(flags, raw)
    return raw


def load_groups(cls: type, values: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Build every `group(..., load=...)` field of `cls` from `values` (in field order), popping the
    groups' flags; returns `values` with those fields set. Raises ConfigError naming the rule."""
    for f in dataclasses.fields(cls):
        g = f.metadata.get(_GROUP)
        if g is not None and g.load is not None:
            values[f.name] = g.load(values, env)
    return values


C = typing.TypeVar("C")


def load_service_config(cls: type[C], argv: Sequence[str], env: Mapping[str, str], *, prog: str, description: str) -> C:
    """The whole `load_config` of a service whose config is its settings and its composed groups
    (security, span export, ...): flags and environment -> `cls`, validated. Raises ConfigError naming
    the violated rule."""
    values = parse_settings(settings_of(cls), argv, env, prog=prog, description=description)
    return cls(**load_groups(cls, values, env))


def check_values(cls: type, values: Mapping[str, Any]) -> None:
    """Raise ConfigError(name, value, rule) for the first of `values` outside the bounds or choices
    its `setting()` field of `cls` declares. None passes: it means "not given"."""
    for name, value in values.items():
        spec = _spec(cls, name)
        for item in value if spec.repeated else (value,):
            if item is None:
                continue
            if spec.choices is not None and item not in spec.choices:
                raise ConfigError(name, item, f"{name} must be one of {', '.join(spec.choices)}")
            if spec.bounds != Bounds() and not (
                isinstance(item, (int, float)) and not math.isnan(item) and spec.bounds.holds(item)
            ):
                rule = spec.bounds.rule(name)
                raise ConfigError(name, item, f"{rule} {spec.note}" if spec.note else rule)


def check_bounds(config: Any) -> None:
    """`check_values` for every `setting()` field of `config`, a dataclass instance: called first in
    its `__post_init__`."""
    check_values(type(config), {name: getattr(config, name) for name in _specs(type(config))})


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


LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


class Serve:
    """The listen/metrics/log fields every gRPC service's config has, each declared here once with
    the service's env prefix (`listen: str = Serve.listen("BANDMASTER_CAPACITY", "127.0.0.1:50051")`).
    `listen` is checked by `parse_host_port` in the service's `__post_init__`."""

    @staticmethod
    def listen(prefix: str, default: str) -> Any:
        return setting(default, "gRPC listen address host:port (port 0 = any free port)", env=f"{prefix}_LISTEN")

    @staticmethod
    def metrics_port(prefix: str, default: int) -> Any:
        return setting(
            default,
            "Prometheus /metrics HTTP port on the listen host (0 = any free port, -1 = off)",
            env=f"{prefix}_METRICS_PORT",
            ge=-1,
            le=65535,
        )

    @staticmethod
    def log_level(prefix: str) -> Any:
        return setting("INFO", "log level", env=f"{prefix}_LOG_LEVEL", choices=LOG_LEVELS)

    @staticmethod
    def shutdown_grace_seconds(prefix: str) -> Any:
        return setting(5.0, "seconds in-flight RPCs get on shutdown", env=f"{prefix}_SHUTDOWN_GRACE_SECONDS", ge=0)

    @staticmethod
    def ready_file(prefix: str) -> Any:
        return setting(
            "",
            "write the bound gRPC and metrics ports as JSON to this file once serving (used by `bandmaster up`)",
            env=f"{prefix}_READY_FILE",
        )

    @staticmethod
    def trace_sample_ratio(prefix: str) -> Any:
        return setting(
            None,
            "share of new traces to sample, 0..1, parent-based: a request "
            "that arrives with a sampled traceparent is always traced (default: OTEL_TRACES_SAMPLER and "
            "OTEL_TRACES_SAMPLER_ARG, else every trace)",
            env=f"{prefix}_TRACE_SAMPLE_RATIO",
            ge=0,
            le=1,
        )
