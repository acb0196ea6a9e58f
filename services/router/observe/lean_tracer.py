"""The router's tracer when its spans go nowhere (no exporter): spans that only carry context.

The SDK's tracer builds a whole recording span for every `router.request`, `router.pick` and
`router.upstream` (attribute tables, event lists, a sampler result, span-processor calls), about a tenth of
the router's CPU per turn, to drop it at `end()`. `LeanTracer` gives the same trace and span ids, the same
sampled flag and trace state, and the same current-span context, so the scheduler and the workers get the
`traceparent` they got before; attributes, events and status are not kept (nothing would read them).

The sampled flag follows the provider's sampler: `ParentBased` (the default, and every ratio set by
`--trace-sample-ratio`) keeps a valid parent's flag and asks its root sampler only for a new trace, as the
SDK does; any other sampler is asked for every span. A turn entry span (`router.request`) marks the trace
state as a turn's, as `TurnMarkingSampler` does, so that the scheduler and the workers can tell its spans
from background ones (services/common/observe/trace_export.py).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from services.common.observe.telemetry import TurnMarkingSampler
from services.common.observe.trace_export import mark_turn

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


class _UseSpan:
    """`with tracer.start_as_current_span(...) as span:` without a generator-based context manager."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self._token: Any = None

    def __enter__(self) -> trace.Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self._token)


def _follows_parent(sampler: Any) -> bool:
    """A ParentBased sampler with its default delegates: a valid parent's sampled flag is the decision."""
    return (
        isinstance(sampler, ParentBased)
        and sampler._remote_parent_sampled is ALWAYS_ON  # noqa: SLF001
        and sampler._local_parent_sampled is ALWAYS_ON  # noqa: SLF001
        and sampler._remote_parent_not_sampled is ALWAYS_OFF  # noqa: SLF001
        and sampler._local_parent_not_sampled is ALWAYS_OFF  # noqa: SLF001
    )


class LeanTracer(trace.Tracer):
    def __init__(self, provider: TracerProvider) -> None:
        self._sampler = provider.sampler
        inner = self._sampler.inner if isinstance(self._sampler, TurnMarkingSampler) else self._sampler
        self._parent_decides = _follows_parent(inner)
        self._ids = provider.id_generator

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Any = None,
        links: Any = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            trace_id = parent.trace_id
            if self._parent_decides:
                # ParentBased: the parent's decision, whoever made it (remote or local).
                state = mark_turn(name, parent.trace_state)
                return NonRecordingSpan(
                    SpanContext(trace_id, self._ids.generate_span_id(), False, parent.trace_flags, state)
                )
        else:
            trace_id = self._ids.generate_trace_id()
        result = self._sampler.should_sample(context, trace_id, name, kind, attributes, links)
        flags = _SAMPLED if result.decision.is_sampled() else _NOT_SAMPLED
        return NonRecordingSpan(SpanContext(trace_id, self._ids.generate_span_id(), False, flags, result.trace_state))

    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Any = None,
        links: Any = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> _UseSpan:
        return _UseSpan(self.start_span(name, context, kind, attributes, links))
