"""LeanTracer (the router's tracer without an exporter) carries the same context as the SDK's: the parent's
trace id and sampled flag, a new span id, the current span inside `start_as_current_span`, and the
provider's root sampler for a new trace."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, TraceIdRatioBased

from services.router.observe.lean_tracer import LeanTracer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def incoming(flags: str) -> otel_context.Context:
    return propagate.extract({"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-{flags}"})


def traceparent(span: trace.Span) -> list[str]:
    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(span))
    return headers["traceparent"].split("-")


def test_children_of_a_remote_parent_keep_its_trace_and_sampled_flag():
    tracer = LeanTracer(TracerProvider())
    for flags in ("01", "00"):
        with tracer.start_as_current_span("router.request", context=incoming(flags)) as span:
            assert not span.is_recording()
            assert trace.get_current_span() is span
            child = tracer.start_span("router.upstream")
            _, trace_id, span_id, child_flags = traceparent(child)
            assert (trace_id, child_flags) == (TRACE_ID, flags)
            assert span_id != "00f067aa0ba902b7" and span_id != traceparent(span)[2]
            child.set_attribute("ignored", 1)
            child.end()
        assert trace.get_current_span() is not span


def test_a_new_trace_asks_the_root_sampler():
    on = LeanTracer(TracerProvider(sampler=ParentBased(ALWAYS_ON))).start_span("router.request")
    off = LeanTracer(TracerProvider(sampler=ParentBased(ALWAYS_OFF))).start_span("router.request")
    assert traceparent(on)[3] == "01" and traceparent(off)[3] == "00"
    assert traceparent(on)[1] != traceparent(off)[1] != "0" * 32
    # a sampler that is not parent-based decides every span, as in the SDK
    never = LeanTracer(TracerProvider(sampler=ALWAYS_OFF))
    assert traceparent(never.start_span("x", context=incoming("01")))[3] == "00"
    half = LeanTracer(TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.5))))
    assert traceparent(half.start_span("x", context=incoming("01")))[3] == "01"
