"""The Scheduler gRPC service on 127.0.0.1:0 with a FakeClock core, ticks driven by hand."""

import asyncio
import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import generate_latest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from tests.support.eventually import assert_eventually

pytestmark = pytest.mark.timeout(30)
W = ("w1", 0)


async def fill(h, tokens: int, sid: str = "big", worker: str = "w1", dp_rank: int = 0):
    """An ACTING program of `tokens` placed on `worker`: a small first turn whose Complete reports `tokens`."""
    resp = await h.admit(sid, f"{sid}-fill", 1, timeout=5)
    assert resp.pinned and resp.worker_id == worker and resp.dp_rank == dp_rank
    await h.complete(sid, f"{sid}-fill", tokens, 0, worker, dp_rank)


async def test_admit_places_and_complete_makes_acting(h):
    await h.set_capacity({W: 10_000})
    resp = await h.admit("p1", "r1", 1234)
    assert resp.pinned and (resp.worker_id, resp.dp_rank) == W and resp.priority == 0 and not resp.was_paused
    assert resp.admission_epoch == 1
    prog = await h.program("p1")
    assert prog.status == pb.PROGRAM_STATUS_REASONING and prog.token_total == 1234 and prog.tokens_estimated
    await h.complete("p1", "r1", 120, 30, "w1", 0)
    prog = await h.program("p1")
    assert prog.status == pb.PROGRAM_STATUS_ACTING and prog.token_total == 150 and not prog.tokens_estimated
    assert prog.turns == 1 and prog.lifecycle == pb.LIFECYCLE_ACTIVE
    assert prog.created_at.seconds > 1_700_000_000  # wall time, not the monotonic scale
    h.core.ledger.check_invariants(h.clock.monotonic())


async def test_before_first_capacity_snapshot_admit_answers_any(h):
    resp = await h.admit("p1", "r1", 500)
    assert not resp.pinned and resp.worker_id == "" and not resp.was_paused and resp.priority == 0
    assert h.runtime.held_count == 0
    prog = await h.program("p1")
    assert prog.lifecycle == pb.LIFECYCLE_ACTIVE and prog.worker_id == ""


async def test_many_concurrent_admits_held_then_released_by_one_tick(h):
    await h.set_capacity({W: 10_000})
    await fill(h, 9_500)
    calls = [asyncio.ensure_future(h.admit(f"p{i}", f"r{i}", 100)) for i in range(30)]
    await h.held(30)
    assert not any(c.done() for c in calls)
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.waiting_admissions == 30 and stats.programs_paused == 30
    assert (await h.client.Release(pb.ReleaseRequest(session_id="big"))).released
    result = h.tick()
    assert result.resumed == 30
    responses = await asyncio.gather(*calls)
    for resp in responses:
        assert resp.was_paused and resp.pinned and resp.worker_id == "w1" and resp.priority == 1
        assert resp.priority_seconds == pytest.approx(1.0) and not resp.forced_resume
    assert h.runtime.held_count == 0
    h.core.ledger.check_invariants(h.clock.monotonic())


async def test_cancelled_held_admission_of_existing_program_leaves_table_as_before(make_harness):
    h = await make_harness(pause_target=0.92)  # pausing the smaller program is enough
    await h.set_capacity({W: 10_000})
    await fill(h, 9_000, "a")
    await h.admit("b", "b1", 1, timeout=5)
    await h.complete("b", "b1", 800, 0, "w1", 0)
    h.tick()  # 9000 + 800 + 200 >= 9500: pauses the smallest ACTING program, b
    assert (await h.program("b")).lifecycle == pb.LIFECYCLE_PAUSED
    before = h.table()
    call = asyncio.ensure_future(h.admit("b", "b2", 50))
    await h.held(1)
    assert (await h.program("b")).status == pb.PROGRAM_STATUS_REASONING
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await h.held(0)
    assert h.table() == before
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.admissions_cancelled_total == 1 and stats.waiting_admissions == 0
    h.core.ledger.check_invariants(h.clock.monotonic())


