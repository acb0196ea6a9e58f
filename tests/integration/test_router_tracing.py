"""W3C trace context: client -> router -> scheduler (gRPC metadata) and -> worker; spans exported in memory
(in-process router) and by OTLP to a real TraceService receiver (router process)."""

from __future__ import annotations

import grpc
import pytest
from openai import AsyncOpenAI
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from clients import session_headers
from services.common.observe.telemetry import setup_telemetry
from services.router.config import KvOverrides, RouterConfig
from services.router.server import start_router
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL, RecordingScheduler

pytestmark = pytest.mark.integration
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


async def test_trace_continues_through_router_to_scheduler_in_memory(tmp_path):
    st = stack.Stack(tmp_path)
    sched = RecordingScheduler()
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry("bandmaster-router", exporter=exporter, set_global=False)
    router = None
    try:
        address = await sched.start()
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        router = await start_router(
            RouterConfig(
                capacity_addr=cap.ready["grpc"],
                scheduler_addr=address,
                kv=KvOverrides(use_kv_events=False),
                listen="127.0.0.1:0",
                http_port=0,
                metrics_port=-1,
            ),
            telemetry=telemetry,
        )
        await assert_eventually(lambda: router.fleet.workers)
        client = AsyncOpenAI(
            base_url=router.base_url + "/v1",
            api_key="none",
            max_retries=0,
            default_headers={**session_headers("traced"), "traceparent": TRACEPARENT},
        )
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        spans = await assert_eventually(
            lambda: (
                exporter.get_finished_spans()
                if any(s.name == "router.request" for s in exporter.get_finished_spans())
                else None
            )
        )
        by_name = {s.name: s for s in spans}
        assert {"router.request", "router.pick"} <= by_name.keys()
        # The start-up GetRouterConfig call is a trace of its own; every span of the request is in its trace.
        assert all(
            format(s.context.trace_id, "032x") == TRACE_ID for s in spans if not s.name.endswith("/GetRouterConfig")
        ), [s.name for s in spans]
        assert by_name["router.pick"].parent.span_id == by_name["router.request"].context.span_id
        assert by_name["router.pick"].attributes["router.reason"]
        admit = next(c for c in sched.calls if c.method == "Admit")
        assert admit.metadata["traceparent"].split("-")[1] == TRACE_ID
        complete = await assert_eventually(lambda: [c for c in sched.calls if c.method == "Complete"])
        assert complete[0].metadata["traceparent"].split("-")[1] == TRACE_ID
    finally:
        if router is not None:
            await router.stop()
        await st.close()
        await sched.stop()


async def test_grpc_generate_turn_is_one_trace_up_to_complete(tmp_path):
    """Router/Generate is a stream: its turn is closed after the request span's last await, and Complete,
    sent from a task of its own, still carries the turn's trace; so does the worker request."""
    from bandmaster.router.v1 import router_pb2 as rpb
    from bandmaster.router.v1 import router_pb2_grpc as rpb_grpc

    st = stack.Stack(tmp_path)
    sched = RecordingScheduler()
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry("bandmaster-router", exporter=exporter, set_global=False)
    router = None
    try:
        address = await sched.start()
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        router = await start_router(
            RouterConfig(
                capacity_addr=cap.ready["grpc"],
                scheduler_addr=address,
                kv=KvOverrides(use_kv_events=False),
                listen="127.0.0.1:0",
                http_port=0,
                metrics_port=-1,
            ),
            telemetry=telemetry,
        )
        await assert_eventually(lambda: router.fleet.workers)
        async with grpc.aio.insecure_channel(router.grpc_address) as channel:
            chunks = [
                c
                async for c in rpb_grpc.RouterStub(channel).Generate(
                    rpb.GenerateRequest(
                        session_id="traced-grpc", model=MODEL, prompt="hello", sampling=rpb.SamplingParams(max_tokens=2)
                    ),
                    metadata=(("traceparent", TRACEPARENT),),
                    timeout=30,
                )
            ]
        assert chunks[-1].finish_reason
        complete = await assert_eventually(lambda: [c for c in sched.calls if c.method == "Complete"])
        assert complete[0].metadata["traceparent"].split("-")[1] == TRACE_ID
        admit = next(c for c in sched.calls if c.method == "Admit")
        assert admit.metadata["traceparent"].split("-")[1] == TRACE_ID

        def spans():
            finished = {s.name: s for s in exporter.get_finished_spans()}
            return finished if {"router.request", "router.upstream", "router.admit"} <= finished.keys() else None

        by_name = await assert_eventually(spans)
        request = by_name["router.request"]
        assert format(request.context.trace_id, "032x") == TRACE_ID and request.kind is SpanKind.SERVER
        for name in ("router.upstream", "router.admit", "router.pick"):
            assert by_name[name].parent.span_id == request.context.span_id, name
        assert by_name["router.upstream"].attributes["router.outcome"] == "ok"
    finally:
        if router is not None:
            await router.stop()
        await st.close()
        await sched.stop()


class Receiver(otlp_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list = []

    async def Export(self, request, context):
        for resource_spans in request.resource_spans:
            for scope in resource_spans.scope_spans:
                self.spans.extend(scope.spans)
        return otlp.ExportTraceServiceResponse()


async def test_router_process_exports_spans_by_otlp(tmp_path):
    st = stack.Stack(tmp_path)
    receiver = Receiver()
    server = grpc.aio.server()
    otlp_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        env = stack.base_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
            OTEL_EXPORTER_OTLP_INSECURE="true",
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        router = st.add(await stack.router(tmp_path, cap.ready["grpc"], "--no-use-kv-events", env=env))
        url = stack.router_url(router)
        await assert_eventually(lambda: "workers: 1 healthy" in router.log_text(), timeout_s=15)
        client = AsyncOpenAI(
            base_url=url + "/v1", api_key="none", max_retries=0, default_headers={"traceparent": TRACEPARENT}
        )
        await client.completions.create(model=MODEL, prompt="trace me", max_tokens=2)
        spans = await assert_eventually(lambda: [s for s in receiver.spans if s.name == "router.pick"], timeout_s=15)
        assert spans[0].trace_id.hex() == TRACE_ID
        # The request span ends after the pick span, so it may arrive in a later export batch.
        await assert_eventually(
            lambda: any(s.name == "router.request" and s.trace_id.hex() == TRACE_ID for s in receiver.spans),
            timeout_s=15,
        )
    finally:
        await st.close()
        await server.stop(0)
