"""OpenTelemetry set-up: OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set, JSON lines to a file with
`--trace-file` (or BANDMASTER_TRACE_FILE), one line per span on stderr with `--trace-console` (any of
them), nothing otherwise. The file and the console keep only the spans of turns unless
`--trace-background` is given (services/common/observe/trace_export.py says how a span is known to be a turn's).

Tests pass an in-memory exporter. The file exporter (`JsonLinesSpanExporter`) is for measuring without a
collector: bench/breakdown.py joins the spans of every process of a live run per turn. Spans are one per
decision (`capacity.recompute`, `scheduler.tick`, ...), with few bounded attributes. docs/tracing.md lists them.

Sampling is parent-based everywhere, so one decision at the root of a trace (normally the router's
request span) holds for the whole agent turn. The root's rate is `--trace-sample-ratio` when a service
is given one, else the standard OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (default: every trace).
A malformed value is a ConfigError here, where the SDK alone would warn and sample everything.

Propagation: unary gRPC calls go through the maintained instrumentation (opentelemetry-instrumentation-grpc)
on both sides, installed once: the server interceptor by `ServiceHost`, the client interceptor on the
channels that carry a turn. Server-streaming RPCs and HTTP keep hand-written propagation (see
`GrpcServerTracing` and `http_server_middleware` for why).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import threading
from typing import Awaitable, Callable, Collection, Mapping, Sequence

import grpc
from aiohttp import web
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

from services.common.observe.trace_export import TRACE_FILE_ENV, TraceExport, keeps, mark_turn
from services.common.settings.errors import ConfigError

log = logging.getLogger(__name__)

FILE_QUEUE_SPANS = 1 << 16
CONSOLE_QUEUE_SPANS = 1 << 12

# gRPC services whose calls are never traced: probes and tooling, not work.
UNTRACED_GRPC_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)


def trace_sampler(sample_ratio: float | None, env: Mapping[str, str]) -> Sampler | None:
    """The sampler for one process.

    `sample_ratio` (the `--trace-sample-ratio` flag): ParentBased(TraceIdRatioBased(ratio)). Without it,
    OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG as the OpenTelemetry spec defines them, validated; a
    sampler name that is not one of the spec's built-ins returns None, so that the SDK resolves it (a
    sampler registered by an installed package)."""
    if sample_ratio is not None:
        if not 0.0 <= sample_ratio <= 1.0:
            raise ConfigError("trace_sample_ratio", sample_ratio, "0 <= trace_sample_ratio <= 1")
        return ParentBased(TraceIdRatioBased(sample_ratio))
    name = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    fixed = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
    }
    if name in fixed:
        return fixed[name]
    if name not in ("traceidratio", "parentbased_traceidratio"):
        return None
    raw = env.get("OTEL_TRACES_SAMPLER_ARG")
    if raw is None or raw.strip() == "":
        ratio = 1.0  # the spec's default for a ratio sampler without an argument
    else:
        try:
            ratio = float(raw)
        except ValueError:
            raise ConfigError("OTEL_TRACES_SAMPLER_ARG", raw, "a number in [0, 1]") from None
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError("OTEL_TRACES_SAMPLER_ARG", raw, "a number in [0, 1]")
    root = TraceIdRatioBased(ratio)
    return root if name == "traceidratio" else ParentBased(root)


def trace_file_path(template: str, service_name: str, pid: int) -> str:
    """The span file of one process: `template` with `{service}` and `{pid}` filled in. Without them
    every process appends to the one file (each batch is one O_APPEND write, so lines never interleave)."""
    try:
        return template.format(service=service_name, pid=pid)
    except (KeyError, IndexError, ValueError):
        raise ConfigError("trace_file", template, "a path whose only {} fields are {service} and {pid}") from None


def span_record(span: ReadableSpan) -> dict:
    """One finished span as the JSON object `JsonLinesSpanExporter` writes (times in Unix ns)."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "trace_id": format(ctx.trace_id, "032x") if ctx is not None else "",
        "span_id": format(ctx.span_id, "016x") if ctx is not None else "",
        "parent_id": format(parent.span_id, "016x") if parent is not None else None,
        "name": span.name,
        "service": (span.resource.attributes.get("service.name") if span.resource is not None else None) or "",
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "t_ns": e.timestamp, "attributes": dict(e.attributes or {})} for e in span.events],
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends finished spans to a file, one JSON object a line (`span_record`); behind a
    BatchSpanProcessor, so the writes happen on its thread, never on the event loop. Attribute values
    are strings, numbers, booleans or lists of them (OpenTelemetry's rule), so every record is plain JSON.

    Bounded: once the file holds `max_bytes` (counting what an earlier run left in it), later batches
    are dropped, and one WARNING names the file and the cap; the number dropped is logged at shutdown."""

    def __init__(self, path: str, max_bytes: int | None = None) -> None:
        directory = os.path.dirname(path)
        try:
            if directory:
                os.makedirs(directory, exist_ok=True)
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise ConfigError("trace_file", path, f"a file this process can append to ({exc.strerror})") from None
        self.path = path
        self.max_bytes = max_bytes
        self.dropped = 0
        self._lock = threading.Lock()

    def export(self, spans) -> SpanExportResult:
        data = "".join(json.dumps(span_record(s), separators=(",", ":")) + "\n" for s in spans).encode()
        with self._lock:
            if self._fd is None:
                return SpanExportResult.FAILURE
            if self.max_bytes is not None and self._size + len(data) > self.max_bytes:
                if self.dropped == 0:
                    log.warning(
                        "telemetry: span file %s reached its cap of %.1f MB (--trace-file-max-mb); "
                        "later spans are dropped",
                        self.path,
                        self.max_bytes / 1e6,
                    )
                self.dropped += len(spans)
                return SpanExportResult.FAILURE
            try:
                os.write(self._fd, data)
            except OSError:
                log.warning("telemetry: could not append %d spans to %s", len(spans), self.path)
                return SpanExportResult.FAILURE
            self._size += len(data)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                if self.dropped:
                    log.warning("telemetry: %d spans were not written to %s (its cap)", self.dropped, self.path)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every export is written through


def console_line(record: dict) -> str:
    """One span as one short line: service, name, duration, ids and attributes (`--trace-console`)."""
    duration_ms = (record["end_ns"] - record["start_ns"]) / 1e6 if record["end_ns"] else 0.0
    attributes = " ".join(f"{k}={v}" for k, v in record["attributes"].items())
    return (
        f"span {record['service']} {record['name']} {duration_ms:.1f}ms trace={record['trace_id']} "
        f"span={record['span_id']} parent={record['parent_id'] or '-'}" + (f" {attributes}" if attributes else "")
    )


class ConsoleSpanLines(SpanExporter):
    """Writes each finished span to a stream (stderr) as `console_line`, from the batch processor's thread."""

    def __init__(self, stream=None) -> None:
        self._stream = stream

    def export(self, spans) -> SpanExportResult:
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            stream.write("".join(console_line(span_record(s)) + "\n" for s in spans))
            stream.flush()
        except (OSError, ValueError):
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


class TurnMarkingSampler(Sampler):
    """`inner`'s decision, with the trace state of a turn entry span marked (`trace_export.mark_turn`), so
    every span below it, in this process and (by `tracestate`) in the others, is known as a turn's."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    def should_sample(
        self,
        parent_context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        result = self.inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)
        marked = mark_turn(name, result.trace_state)
        if marked is result.trace_state:
            return result
        return SamplingResult(result.decision, result.attributes, marked)

    def get_description(self) -> str:
        return self.inner.get_description()


class TurnSpanFilter(SpanProcessor):
    """Hands `processor` only the spans `trace_export.keeps` (a turn's, or all with `background`). The
    test is one dictionary look-up in the span's trace state, made when the span ends."""

    def __init__(self, processor: SpanProcessor, background: bool) -> None:
        self.processor = processor
        self.background = background

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        return None  # the batch processor does nothing at start either

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.get_span_context()
        if ctx is not None and keeps(ctx.trace_state, self.background):
            self.processor.on_end(span)

    def shutdown(self) -> None:
        self.processor.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.processor.force_flush(timeout_millis)


class Telemetry:
    """Owns a tracer provider for one service process (or one in-process test server)."""

    def __init__(self, service_name: str, provider: TracerProvider, exporting: bool) -> None:
        self.service_name = service_name
        self.provider = provider
        self.exporting = exporting

    def tracer(self, name: str) -> trace.Tracer:
        return self.provider.get_tracer(name)

    def grpc_server_interceptor(self) -> grpc.aio.ServerInterceptor:
        return grpc_server_tracing(self.provider)

    def grpc_client_interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        return grpc_client_tracing(self.provider)

    def shutdown(self) -> None:
        """Flush and stop exporting. Safe to call twice."""
        try:
            self.provider.force_flush(timeout_millis=5_000)
        finally:
            self.provider.shutdown()


def setup_telemetry(
    service_name: str,
    *,
    env: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
    set_global: bool = True,
    sample_ratio: float | None = None,
    export: TraceExport | None = None,
) -> Telemetry:
    """Build the provider. `exporter` (tests) wins over the environment and `export`; with none of them,
    spans are created (so context still propagates) but never exported. `export` (the `--trace-*` flags;
    default: BANDMASTER_TRACE_FILE from `env`) adds the JSON-lines file (`trace_file_path`) and the
    console lines, beside OTLP if that is set too. Raises ConfigError for a sampling setting out of range
    or a trace file that cannot be opened."""
    env = os.environ if env is None else env
    if export is None:
        export = TraceExport(file=env.get(TRACE_FILE_ENV, ""))
    template = export.file if exporter is None else ""
    # Opened first: a path that cannot be written refuses the start before anything runs.
    file_exporter = (
        JsonLinesSpanExporter(trace_file_path(template, service_name, os.getpid()), export.file_max_bytes)
        if template
        else None
    )
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}), sampler=trace_sampler(sample_ratio, env)
    )
    # After the provider resolved its sampler (a name left to the SDK included); before any tracer exists.
    provider.sampler = TurnMarkingSampler(provider.sampler)
    exporting = False
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        exporting = True
    elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        exporting = True
        log.info(
            "telemetry: exporting spans by OTLP for service %s (sampler %s)",
            service_name,
            provider.sampler.get_description(),
        )
    which = "every span" if export.background else "the spans of turns (--trace-background: all)"
    if file_exporter is not None:
        # A measurement wants every span: a deep queue (the default drops past 2,048), written each second.
        batch = BatchSpanProcessor(file_exporter, max_queue_size=FILE_QUEUE_SPANS, schedule_delay_millis=1_000)
        provider.add_span_processor(TurnSpanFilter(batch, export.background))
        exporting = True
        log.info("telemetry: writing %s of service %s to %s", which, service_name, file_exporter.path)
    if export.console and exporter is None:
        batch = BatchSpanProcessor(ConsoleSpanLines(), max_queue_size=CONSOLE_QUEUE_SPANS, schedule_delay_millis=500)
        provider.add_span_processor(TurnSpanFilter(batch, export.background))
        exporting = True
        log.info("telemetry: printing %s of service %s to stderr", which, service_name)
    if set_global:
        try:
            trace.set_tracer_provider(provider)
        except Exception:  # the global provider can only be set once per process
            log.debug("telemetry: global tracer provider already set")
    return Telemetry(service_name, provider, exporting)