async def test_cancelled_admission_of_new_program_leaves_no_trace(h):
    await h.set_capacity({W: 1_000})
    await fill(h, 900)
    before = h.table()
    call = asyncio.ensure_future(h.admit("new", "n1", 100))
    await h.held(1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await h.held(0)
    assert h.table() == before
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.program("new")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    h.tick()
    assert h.core.program("new") is None


async def test_deadline_expiry_while_held_rolls_back(h):
    await h.set_capacity({W: 1_000})
    await fill(h, 900)
    before = h.table()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.admit("new", "n1", 100, timeout=0.3)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await h.held(0)
    assert h.table() == before
    assert h.core.stats(h.clock.monotonic()).admissions_cancelled_total == 1


async def test_forced_resume_fires_at_the_deadline_on_the_injected_clock(make_harness):
    h = await make_harness(resume_timeout_seconds=30.0)
    await h.set_capacity({W: 1_000})
    await fill(h, 900)
    call = asyncio.ensure_future(h.admit("new", "n1", 100))
    await h.held(1)
    h.clock.advance(29.0)
    h.runtime.wake_timers()
    await asyncio.sleep(0)  # let the timer task look (nothing is due yet)
    assert not call.done() and h.runtime.held_count == 1
    h.clock.advance(1.0)
    h.runtime.wake_timers()  # no tick: the timer alone resolves it
    resp = await call
    assert resp.forced_resume and resp.was_paused and resp.pinned and resp.priority == 1
    assert resp.held_seconds == pytest.approx(30.0)
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.forced_resumes_total == 1 and stats.programs_paused == 0


async def test_complete_is_idempotent_per_request_id(h):
    await h.set_capacity({W: 10_000})
    await h.admit("p", "t1", 100)
    await h.complete("p", "t1", 100, 20, "w1", 0)
    await h.complete("p", "t1", 100, 20, "w1", 0)
    prog = await h.program("p")
    assert prog.status == pb.PROGRAM_STATUS_ACTING and prog.token_total == 120
    await h.admit("p", "t2", 300)
    await h.complete("p", "t1", 100, 20, "w1", 0)  # a late retry of the previous turn
    prog = await h.program("p")
    assert prog.status == pb.PROGRAM_STATUS_REASONING and prog.token_total == 300 and prog.turns == 2
    h.core.ledger.check_invariants(h.clock.monotonic())


async def test_release_removes_the_program_and_frees_held_admissions_unpinned(h):
    await h.set_capacity({W: 1_000})
    await fill(h, 900, "big")
    call = asyncio.ensure_future(h.admit("new", "n1", 100))
    await h.held(1)
    assert (await h.client.Release(pb.ReleaseRequest(session_id="new"))).released
    resp = await call
    assert not resp.pinned and resp.priority == 0 and resp.was_paused
    assert not (await h.client.Release(pb.ReleaseRequest(session_id="new"))).released
    assert (await h.client.Release(pb.ReleaseRequest(session_id="big"))).released
    listing = await h.client.ListPrograms(pb.ListProgramsRequest())
    assert list(listing.programs) == [] and listing.replicas[0].used_tokens == 0


async def test_get_program_unknown_is_not_found(h):
    for sid in ("nope", ""):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await h.program(sid)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_events_streams_pause_and_resume(make_harness):
    h = await make_harness(pause_target=0.92)  # pausing the smaller program is enough
    await h.set_capacity({W: 10_000})
    stream = h.client.WatchEvents(pb.WatchEventsRequest())
    got: list[pb.ProgramEvent] = []

    async def collect():
        async for event in stream:
            got.append(event)

    task = asyncio.ensure_future(collect())
    await assert_eventually(lambda: h.runtime.metrics.watchers._value.get() == 1, timeout_s=5)
    await fill(h, 9_000, "a")
    await h.admit("b", "b1", 1, timeout=5)
    await h.complete("b", "b1", 800, 0, "w1", 0)
    h.tick()
    await h.client.Release(pb.ReleaseRequest(session_id="a"))
    h.tick()
    kinds = lambda: [(e.kind, e.session_id) for e in got]  # noqa: E731
    await assert_eventually(lambda: (pb.EVENT_KIND_RESUMED, "b") in kinds(), timeout_s=5)
    assert kinds().index((pb.EVENT_KIND_PAUSED, "b")) < kinds().index((pb.EVENT_KIND_RESUMED, "b"))
    paused = next(e for e in got if e.kind == pb.EVENT_KIND_PAUSED)
    assert paused.reason == "pressure" and paused.worker_id == "w1" and paused.tokens == 800
    assert (pb.EVENT_KIND_RELEASED, "a") in kinds() and (pb.EVENT_KIND_ADMITTED, "a") in kinds()
    stream.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await assert_eventually(lambda: h.runtime.metrics.watchers._value.get() == 0, timeout_s=5)


@pytest.mark.parametrize(
    "method, request_msg, fragment",
    [
        ("Admit", pb.AdmitRequest(session_id=" padded", request_id="r"), "trimmed"),
        ("Admit", pb.AdmitRequest(session_id="x" * 257, request_id="r"), "256 bytes"),
        ("Admit", pb.AdmitRequest(session_id="tab\there", request_id="r"), "printable"),
        ("Admit", pb.AdmitRequest(session_id="caf\u00e9", request_id="r"), "printable"),
        ("Admit", pb.AdmitRequest(session_id="p", request_id=""), "request_id is required"),
        (
            "Admit",
            pb.AdmitRequest(session_id="p", request_id="r", estimated_prompt_tokens=-1),
            "estimated_prompt_tokens must be >= 0",
        ),
        ("Admit", pb.AdmitRequest(session_id="p", parent_session_id="q ", request_id="r"), "parent_session_id"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id=""), "request_id is required"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r", prompt_tokens=-5), "prompt_tokens"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r", completion_tokens=-1), "completion_tokens"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r", cached_tokens=-1), "cached_tokens"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r", outcome=7), "outcome"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r", ttft_seconds=-1.0), "ttft_seconds"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r", ttft_seconds=float("nan")), "ttft_seconds"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r", worker_id="w", dp_rank=-1), "dp_rank"),
        ("Bind", pb.BindRequest(request_id="r", worker_id=""), "worker_id is required"),
        ("Bind", pb.BindRequest(request_id="", worker_id="w"), "request_id is required"),
        ("Release", pb.ReleaseRequest(session_id=""), "session_id is required"),
        ("Release", pb.ReleaseRequest(session_id="p\n"), "trimmed"),
        ("GetProgram", pb.GetProgramRequest(session_id=" p"), "trimmed"),
    ],
)
async def test_invalid_input_is_invalid_argument(h, method, request_msg, fragment):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(h.client, method)(request_msg)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in err.value.details()
    assert h.core.programs() == ()


