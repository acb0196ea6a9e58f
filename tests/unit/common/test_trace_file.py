"""The JSON-lines span file (BANDMASTER_TRACE_FILE): what it writes, what it refuses, and a real service writing it."""

from __future__ import annotations

import io
import json
import logging
import os
import urllib.request

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from services.common.observe.telemetry import (
    TRACE_FILE_ENV,
    ConsoleSpanLines,
    JsonLinesSpanExporter,
    setup_telemetry,
    trace_file_path,
)
from services.common.observe.trace_export import TraceExport
from services.common.settings.errors import ConfigError
from tests.support.processes import base_env, python_module, start


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_spans_are_written_one_json_object_a_line_with_events_and_parents(tmp_path):
    path = tmp_path / "spans" / "{service}-{pid}.jsonl"
    telemetry = setup_telemetry("bandmaster-test", env={TRACE_FILE_ENV: str(path)}, set_global=False)
    assert telemetry.exporting
    tracer = telemetry.tracer("t")
    with tracer.start_as_current_span("router.request") as parent:
        with tracer.start_as_current_span("router.pick", attributes={"router.candidates": 2}) as child:
            child.add_event("queue.start", {"simworker.engine_time_s": 1.5})
    telemetry.shutdown()  # flushes the batch
    (written,) = (tmp_path / "spans").iterdir()
    assert written.name == f"bandmaster-test-{os.getpid()}.jsonl"
    pick, request = _lines(written)
    assert (pick["name"], request["name"]) == ("router.pick", "router.request")
    assert pick["trace_id"] == request["trace_id"] == format(parent.get_span_context().trace_id, "032x")
    assert pick["parent_id"] == request["span_id"] and request["parent_id"] is None
    assert pick["service"] == "bandmaster-test" and pick["kind"] == "INTERNAL"
    assert pick["attributes"] == {"router.candidates": 2}
    assert pick["start_ns"] <= pick["end_ns"]
    (event,) = pick["events"]
    assert event["name"] == "queue.start" and event["attributes"] == {"simworker.engine_time_s": 1.5}
    assert pick["start_ns"] <= event["t_ns"] <= pick["end_ns"]


def test_processes_without_placeholders_append_to_one_file(tmp_path):
    path = tmp_path / "all.jsonl"
    for name in ("a", "b"):
        telemetry = setup_telemetry(name, env={TRACE_FILE_ENV: str(path)}, set_global=False)
        with telemetry.tracer("t").start_as_current_span("router.request"):
            with telemetry.tracer("t").start_as_current_span(f"{name}.span"):
                pass
        telemetry.shutdown()
    assert [s["name"] for s in _lines(path)] == ["a.span", "router.request", "b.span", "router.request"]


@pytest.mark.parametrize(
    "template, reason",
    [
        ("{service}-{nope}.jsonl", "{service} and {pid}"),
        ("{0}.jsonl", "{service} and {pid}"),
        ("/proc/definitely/not/writable.jsonl", "append to"),
    ],
)
def test_a_trace_file_that_cannot_be_written_refuses_the_start(template, reason):
    with pytest.raises(ConfigError) as err:
        setup_telemetry("bandmaster-test", env={TRACE_FILE_ENV: template}, set_global=False)
    assert err.value.field == "trace_file" and reason in str(err.value)


def test_trace_file_path_fills_service_and_pid():
    assert trace_file_path("/t/{service}.{pid}.jsonl", "bandmaster-router", 7) == "/t/bandmaster-router.7.jsonl"
    assert trace_file_path("/t/spans.jsonl", "bandmaster-router", 7) == "/t/spans.jsonl"


