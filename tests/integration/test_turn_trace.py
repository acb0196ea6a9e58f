"""One trace per agent turn, end to end, through real processes and a real OTLP/gRPC receiver.

capacity, scheduler, router and a simworker each export by OTLP to a TraceService server in this test.
The worker's KV budget is tiny and the pause threshold low, so a second program's admission is held
until the first program is released; that turn's spans must still make one trace:

    router.request (SERVER, router)
      router.admit (CLIENT)      -> scheduler.admit (SERVER, scheduler; events held, resumed)
      router.pick
      router.upstream (CLIENT)   -> POST /v1/completions (SERVER, simworker; queue/prefill/decode events)
      router.complete (CLIENT)   -> scheduler.complete (SERVER, scheduler)   both on the AdmitMux stream
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import pytest
from openai import AsyncOpenAI
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from bandmaster.scheduler.v1 import scheduler_pb2 as spb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as spb_grpc
from clients import session_headers
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually

pytestmark = pytest.mark.integration

MODEL = "bandmaster/simworker"  # the simworker's default model path
SERVER, CLIENT, INTERNAL = (
    trace_pb2.Span.SPAN_KIND_SERVER,
    trace_pb2.Span.SPAN_KIND_CLIENT,
    trace_pb2.Span.SPAN_KIND_INTERNAL,
)
SCHEDULER = "/bandmaster.scheduler.v1.Scheduler/"


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict
    events: tuple[tuple[str, int], ...]
    start_ns: int
    end_ns: int


def _value(any_value):
    field = any_value.WhichOneof("value")
    return getattr(any_value, field) if field else None


class Receiver(otlp_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []

    async def Export(self, request, context):
        for resource_spans in request.resource_spans:
            service = next((_value(a.value) for a in resource_spans.resource.attributes if a.key == "service.name"), "")
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    self.spans.append(
                        Span(
                            service,
                            s.name,
                            s.kind,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            {a.key: _value(a.value) for a in s.attributes},
                            tuple((e.name, e.time_unix_nano) for e in s.events),
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                        )
                    )
        return otlp.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]


class Tree:
    """The spans of one trace, by name and by parent."""

    def __init__(self, spans: list[Span]) -> None:
        self.spans = spans
        self.by_id = {s.span_id: s for s in spans}

    def one(self, name: str, service: str | None = None) -> Span:
        found = [s for s in self.spans if s.name == name and (service is None or s.service == service)]
        assert len(found) == 1, f"{name}@{service}: {len(found)} spans in {self.names()}"
        return found[0]

    def parent(self, span: Span) -> Span:
        assert span.parent_id in self.by_id, f"{span.name}: parent {span.parent_id} not in the trace"
        return self.by_id[span.parent_id]

    def names(self) -> list[str]:
        return sorted(f"{s.service}:{s.name}" for s in self.spans)


def traceparent(n: int, sampled: bool = True) -> tuple[str, str]:
    trace_id = f"{n:032x}"
    return trace_id, f"00-{trace_id}-{n:016x}-{'01' if sampled else '00'}"


def prompt(program: str, tokens: int) -> str:
    # The simulated tokenizer makes a space and up to four characters one token.
    return "".join(f" {program}{i:03x}" for i in range(tokens))


async def turn(url: str, session: str, trace_header: str, tokens: int, *, final: bool = False):
    client = AsyncOpenAI(
        base_url=url + "/v1",
        api_key="none",
        max_retries=0,
        timeout=120,
        default_headers={**session_headers(session, final=final), "traceparent": trace_header},
    )
    try:
        return await client.completions.create(model=MODEL, prompt=prompt(session[0], tokens), max_tokens=4)
    finally:
        await client.close()


async def wait_for_trace(receiver: Receiver, trace_id: str, names: set[str]) -> Tree:
    async def complete():
        have = {s.name for s in receiver.trace(trace_id)}
        assert names <= have, f"missing {sorted(names - have)}; have {sorted(have)}"
        return True

    await assert_eventually(complete, timeout_s=30, interval_s=0.1)
    return Tree(receiver.trace(trace_id))


def assert_engine_phases(span: Span) -> None:
    """Queue, prefill and decode, each opened and closed, in order, inside the worker's span."""
    names = [name for name, _ in span.events]
    assert names == ["queue.start", "queue.end", "prefill.start", "prefill.end", "decode.start", "decode.end"], names
    times = [t for _, t in span.events]
    assert times == sorted(times)
    slack_ns = 50_000_000  # engine time mapped to wall time vs the span's own clock reads
    assert span.start_ns - slack_ns <= times[0] and times[-1] <= span.end_ns + slack_ns
    assert span.attributes["simworker.prompt_tokens"] > 0
    assert span.attributes["simworker.prefill_s"] > 0 and span.attributes["simworker.decode_s"] > 0