async def test_duplicate_request_id_in_flight_is_already_exists(h):
    await h.set_capacity({W: 10_000})
    await h.admit("p", "r1", 10)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.admit("q", "r1", 10)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_list_programs_fills_children_and_replica_bands(h):
    await h.set_capacity({W: 1_000, ("w2", 0): 1_000})
    await h.admit("root", "r1", 100)
    await h.admit("child-a", "r2", 25, parent="root")
    await h.admit("child-b", "r3", 25, parent="root")
    listing = await h.client.ListPrograms(pb.ListProgramsRequest())
    by_id = {p.session_id: p for p in listing.programs}
    assert sorted(by_id["root"].children) == ["child-a", "child-b"]
    assert by_id["child-a"].parent_session_id == "root"
    assert {(r.worker_id, r.dp_rank) for r in listing.replicas} == {W, ("w2", 0)}
    assert all(r.band in (pb.BAND_NORMAL, pb.BAND_SOFT_DEMOTE) for r in listing.replicas)
    assert sum(r.used_tokens for r in listing.replicas) == 100 + 25 + 25 + 3 * 100


async def test_router_config_and_stats(h):
    cfg = await h.client.GetRouterConfig(pb.GetRouterConfigRequest())
    assert cfg.router_block_size == 128 and cfg.use_kv_events
    assert cfg.kv_overlap_score_weight == 1.0 and cfg.router_ttl_secs == 120.0
    assert cfg.router_track_active_blocks and cfg.router_track_prefill_tokens and not cfg.router_track_output_blocks
    await h.set_capacity({W: 1_000}, version=7)
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.capacity_version == 7 and len(stats.replicas) == 1 and stats.replicas[0].retention_tokens == 1_000