def test_a_real_simworker_process_writes_its_request_spans(tmp_path):
    spans = tmp_path / "spans"
    ready = tmp_path / "ready.json"
    env = base_env(**{TRACE_FILE_ENV: str(spans / "{service}-{pid}.jsonl")})
    argv = python_module("services.simworker", "--port", "0", "--speedup", "50", "--ready-file", str(ready))
    worker = start("simworker", argv, tmp_path, env=env, ready_file=ready).wait_ready()
    body = json.dumps({"text": "hello there world", "sampling_params": {"max_new_tokens": 3}}).encode()
    turn = {"traceparent": f"00-{'a' * 32}-{'b' * 16}-01", "tracestate": "bandmaster=turn"}
    # A turn's request (the router marks its trace in `tracestate`), then one from outside any turn.
    for headers in (turn, {}):
        request = urllib.request.Request(
            worker.ready["url"] + "/generate", data=body, headers={"Content-Type": "application/json", **headers}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
    assert worker.stop() == 0  # a graceful stop flushes the spans
    (written,) = spans.iterdir()
    assert written.name == f"bandmaster-simworker-{worker.pid}.jsonl"
    (span,) = _lines(written)  # only the turn's: no --trace-background
    assert span["name"] == "POST /generate" and span["kind"] == "SERVER"
    assert span["trace_id"] == "a" * 32 and span["parent_id"] == "b" * 16
    assert [e["name"] for e in span["events"]] == [
        "queue.start",
        "queue.end",
        "prefill.start",
        "prefill.end",
        "decode.start",
        "decode.end",
    ]
    attributes = span["attributes"]
    assert attributes["simworker.completion_tokens"] == 3
    assert attributes["simworker.lag_submit_s"] >= 0 and attributes["simworker.lag_end_s"] >= 0


def _turn_and_background(telemetry) -> None:
    tracer = telemetry.tracer("t")
    with tracer.start_as_current_span("router.request"):
        with tracer.start_as_current_span("router.pick"):
            pass
    with tracer.start_as_current_span("scheduler.tick"):
        with tracer.start_as_current_span("/bandmaster.scheduler.v1.Scheduler/RenewLeases"):
            pass


@pytest.mark.parametrize(
    "background, names",
    [
        (False, ["router.pick", "router.request"]),
        (True, ["router.pick", "router.request", "/bandmaster.scheduler.v1.Scheduler/RenewLeases", "scheduler.tick"]),
    ],
)
def test_the_file_keeps_the_spans_of_turns_unless_background_is_asked_for(tmp_path, background, names):
    path = tmp_path / "spans.jsonl"
    export = TraceExport(file=str(path), background=background)
    telemetry = setup_telemetry("bandmaster-test", env={}, set_global=False, export=export)
    _turn_and_background(telemetry)
    telemetry.shutdown()
    assert [s["name"] for s in _lines(path)] == names


def test_the_file_stops_at_its_cap_with_one_warning(tmp_path, caplog):
    path = tmp_path / "spans.jsonl"
    path.write_bytes(b"x" * 900)  # an earlier run's spans count against the cap
    exporter = JsonLinesSpanExporter(str(path), max_bytes=1_000)
    telemetry = setup_telemetry("bandmaster-test", env={}, set_global=False)
    telemetry.provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = telemetry.tracer("t")
    with caplog.at_level(logging.WARNING, logger="services.common.observe.telemetry"):
        for _ in range(3):
            with tracer.start_as_current_span("router.request"):
                pass
        telemetry.shutdown()
        exporter.shutdown()
    assert path.stat().st_size == 900  # nothing past the cap: one span is larger than the room left
    assert exporter.dropped == 3
    capped = [r.getMessage() for r in caplog.records if "reached its cap" in r.getMessage()]
    assert len(capped) == 1 and "0.0 MB" in capped[0] and str(path) in capped[0]


def test_console_lines_are_one_line_per_span():
    stream = io.StringIO()
    telemetry = setup_telemetry("bandmaster-test", env={}, set_global=False)
    telemetry.provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanLines(stream)))
    with telemetry.tracer("t").start_as_current_span("router.request", attributes={"router.route": "chat"}):
        pass
    telemetry.shutdown()
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("span bandmaster-test router.request ") and "router.route=chat" in line
    assert "parent=-" in line