# --------------------------------------------------------------------------------------------
# gRPC
# --------------------------------------------------------------------------------------------


def _traced_method(method: str) -> bool:
    service = method.lstrip("/").split("/", 1)[0]
    return service not in UNTRACED_GRPC_SERVICES


class GrpcServerTracing(grpc.aio.ServerInterceptor):
    """A SERVER span for every unary-response call, by the maintained grpc aio instrumentation.

    Response-streaming handlers pass through untouched, because the instrumentation's stream wrapper
    does not fit them: it keeps its span current across each `yield`, and grpc closes a stream that
    ends early from another task, where the detach fails ('Failed to detach context' at ERROR); and it
    iterates the handler's return value, so a handler that answers with `context.write` (AdmitStream)
    would break. Those handlers (`Scheduler/AdmitStream`, `Router/Generate`) start their own SERVER
    span from the metadata (`grpc_parent`), current only around awaits."""

    def __init__(self, provider: trace.TracerProvider | None) -> None:
        from opentelemetry.instrumentation.grpc import aio_server_interceptor

        self._instrumentation = aio_server_interceptor(
            tracer_provider=provider, filter_=lambda details: _traced_method(details.method)
        )

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.response_streaming:
            return handler
        if not inspect.iscoroutinefunction(handler.unary_unary or handler.stream_unary):
            return handler  # a synchronous handler (tests' generic ones): the instrumentation awaits it

        async def resolved(_details):
            return handler

        return await self._instrumentation.intercept_service(resolved, handler_call_details)