async def test_passthrough_is_counted_after_bind_until_complete(h):
    await h.set_capacity({W: 1_000})
    resp = await h.admit("", "pt1", 300)
    assert not resp.pinned and h.runtime.held_count == 0
    assert (await h.client.Bind(pb.BindRequest(request_id="pt1", worker_id="w1", dp_rank=0))).bound
    assert not (await h.client.Bind(pb.BindRequest(request_id="unknown", worker_id="w1"))).bound
    assert not (await h.client.Bind(pb.BindRequest(request_id="pt1", worker_id="elsewhere"))).bound
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.passthrough_in_flight == 1 and stats.replicas[0].used_tokens == 400
    assert stats.replicas[0].passthrough_requests == 1
    await h.complete("", "pt1", 300, 10, "w1", 0)
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.passthrough_in_flight == 0 and stats.replicas[0].used_tokens == 0


async def test_admit_continues_the_callers_trace(h):
    provider = TracerProvider()
    with provider.get_tracer("router").start_as_current_span("router.pick") as parent:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        trace_id = parent.get_span_context().trace_id
    await h.admit("p", "r1", 10, metadata=tuple(carrier.items()))
    finished = h.exporter.get_finished_spans()
    spans = [s for s in finished if s.name == "scheduler.admit"]
    assert spans and spans[-1].context.trace_id == trace_id
    # Unary Admit: the gRPC instrumentation's SERVER span continues the caller's trace; the decision is its child.
    rpc = next(s for s in finished if s.name == "/bandmaster.scheduler.v1.Scheduler/Admit")
    assert rpc.kind is SpanKind.SERVER and rpc.parent.span_id == parent.get_span_context().span_id
    assert spans[-1].parent.span_id == rpc.context.span_id and spans[-1].kind is SpanKind.INTERNAL


async def test_admit_stream_is_its_own_server_span_in_the_callers_trace(h):
    """AdmitStream is a streaming handler, which the instrumentation does not wrap: scheduler.admit is the
    SERVER span, parented on the caller's traceparent, and nothing else is recorded for the call."""
    provider = TracerProvider()
    with provider.get_tracer("router").start_as_current_span("router.admit") as parent:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
    call = h.client.AdmitStream(
        pb.AdmitRequest(session_id="p", request_id="r1", estimated_prompt_tokens=10), metadata=tuple(carrier.items())
    )
    updates = [update async for update in call]
    assert updates[-1].HasField("decision")
    finished = h.exporter.get_finished_spans()
    admit = next(s for s in finished if s.name == "scheduler.admit")
    assert admit.kind is SpanKind.SERVER and admit.parent.span_id == parent.get_span_context().span_id
    assert not [s for s in finished if s.name.endswith("/AdmitStream")]


async def test_tick_logs_core_records_verbatim_and_makes_a_span(make_harness, caplog):
    h = await make_harness(pause_target=0.92)  # pausing the smaller program is enough
    await h.set_capacity({W: 10_000})
    await fill(h, 9_000, "a")
    await h.admit("b", "b1", 1, timeout=5)
    await h.complete("b", "b1", 800, 0, "w1", 0)
    with caplog.at_level(logging.DEBUG, logger="services.scheduler"):
        h.tick()
        await h.client.Release(pb.ReleaseRequest(session_id="a"))
        h.tick()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "services.scheduler.control"]
    assert (logging.INFO, "scheduler.tick worker=w1 dp_rank=0 paused=1 marked=0 util=1.0000 -> 0.9100") in lines
    assert (logging.INFO, "scheduler.tick resumed=1 still_paused=0") in lines
    assert (logging.DEBUG, "Paused program b (tokens=800)") in lines
    assert (logging.DEBUG, "Resumed program b -> worker=w1 (tokens=800)") in lines
    assert sum(s.name == "scheduler.tick" for s in h.exporter.get_finished_spans()) == 2