def assert_turn_tree(tree: Tree) -> Span:
    """The shape every admitted turn shares; returns the scheduler's admit span."""
    request = tree.one("router.request", "bandmaster-router")
    assert request.kind == SERVER
    pick = tree.one("router.pick")
    assert tree.parent(pick) == request
    admit_client = tree.one("router.admit")
    assert admit_client.kind == CLIENT and tree.parent(admit_client) == request
    admit = tree.one("scheduler.admit", "bandmaster-scheduler")
    assert admit.kind == SERVER and tree.parent(admit) == admit_client
    upstream = tree.one("router.upstream")
    assert upstream.kind == CLIENT and tree.parent(upstream) == request
    assert upstream.attributes["http.response.status_code"] == 200
    worker = tree.one("POST /v1/completions", "bandmaster-simworker")
    assert worker.kind == SERVER and tree.parent(worker) == upstream
    assert_engine_phases(worker)
    # The router completes the turn on its AdmitMux stream: a CLIENT span per operation, continued by the
    # scheduler's SERVER span (no per-call instrumentation spans).
    complete_client = tree.one("router.complete", "bandmaster-router")
    assert complete_client.kind == CLIENT and tree.parent(complete_client) == request
    complete = tree.one("scheduler.complete", "bandmaster-scheduler")
    assert complete.kind == SERVER and tree.parent(complete) == complete_client
    assert complete.attributes["scheduler.outcome"] == "ok"
    assert not [s for s in tree.spans if s.name == SCHEDULER + "Complete"]
    return admit


