"""Which spans the span file and the console keep: a turn's (marked in the trace state at its entry span, and
carried to the other processes in `tracestate`) by default, every span with --trace-background."""

from __future__ import annotations

import pytest
from opentelemetry import propagate
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import TraceState

from services.common.observe.telemetry import TurnSpanFilter, setup_telemetry
from services.common.observe.trace_export import (
    TURN_ENTRY_SPANS,
    TraceExport,
    TraceExportFlags,
    in_turn,
    keeps,
    load_trace_export,
    mark_turn,
)
from services.common.settings.config import parse_settings, settings_of
from services.common.settings.errors import ConfigError


@pytest.mark.parametrize("name", sorted(TURN_ENTRY_SPANS))
def test_a_turn_entry_span_marks_its_trace(name):
    assert in_turn(mark_turn(name, None))
    assert in_turn(mark_turn(name, TraceState([("vendor", "x")])))
    assert mark_turn(name, TraceState([("vendor", "x")])).get("vendor") == "x"  # others' entries are kept
    assert in_turn(mark_turn(name, TraceState([("bandmaster", "other")])))


@pytest.mark.parametrize("name", ["scheduler.tick", "capacity.recompute", "planner.tick", "router.pick"])
def test_other_spans_keep_their_parents_state(name):
    state = TraceState([("vendor", "x")])
    assert mark_turn(name, state) is state
    assert mark_turn(name, None) is None


@pytest.mark.parametrize(
    "state, background, kept",
    [
        (None, False, False),
        (TraceState(), False, False),
        (TraceState([("bandmaster", "turn")]), False, True),
        (TraceState([("bandmaster", "tick")]), False, False),
        (None, True, True),
        (TraceState([("bandmaster", "turn")]), True, True),
    ],
)
def test_keeps(state, background, kept):
    assert keeps(state, background) is kept


def _recorded(background: bool):
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry("svc", env={}, set_global=False)
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    telemetry.provider.add_span_processor(TurnSpanFilter(SimpleSpanProcessor(exporter), background))
    return telemetry, exporter


def test_the_filter_follows_the_mark_into_another_process():
    router, router_spans = _recorded(background=False)
    scheduler, scheduler_spans = _recorded(background=False)
    with router.tracer("r").start_as_current_span("router.request"):
        with router.tracer("r").start_as_current_span("router.admit"):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
    assert carrier["tracestate"] == "bandmaster=turn"
    with scheduler.tracer("s").start_as_current_span("scheduler.admit", context=propagate.extract(carrier)):
        pass
    with scheduler.tracer("s").start_as_current_span("scheduler.tick"):
        with scheduler.tracer("s").start_as_current_span("scheduler.pause"):
            pass
    assert [s.name for s in router_spans.get_finished_spans()] == ["router.admit", "router.request"]
    assert [s.name for s in scheduler_spans.get_finished_spans()] == ["scheduler.admit"]


def test_background_keeps_everything():
    scheduler, spans = _recorded(background=True)
    with scheduler.tracer("s").start_as_current_span("scheduler.tick"):
        pass
    assert [s.name for s in spans.get_finished_spans()] == ["scheduler.tick"]


def test_a_sampled_out_turn_is_marked_but_not_recorded():
    telemetry = setup_telemetry("svc", env={}, set_global=False, sample_ratio=0.0)
    with telemetry.tracer("r").start_as_current_span("router.request") as span:
        assert not span.is_recording()
        assert in_turn(span.get_span_context().trace_state)


def test_flags_and_environment_map_onto_trace_export():
    settings = settings_of(TraceExportFlags, prefix="BANDMASTER_X")

    def load(argv, env):
        values = parse_settings(settings, argv, env, prog="x", description="x")
        return load_trace_export(values, env)

    assert load([], {}) == TraceExport()
    assert load([], {"BANDMASTER_TRACE_FILE": "/t/{service}.jsonl"}).file == "/t/{service}.jsonl"
    assert load(["--trace-file", "/a.jsonl"], {"BANDMASTER_TRACE_FILE": "/b.jsonl"}).file == "/a.jsonl"
    assert load([], {"BANDMASTER_X_TRACE_FILE": "/c.jsonl"}).file == "/c.jsonl"
    loaded = load(["--trace-console", "--trace-background", "--trace-file-max-mb", "2.5"], {})
    assert (loaded.console, loaded.background, loaded.file_max_bytes) == (True, True, 2_500_000)
    with pytest.raises(ConfigError) as err:
        load(["--trace-file-max-mb", "0"], {})
    assert err.value.field == "trace_file_max_mb"


@pytest.mark.parametrize("module", ["capacity", "scheduler", "router", "planner", "simworker"])
def test_every_service_takes_the_trace_flags(module):
    import importlib

    load_config = importlib.import_module(f"services.{module}.config").load_config
    config = load_config(["--trace-file", "/tmp/x-{service}.jsonl", "--trace-background"], {})
    assert config.tracing == TraceExport(file="/tmp/x-{service}.jsonl", background=True)