def grpc_server_tracing(provider: trace.TracerProvider | None = None) -> grpc.aio.ServerInterceptor:
    return GrpcServerTracing(provider)


def grpc_client_tracing(provider: trace.TracerProvider | None = None) -> list[grpc.aio.ClientInterceptor]:
    """CLIENT spans and W3C context in the metadata of unary-unary calls, by the instrumentation.

    Only its unary-unary interceptor is used: its streaming ones end their span when the response
    iterator is exhausted, and the router reads AdmitStream only up to the decision and then cancels it,
    so that span would end whenever the garbage collector got to it. Streaming calls on a turn's path
    inject by hand (`inject_metadata`)."""
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return [
        i
        for i in aio_client_interceptors(
            tracer_provider=provider, filter_=lambda details: _traced_method(_method_name(details))
        )
        if isinstance(i, grpc.aio.UnaryUnaryClientInterceptor)
    ]


def _method_name(details) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else method


def w3c_fields() -> tuple[str, str]:
    """The current span's W3C trace context as (`traceparent`, `tracestate`), ("", "") without a valid one.

    What the W3C propagator writes for it, formatted directly: for the fields of a message that carries the
    context in the W3C form whatever the configured propagators (an AdmitMux operation; one per turn)."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return "", ""
    traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    return traceparent, ctx.trace_state.to_header() if ctx.trace_state else ""


def inject_metadata(ctx: otel_context.Context | None = None) -> tuple[tuple[str, str], ...]:
    """W3C trace context (`traceparent`, `tracestate`) of `ctx` (default: the current one) as gRPC metadata."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return tuple(carrier.items())