async def test_one_trace_per_turn_across_a_held_and_resumed_admission(tmp_path):
    st = stack.Stack(tmp_path)
    receiver = Receiver()
    otlp_server = grpc.aio.server()
    otlp_grpc.add_TraceServiceServicer_to_server(receiver, otlp_server)
    port = otlp_server.add_insecure_port("127.0.0.1:0")
    await otlp_server.start()
    channel = None
    env = stack.base_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_BSP_SCHEDULE_DELAY="50",
    )
    try:
        # One worker of 4096 KV tokens; two programs of ~1200 tokens cross the 0.5 pause threshold.
        worker = st.add(
            await stack.spawn(
                "w",
                "services.simworker",
                ["--port", "0", "--speedup", "20", "--enable-cache-report", "--max-total-tokens", "4096"],
                tmp_path,
                env=env,
            )
        )
        cap = st.add(
            await stack.spawn(
                "capacity",
                "services.capacity",
                [
                    "--listen",
                    "127.0.0.1:0",
                    "--metrics-port",
                    "-1",
                    "--worker-url",
                    worker.ready["url"],
                    "--poll-interval-seconds",
                    "0.5",
                    "--poll-timeout-seconds",
                    "0.5",
                ],
                tmp_path,
                env=env,
            )
        )
        sched = st.add(
            await stack.spawn(
                "scheduler",
                "services.scheduler",
                [
                    "--capacity-addr",
                    cap.ready["grpc"],
                    "--listen",
                    "127.0.0.1:0",
                    "--metrics-port",
                    "-1",
                    "--state-path",
                    str(tmp_path / "scheduler.sqlite"),
                    "--scheduler-interval-seconds",
                    "0.1",
                    "--pause-policy",
                    "threshold",
                    "--pause-threshold",
                    "0.5",
                    "--pause-target",
                    "0.3",
                    "--soft-demote-threshold",
                    "0.3",
                    "--acting-decay-tau-seconds",
                    "1000",
                    "--resume-timeout-seconds",
                    "120",
                    "--trace-sample-ratio",
                    "1",
                ],
                tmp_path,
                env=env,
            )
        )
        router = st.add(
            await stack.spawn(
                "router",
                "services.router",
                [
                    "--capacity-addr",
                    cap.ready["grpc"],
                    "--scheduler-addr",
                    sched.ready["grpc"],
                    "--listen",
                    "127.0.0.1:0",
                    "--http-port",
                    "0",
                    "--metrics-port",
                    "0",
                    "--no-use-kv-events",
                ],
                tmp_path,
                env=env,
            )
        )
        url = stack.router_url(router)
        await stack.healthy_workers(url, 1)
        channel = grpc.aio.insecure_channel(sched.ready["grpc"])
        scheduler = spb_grpc.SchedulerStub(channel)

        async def scheduler_sees_the_worker():
            stats = await scheduler.GetStats(spb.GetStatsRequest(), timeout=5)
            assert len(stats.replicas) == 1
            return True

        await assert_eventually(scheduler_sees_the_worker, timeout_s=30, interval_s=0.1)
        turn_names = {
            "router.request",
            "router.admit",
            "router.pick",
            "router.upstream",
            "scheduler.admit",
            "POST /v1/completions",
            "router.complete",
            "scheduler.complete",
        }

        # A request whose caller did not sample it: no service records it (parent-based sampling).
        unsampled_id, unsampled = traceparent(0xDEAD, sampled=False)
        await turn(url, "xenon", unsampled, 8, final=True)

        # 1. Program A's first turn: admitted at once (the scheduler pins it to the one worker, so the
        #    router has nothing to Bind).
        a_id, a_header = traceparent(0xA1)
        await turn(url, "alpha", a_header, 1200)
        tree = await wait_for_trace(receiver, a_id, turn_names)
        admit = assert_turn_tree(tree)
        assert admit.attributes["scheduler.held"] is False and admit.attributes["scheduler.pinned"] is True

        async def alpha_in_its_tool():  # the router sends Complete after answering: wait for it
            program = await scheduler.GetProgram(spb.GetProgramRequest(session_id="alpha"), timeout=5)
            assert program.status == spb.PROGRAM_STATUS_ACTING
            return True

        await assert_eventually(alpha_in_its_tool, timeout_s=30, interval_s=0.1)

        # 2. Program B's first turn does not fit beside A: its admission is held.
        b_id, b_header = traceparent(0xB1)
        held_turn = asyncio.ensure_future(turn(url, "bravo", b_header, 1200))

        async def waiting():
            stats = await scheduler.GetStats(spb.GetStatsRequest(), timeout=5)
            assert stats.waiting_admissions == 1
            return True

        await assert_eventually(waiting, timeout_s=30, interval_s=0.1)
        assert not held_turn.done()

        # 3. A's final request releases it; B is resumed and its turn runs.
        r_id, r_header = traceparent(0xA2)
        await turn(url, "alpha", r_header, 8, final=True)
        answer = await asyncio.wait_for(held_turn, 60)
        assert answer.usage.completion_tokens > 0

        tree = await wait_for_trace(receiver, b_id, turn_names)
        admit = assert_turn_tree(tree)
        assert admit.attributes["scheduler.held"] is True
        events = [name for name, _ in admit.events]
        assert events.index("scheduler.held") < events.index("scheduler.resumed")
        # The hold is inside the one trace: the admit span lasts until the resume, the worker starts after it.
        worker_span = tree.one("POST /v1/completions")
        assert worker_span.start_ns >= admit.end_ns - 50_000_000

        release = await wait_for_trace(receiver, r_id, {"router.request", SCHEDULER + "Release"})
        served = release.one(SCHEDULER + "Release", "bandmaster-scheduler")
        assert served.attributes["scheduler.released"] is True
        assert release.parent(release.parent(served)) == release.one("router.request")

        # Every span of the three sampled turns came in one of their traces; the unsampled one left none.
        assert receiver.trace(unsampled_id) == []
        # Background work is traced on its own (capacity's recompute of its snapshot), never in a turn.
        assert any(s.name == "capacity.recompute" and s.service == "bandmaster-capacity" for s in receiver.spans)
        assert all(s.trace_id not in (a_id, b_id, r_id) for s in receiver.spans if s.name == "capacity.recompute")
    finally:
        if channel is not None:
            await channel.close()
        await st.close()
        await otlp_server.stop(0)
