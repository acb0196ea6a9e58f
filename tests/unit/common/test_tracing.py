"""Sampling settings, the gRPC tracing interceptors and the simworker's engine-phase events."""

from __future__ import annotations

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from services.capacity.config import load_config as capacity_config
from services.common.observe.telemetry import setup_telemetry, trace_sampler
from services.common.serve.grpc_server import ServiceHost
from services.common.settings.errors import ConfigError
from services.simworker.config import load_config as simworker_config
from services.simworker.server import start_simworker

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "ratio, env, description",
    [
        (None, {}, "ParentBased{root:AlwaysOnSampler"),
        (0.25, {}, "ParentBased{root:TraceIdRatioBased{0.25}"),
        (0.0, {"OTEL_TRACES_SAMPLER": "always_on"}, "ParentBased{root:TraceIdRatioBased{0.0}"),  # the flag wins
        (
            None,
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
            "ParentBased{root:TraceIdRatioBased{0.1}",
        ),
        (None, {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}, "TraceIdRatioBased{0.5}"),
        (None, {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}, "ParentBased{root:TraceIdRatioBased{1.0}"),
        (None, {"OTEL_TRACES_SAMPLER": "ALWAYS_OFF"}, "AlwaysOffSampler"),
        (None, {"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, "ParentBased{root:AlwaysOffSampler"),
    ],
)
def test_sampler_from_flag_or_standard_environment(ratio, env, description):
    assert trace_sampler(ratio, env).get_description().startswith(description)


def test_a_sampler_the_spec_does_not_define_is_left_to_the_sdk():
    assert trace_sampler(None, {"OTEL_TRACES_SAMPLER": "xray"}) is None


@pytest.mark.parametrize(
    "ratio, env, field",
    [
        (1.5, {}, "trace_sample_ratio"),
        (-0.1, {}, "trace_sample_ratio"),
        (None, {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, "OTEL_TRACES_SAMPLER_ARG"),
        (
            None,
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
            "OTEL_TRACES_SAMPLER_ARG",
        ),
    ],
)
def test_a_sampling_value_out_of_range_is_a_config_error(ratio, env, field):
    with pytest.raises(ConfigError) as info:
        setup_telemetry("svc", env=env, exporter=InMemorySpanExporter(), set_global=False, sample_ratio=ratio)
    assert info.value.field == field


@pytest.mark.parametrize(
    "load, argv",
    [
        (capacity_config, []),
        (simworker_config, []),
    ],
)
def test_every_service_takes_the_flag_and_refuses_a_ratio_out_of_range(load, argv):
    assert load([*argv, "--trace-sample-ratio", "0.5"], {}).trace_sample_ratio == 0.5
    assert load(argv, {}).trace_sample_ratio is None
    with pytest.raises(ConfigError) as info:
        load([*argv, "--trace-sample-ratio", "1.01"], {})
    assert info.value.field == "trace_sample_ratio"


def test_the_ratio_comes_from_each_services_environment_too():
    assert capacity_config([], {"BANDMASTER_CAPACITY_TRACE_SAMPLE_RATIO": "0.2"}).trace_sample_ratio == 0.2


async def test_unary_calls_get_a_server_span_and_probes_do_not():
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry("svc", exporter=exporter, set_global=False)
    host = ServiceHost("svc", listen="127.0.0.1:0", metrics_port=-1, telemetry=telemetry, shutdown_grace_seconds=0.1)

    async def ping(request: bytes, context) -> bytes:
        return request

    async def stream(request: bytes, context):
        yield request

    host.server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "test.v1.T",
                {
                    "Ping": grpc.unary_unary_rpc_method_handler(
                        ping, request_deserializer=bytes, response_serializer=bytes
                    ),
                    "Watch": grpc.unary_stream_rpc_method_handler(
                        stream, request_deserializer=bytes, response_serializer=bytes
                    ),
                },
            )
        ]
    )
    await host.start()
    try:
        async with grpc.aio.insecure_channel(
            host.address, interceptors=telemetry.grpc_client_interceptors()
        ) as channel:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert await channel.unary_unary("/test.v1.T/Ping")(b"x", timeout=5) == b"x"
            assert [r async for r in channel.unary_stream("/test.v1.T/Watch")(b"y", timeout=5)] == [b"y"]
    finally:
        await host.stop()
    spans = exporter.get_finished_spans()
    names = sorted(((s.name, s.kind) for s in spans), key=lambda nk: (nk[0], nk[1].value))
    # One CLIENT and one SERVER span for the unary call, in one trace; nothing for the health probe or the stream.
    assert names == [("/test.v1.T/Ping", SpanKind.SERVER), ("/test.v1.T/Ping", SpanKind.CLIENT)]
    client, server = sorted(spans, key=lambda s: s.kind is SpanKind.SERVER)
    assert server.parent.span_id == client.context.span_id


async def test_simworker_request_span_has_the_engine_phases_in_order():
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry("bandmaster-simworker", exporter=exporter, set_global=False)
    worker = await start_simworker(simworker_config(["--port", "0", "--speedup", "100"], {}), telemetry=telemetry)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                worker.url + "/generate",
                headers={"traceparent": TRACEPARENT},
                json={"text": "hello there world", "sampling_params": {"max_new_tokens": 3}},
            ) as r:
                assert r.status == 200
            async with session.get(worker.url + "/health") as r:
                assert r.status == 200
    finally:
        await worker.stop()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["POST /generate"]  # probes are not traced
    span = spans[0]
    assert span.kind is SpanKind.SERVER and format(span.context.trace_id, "032x") == TRACEPARENT[3:35]
    assert span.attributes["http.response.status_code"] == 200
    events = [(e.name, e.timestamp, e.attributes["simworker.engine_time_s"]) for e in span.events]
    assert [name for name, _, _ in events] == [
        "queue.start",
        "queue.end",
        "prefill.start",
        "prefill.end",
        "decode.start",
        "decode.end",
    ]
    assert [t for _, t, _ in events] == sorted(t for _, t, _ in events)
    engine_times = [v for _, _, v in events]
    assert engine_times == sorted(engine_times)
    attributes = span.attributes
    assert attributes["simworker.completion_tokens"] == 3 and attributes["simworker.finish_reason"] == "length"
    # Phase lengths in engine seconds: each the difference of its two events.
    assert attributes["simworker.queue_s"] == pytest.approx(engine_times[1] - engine_times[0])
    assert attributes["simworker.prefill_s"] == pytest.approx(engine_times[3] - engine_times[2])
    assert attributes["simworker.decode_s"] == pytest.approx(engine_times[5] - engine_times[4])


@pytest.mark.parametrize("state", [None, "bandmaster=turn", "a=1,b=2"])
@pytest.mark.parametrize("sampled", [True, False])
def test_w3c_fields_are_what_the_w3c_propagator_writes(state, sampled):
    """An AdmitMux operation's trace fields, formatted directly, equal the W3C propagator's output (and
    nothing without a valid current span)."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from services.common.observe.telemetry import w3c_fields

    assert w3c_fields() == ("", "")
    trace_state = TraceState([tuple(kv.split("=")) for kv in state.split(",")]) if state else None
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    span = NonRecordingSpan(SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD, False, flags, trace_state))
    with trace.use_span(span):
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        assert w3c_fields() == (carrier["traceparent"], carrier.get("tracestate", ""))