@pytest.mark.pure_core
async def test_failing_tick_is_logged_counted_and_retried(h, caplog, monkeypatch):
    real_tick = h.core.tick
    calls = {"n": 0}

    def flaky(now, snapshot=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real_tick(now, snapshot)

    monkeypatch.setattr(h.core, "tick", flaky)
    with caplog.at_level(logging.ERROR, logger="services.scheduler"):
        assert h.tick() is None
    assert any("scheduler tick failed" in r.getMessage() and r.exc_info for r in caplog.records)
    assert h.tick() is not None
    text = generate_latest(h.running.host.registry).decode()
    assert "bandmaster_scheduler_tick_failures_total 1.0" in text


async def test_metrics_cover_table_bands_and_totals(make_harness):
    h = await make_harness(pause_target=0.92)  # pausing the smaller program is enough
    await h.set_capacity({W: 10_000})
    await fill(h, 9_000, "a")
    await h.admit("b", "b1", 1, timeout=5)
    await h.complete("b", "b1", 800, 0, "w1", 0)
    call = asyncio.ensure_future(h.admit("c", "c1", 100))
    await h.held(1)  # nothing fits a new program: queued at admission (pause 1)
    h.tick()  # pressure: b is paused (pause 2)
    text = generate_latest(h.running.host.registry).decode()
    assert 'bandmaster_scheduler_programs{lifecycle="paused",status="acting"} 1.0' in text
    assert 'bandmaster_scheduler_programs{lifecycle="paused",status="reasoning"} 1.0' in text
    assert 'bandmaster_scheduler_programs{lifecycle="active",status="acting"} 1.0' in text
    assert 'bandmaster_scheduler_replica_band{band="normal",dp_rank="0",worker_id="w1"} 0.0' in text
    assert 'bandmaster_scheduler_replica_utilization{dp_rank="0",worker_id="w1"} 0.91' in text
    assert "bandmaster_scheduler_pauses_total 2.0" in text
    assert "bandmaster_scheduler_held_admissions 1.0" in text
    assert "bandmaster_scheduler_tick_seconds_count 1.0" in text
    assert "bandmaster_scheduler_capacity_stream_connected 1.0" in text
    # b was estimated at 1 token and reported 800: the learnt ratio moved above 1.
    (ratio,) = [line for line in text.splitlines() if line.startswith("bandmaster_scheduler_token_estimate_ratio ")]
    assert float(ratio.split()[1]) > 1.0
    await h.client.Release(pb.ReleaseRequest(session_id="c"))
    await call
    text = generate_latest(h.running.host.registry).decode()
    assert 'bandmaster_scheduler_admission_hold_seconds_count{outcome="released"} 1.0' in text


async def test_shutdown_goes_not_serving_then_releases_held_admits_unavailable(h):
    await h.set_capacity({W: 1_000})
    await fill(h, 900)
    call = asyncio.ensure_future(h.admit("new", "n1", 100))
    await h.held(1)
    health = health_pb2_grpc.HealthStub(h.channel)
    assert (
        await health.Check(health_pb2.HealthCheckRequest(service="bandmaster.scheduler.v1.Scheduler"))
    ).status == health_pb2.HealthCheckResponse.SERVING
    statuses = []
    real_stop = h.runtime.stop

    async def observing_stop():
        statuses.append((await health.Check(health_pb2.HealthCheckRequest())).status)
        await real_stop()

    h.runtime.stop = observing_stop
    await h.running.stop()
    assert statuses == [health_pb2.HealthCheckResponse.NOT_SERVING]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert h.core.program("new") is None  # rolled back


async def test_configured_pause_policy_and_its_parameters_reach_the_core():
    from services.scheduler.config import load_config
    from services.scheduler.server import start_scheduler
    from tests.unit.scheduler_shell.support import FakeCapacity

    config = load_config(
        [
            "--pause-policy",
            "cost_aware",
            "--cost-aware-tool-seconds",
            "7",
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "-1",
            "--state-path",
            "none",
        ],
        {},
    )
    running = await start_scheduler(config, capacity_stub=FakeCapacity(), tick_loop=False)
    try:
        assert running.core.policy.name == "cost_aware"
        assert running.core.policy.params.tool_seconds == 7.0
    finally:
        await running.stop()