def grpc_parent(context: grpc.aio.ServicerContext) -> tuple[otel_context.Context | None, trace.SpanKind]:
    """Parent and kind for a handler's decision span.

    Under `GrpcServerTracing` (unary calls) the instrumentation's SERVER span is current: the decision
    span is its INTERNAL child (parent None = the current context). A streaming handler has no span
    current: the caller's context comes from the metadata and the decision span is the SERVER span."""
    if trace.get_current_span().get_span_context().is_valid:
        return None, trace.SpanKind.INTERNAL
    carrier = {key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}
    return propagate.extract(carrier), trace.SpanKind.SERVER


# --------------------------------------------------------------------------------------------
# HTTP (aiohttp server)
# --------------------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def http_server_middleware(tracer: trace.Tracer, paths: Collection[str]):
    """An aiohttp middleware: a SERVER span (`POST /generate`), child of the request's `traceparent`,
    for each request to one of `paths` (the work routes; probes and /metrics stay untraced).

    Hand-written rather than opentelemetry-instrumentation-aiohttp-server: its releases pin an
    opentelemetry-semantic-conventions version other than the one the installed opentelemetry-sdk pins,
    so the two cannot be installed together (docs/tracing.md)."""
    traced = frozenset(paths)

    @web.middleware
    async def trace_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in traced:
            return await handler(request)
        with tracer.start_as_current_span(
            f"{request.method} {request.path}", context=propagate.extract(request.headers), kind=trace.SpanKind.SERVER
        ) as span:
            span.set_attribute("http.request.method", request.method)
            span.set_attribute("url.path", request.path)
            response = await handler(request)
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            return response

    return trace_requests
