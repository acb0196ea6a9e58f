"""Where a service's spans go without a collector, and which of them: the `--trace-*` flags of every service.

`--trace-file PATH` writes finished spans as JSON lines (services/common/observe/telemetry.py `JsonLinesSpanExporter`),
`--trace-console` prints one short line per span to stderr. Both are for a user with no OTLP collector;
`bandmaster trace` (services/cli/trace.py) reads the files back as the tree of one turn.

Turn spans and background spans. A turn's trace starts at a turn entry span (`TURN_ENTRY_SPANS`: the
router's `router.request`, its gRPC Release, the benchmark client's `client.turn`). The sampler marks the
trace there with `bandmaster=turn` in its W3C trace state (`mark_turn`), which every child span inherits
and which travels to the scheduler and the workers in `tracestate`, so each process can tell, span by
span, whether it belongs to a turn without knowing the rest of the trace. Background work (scheduler
ticks, capacity recomputes, planner ticks, lease renewals, leadership, tools' RPCs) never passes through
a turn entry and stays unmarked. Those outnumber turn spans about four to one, so the file and console
exporters keep only turn spans unless `--trace-background` is given (`keeps`). OTLP export is not
filtered: a collector has its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from opentelemetry.trace import TraceState

from services.common.settings.config import group, pop_group, require, setting

TRACE_FILE_ENV = "BANDMASTER_TRACE_FILE"
"""Every process (and clients/player.py) honours it when no `--trace-file` is given."""
DEFAULT_TRACE_FILE_MAX_MB = 256.0

TURN_STATE_KEY = "bandmaster"
TURN_STATE_VALUE = "turn"
TURN_ENTRY_SPANS = frozenset(
    {"router.request", "router.release", "/bandmaster.router.v1.Router/Release", "client.turn"}
)
"""The spans a turn's trace enters by: from each of them down, the trace is a turn's."""


@dataclass(frozen=True)
class TraceExport:
    """One process's span outputs besides OTLP. The default: none."""

    file: str = ""
    """JSON-lines span file; `{service}` and `{pid}` are filled in. "" = none."""
    file_max_bytes: int = int(DEFAULT_TRACE_FILE_MAX_MB * 1_000_000)
    """The file stops growing at this size: later spans are dropped, and one WARNING says so."""
    console: bool = False
    """One line per span on stderr."""
    background: bool = False
    """Also export background spans (ticks, recomputes, renewals); off = only the spans of turns."""

    def __post_init__(self) -> None:
        require(self.file_max_bytes > 0, "trace_file_max_mb", self.file_max_bytes / 1e6, "trace_file_max_mb > 0")

    @property
    def any(self) -> bool:
        return bool(self.file) or self.console


@dataclass(frozen=True)
class TraceExportFlags:
    """The `--trace-*` flags, the same on every service (environment `<prefix>_TRACE_FILE`, ...)."""

    trace_file: str = setting(
        "",
        "append the spans this process records to this file, one JSON object a line ({service} and {pid} "
        f"are filled in; `bandmaster trace` reads it) (default: env {TRACE_FILE_ENV}, else none)",
        env="{prefix}_TRACE_FILE",
    )
    trace_file_max_mb: float = setting(
        DEFAULT_TRACE_FILE_MAX_MB,
        "size cap of --trace-file in MB: past it later spans are dropped and one warning is logged",
        env="{prefix}_TRACE_FILE_MAX_MB",
        gt=0,
    )
    trace_console: bool = setting(False, "print one line per span to stderr", env="{prefix}_TRACE_CONSOLE")
    trace_background: bool = setting(
        False,
        "with --trace-file or --trace-console, also export background spans (control ticks, recomputes, "
        "lease renewals, probes' RPCs); by default only the spans of turns",
        env="{prefix}_TRACE_BACKGROUND",
    )


def trace_export_group(prefix: str) -> Any:
    """A service's `tracing` field: `TraceExportFlags` listed in its place (environment `<prefix>_TRACE_*`),
    built by `load_trace_export`."""
    return group(TraceExport(), flags=TraceExportFlags, prefix=prefix, load=load_trace_export)


def load_trace_export(values: dict[str, Any], env: Mapping[str, str]) -> TraceExport:
    """Pop the `--trace-*` group out of `values`; ConfigError naming the rule."""
    raw = pop_group(values, TraceExportFlags)
    return TraceExport(
        file=raw["trace_file"] or env.get(TRACE_FILE_ENV, ""),
        file_max_bytes=int(raw["trace_file_max_mb"] * 1_000_000),
        console=raw["trace_console"],
        background=raw["trace_background"],
    )


def mark_turn(name: str, state: TraceState | None) -> TraceState | None:
    """The trace state a new span named `name` carries: its parent's, marked as a turn's when `name` is a
    turn entry. Unchanged (the same object) otherwise."""
    if name not in TURN_ENTRY_SPANS:
        return state
    state = state if state is not None else TraceState()
    if state.get(TURN_STATE_KEY) == TURN_STATE_VALUE:
        return state
    if TURN_STATE_KEY in state:
        return state.update(TURN_STATE_KEY, TURN_STATE_VALUE)
    return state.add(TURN_STATE_KEY, TURN_STATE_VALUE)


def in_turn(state: TraceState | None) -> bool:
    """Whether a span with this trace state belongs to a turn's trace."""
    return state is not None and state.get(TURN_STATE_KEY) == TURN_STATE_VALUE


def keeps(state: TraceState | None, background: bool) -> bool:
    """The file and console exporters' filter: every span with `background`, else only a turn's."""
    return background or in_turn(state)
