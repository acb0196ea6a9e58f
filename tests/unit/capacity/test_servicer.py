"""The Capacity gRPC service against a real in-process server on 127.0.0.1:0 and sglang_stub workers."""

import asyncio
import logging

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from services.capacity.config import CapacityConfig, StaticWorker
from services.capacity.core.cards import derive_card
from services.capacity.core.registry import PollOk
from services.capacity.core.state import Origin
from services.capacity.server import start_capacity
from services.common.observe.telemetry import setup_telemetry
from tests.support.capacity_workers import Answer, RawWorker
from tests.support.eventually import assert_eventually
from tests.support.sglang_stub import SglangStub, sglang_info

H = pb.WorkerHealth


def config(**overrides):
    base = dict(
        listen="127.0.0.1:0",
        metrics_port=-1,
        poll_interval_seconds=0.1,
        poll_timeout_seconds=0.1,
        unhealthy_after_failures=2,
        remove_unhealthy_after_seconds=0.5,
        watch_heartbeat_seconds=0.3,
        shutdown_grace_seconds=0.5,
    )
    base.update(overrides)
    return CapacityConfig(**base)


@pytest.fixture
async def stub():
    s = SglangStub(sglang_info(max_total_num_tokens=1000, page_size=1))
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def service():
    exporter = InMemorySpanExporter()
    running = await start_capacity(
        config(), telemetry=setup_telemetry("capacity-test", exporter=exporter, set_global=False)
    )
    running.exporter = exporter
    yield running
    await running.stop()


@pytest.fixture
async def client(service):
    async with grpc.aio.insecure_channel(service.address) as channel:
        yield pb_grpc.CapacityStub(channel)


async def worker(client, worker_id):
    snap = await client.ListWorkers(pb.ListWorkersRequest())
    return next((w for w in snap.workers if w.worker_id == worker_id), None)


async def test_register_polls_and_reports_budget(client, stub, service):
    resp = await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))
    assert resp.worker.worker_id == "w1" and resp.worker.origin == pb.WORKER_ORIGIN_RPC
    assert resp.worker.health == H.WORKER_HEALTH_PENDING

    async def healthy():
        w = await worker(client, "w1")
        assert w.health == H.WORKER_HEALTH_HEALTHY
        return w

    w = await assert_eventually(healthy, timeout_s=5)
    assert w.card.gpu_kv_tokens == 1000 and w.excluded_reason == ""
    assert [(r.dp_rank, r.retention_tokens, r.retention_source) for r in w.replicas] == [
        (0, 1000, pb.RETENTION_SOURCE_GPU_ONLY)
    ]
    assert w.last_success.seconds > 0
    snap = await client.ListWorkers(pb.ListWorkersRequest())
    assert snap.total_retention_tokens == 1000 and not snap.heartbeat
    assert "capacity.recompute" in {s.name for s in service.exporter.get_finished_spans()}
    text = generate_latest(service.host.registry).decode()
    assert 'bandmaster_capacity_replica_retention_tokens{dp_rank="0",source="GPU_ONLY",worker_id="w1"} 1000.0' in text
    assert 'bandmaster_capacity_workers{health="HEALTHY"} 1.0' in text


async def test_a_registration_is_linked_from_the_recompute_that_publishes_it(client, stub, service):
    """The recompute runs in the publisher task (a trace of its own) and links the RegisterWorker call's span."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    metadata = (("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),)
    await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"), metadata=metadata)

    def linked():
        spans = service.exporter.get_finished_spans()
        register = next(s for s in spans if s.name.endswith("/RegisterWorker"))
        recomputes = [
            s
            for s in spans
            if s.name == "capacity.recompute"
            and any(link.context.span_id == register.context.span_id for link in s.links)
        ]
        return register, recomputes

    register, recomputes = await assert_eventually(lambda: linked()[1] and linked(), timeout_s=5)
    assert format(register.context.trace_id, "032x") == trace_id
    assert all(format(s.context.trace_id, "032x") != trace_id for s in recomputes)


async def test_register_is_idempotent_and_conflicts_are_already_exists(client, stub):
    first = await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))
    again = await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url + "/", worker_id="w1"))
    assert again.worker.worker_id == first.worker.worker_id
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.RegisterWorker(pb.RegisterWorkerRequest(url="http://127.0.0.1:1", worker_id="w1"))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w2"))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already registered as worker_id 'w1'" in info.value.details()


async def test_default_worker_id_is_host_port(client, stub):
    resp = await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url))
    assert resp.worker.worker_id == f"127.0.0.1:{stub.port}"


@pytest.mark.parametrize(
    "request_kwargs",
    [
        {"url": ""},
        {"url": "ftp://a:1"},
        {"url": "http://a"},
        {"url": "a:1"},
        {"url": "http://a:1", "worker_id": "a b"},
        {"url": "http://a:1", "expected_gpu_kv_tokens": -1},
    ],
)
async def test_register_invalid_argument(client, request_kwargs):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.RegisterWorker(pb.RegisterWorkerRequest(**request_kwargs))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "url", ["http://user:hunter2@127.0.0.1:1", "user:hunter2@127.0.0.1:1", "http://user:hunter2@127.0.0.1"]
)
async def test_register_never_echoes_credentials(client, url):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.RegisterWorker(pb.RegisterWorkerRequest(url=url))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "hunter2" not in info.value.details() and "***@" in info.value.details()


async def test_heartbeat_updates_load(client, stub):
    await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))
    resp = await client.Heartbeat(
        pb.HeartbeatRequest(worker_id="w1", load=pb.WorkerLoad(num_running_reqs=4, token_usage=0.5))
    )
    assert resp.known

    async def load_seen():
        w = await worker(client, "w1")
        assert w.load.num_running_reqs == 4 and w.load.token_usage == 0.5
        return True

    await assert_eventually(load_seen, timeout_s=5)
    assert not (await client.Heartbeat(pb.HeartbeatRequest(worker_id="nobody"))).known
    for bad in (
        pb.HeartbeatRequest(),
        pb.HeartbeatRequest(worker_id="w1", load=pb.WorkerLoad(token_usage=2.0)),
        pb.HeartbeatRequest(worker_id="w1", load=pb.WorkerLoad(num_queue_reqs=-1)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.Heartbeat(bad)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_deregister_is_idempotent(client, stub):
    await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))
    assert (await client.DeregisterWorker(pb.DeregisterWorkerRequest(worker_id="w1"))).removed
    assert not (await client.DeregisterWorker(pb.DeregisterWorkerRequest(worker_id="w1"))).removed
    assert await worker(client, "w1") is None
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.DeregisterWorker(pb.DeregisterWorkerRequest())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def next_snapshot(stream, timeout_s=5.0):
    return await asyncio.wait_for(stream.read(), timeout_s)


async def test_watch_follows_changes_and_sends_heartbeats(client, stub):
    stream = client.WatchWorkers(pb.WatchWorkersRequest())
    first = await next_snapshot(stream)
    assert not first.heartbeat and list(first.workers) == []
    await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))
    seen = []
    while True:
        snap = await next_snapshot(stream)
        seen.append(snap)
        if snap.workers and snap.workers[0].health == H.WORKER_HEALTH_HEALTHY:
            break
    versions = [first.version] + [s.version for s in seen if not s.heartbeat]
    assert versions == sorted(set(versions))  # strictly increasing, no repeats
    # Quiet: a heartbeat repeats the version.
    hb = await next_snapshot(stream)
    assert hb.heartbeat and hb.version == seen[-1].version
    stream.cancel()


async def test_watch_with_known_version_skips_the_initial_snapshot(client, service):
    current = await client.ListWorkers(pb.ListWorkersRequest())
    stream = client.WatchWorkers(pb.WatchWorkersRequest(known_version=current.version))
    snap = await next_snapshot(stream)
    assert snap.heartbeat and snap.version == current.version
    stream.cancel()
    stream = client.WatchWorkers(pb.WatchWorkersRequest(known_version=current.version + 100))
    snap = await next_snapshot(stream)
    assert not snap.heartbeat and snap.version == current.version
    stream.cancel()


async def test_watch_deadline_ends_stream(client):
    stream = client.WatchWorkers(pb.WatchWorkersRequest(), timeout=0.5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stream:
            pass
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_slow_watcher_does_not_block_others_and_holds_only_latest(client, service, stub):
    slow = client.WatchWorkers(pb.WatchWorkersRequest())  # never read after the first message
    await next_snapshot(slow)
    fast = client.WatchWorkers(pb.WatchWorkersRequest())
    await next_snapshot(fast)
    for i in range(20):
        await client.Heartbeat(pb.HeartbeatRequest(worker_id="x"))  # unknown: no change
        await client.RegisterWorker(pb.RegisterWorkerRequest(url=f"http://127.0.0.1:{i + 1}", worker_id=f"w{i}"))
    target = (await client.ListWorkers(pb.ListWorkersRequest())).version
    while True:
        snap = await next_snapshot(fast)
        if snap.version >= target:
            break
    assert all(
        m.latest is None or m.latest.version <= service.runtime.registry.version for m in service.runtime._mailboxes
    )
    slow.cancel()
    fast.cancel()


async def test_unhealthy_then_removed(client, stub):
    await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))
    await assert_eventually(lambda: worker(client, "w1"), timeout_s=5)

    async def health_is(h):
        w = await worker(client, "w1")
        assert w is not None and w.health == h
        return w

    await assert_eventually(lambda: health_is(H.WORKER_HEALTH_HEALTHY), timeout_s=5)
    stub.fail("health", "status", 503)
    w = await assert_eventually(lambda: health_is(H.WORKER_HEALTH_UNHEALTHY), timeout_s=5)
    assert w.excluded_reason == "unhealthy: polls failing (last: health)" and not w.replicas

    async def gone():
        assert await worker(client, "w1") is None
        return True

    await assert_eventually(gone, timeout_s=5)


async def test_hanging_worker_times_out(client, stub):
    stub.fail("server_info", "hang")
    await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))

    async def unhealthy():
        w = await worker(client, "w1")
        assert w.health == H.WORKER_HEALTH_UNHEALTHY and "timeout" in w.excluded_reason
        return True

    await assert_eventually(unhealthy, timeout_s=5)


async def test_malformed_server_info_is_a_typed_rejection(client, stub, service):
    stub.fail("server_info", "malformed")
    await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))

    async def rejected():
        w = await worker(client, "w1")
        assert w.health == H.WORKER_HEALTH_UNHEALTHY and w.excluded_reason.startswith("server_info: malformed JSON")
        return True

    await assert_eventually(rejected, timeout_s=5)
    assert (
        'bandmaster_capacity_card_rejections_total{reason="malformed_json"} 1.0'
        in generate_latest(service.host.registry).decode()
    )


async def test_legacy_get_server_info_fallback():
    legacy = SglangStub(sglang_info(max_total_num_tokens=512, page_size=1), legacy_only=True)
    await legacy.start()
    running = await start_capacity(config(listen="127.0.0.1:0"))
    try:
        running.runtime.add_worker("old", legacy.url, Origin.RPC)

        def healthy():
            s = running.runtime.registry.get("old")
            assert s.card is not None and s.card.gpu_kv_tokens == 512
            return True

        await assert_eventually(healthy, timeout_s=5)
    finally:
        await running.stop()
        await legacy.stop()


async def test_static_workers_and_expectation_mismatch(stub):
    running = await start_capacity(config(workers=(StaticWorker("static", stub.url, Origin.CONFIG_FILE),)))
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            client = pb_grpc.CapacityStub(channel)

            async def ok():
                w = await worker(client, "static")
                assert w.health == H.WORKER_HEALTH_HEALTHY and w.origin == pb.WORKER_ORIGIN_CONFIG_FILE
                return True

            await assert_eventually(ok, timeout_s=5)
            other = SglangStub(sglang_info(max_total_num_tokens=2000, page_size=1))
            await other.start()
            try:
                await client.RegisterWorker(
                    pb.RegisterWorkerRequest(url=other.url, worker_id="liar", expected_gpu_kv_tokens=4000)
                )

                async def mismatch():
                    w = await worker(client, "liar")
                    assert w.health == H.WORKER_HEALTH_UNHEALTHY
                    assert w.excluded_reason == "registration: expected_gpu_kv_tokens 4000 != polled 2000"
                    return True

                await assert_eventually(mismatch, timeout_s=5)
                snap = await client.ListWorkers(pb.ListWorkersRequest())
                assert snap.total_retention_tokens == 1000
            finally:
                await other.stop()
    finally:
        await running.stop()


async def test_shutdown_ends_watch_streams(stub):
    running = await start_capacity(config())
    async with grpc.aio.insecure_channel(running.address) as channel:
        client = pb_grpc.CapacityStub(channel)
        stream = client.WatchWorkers(pb.WatchWorkersRequest())
        await next_snapshot(stream)
        await running.stop()
        with pytest.raises((grpc.aio.AioRpcError, StopAsyncIteration)):
            while True:
                snap = await next_snapshot(stream)
                if snap is grpc.aio.EOF:
                    raise StopAsyncIteration


async def health_of(client, worker_id, health):
    w = await worker(client, worker_id)
    assert w is not None and w.health == health, w
    return w


@pytest.mark.parametrize(
    "bad",
    [
        {"enable_hierarchical_cache": True, "hicache_write_policy": "write_back", "hicache_ratio": 1e305},
        {
            "enable_hierarchical_cache": True,
            "hicache_write_policy": "write_back",
            "hicache_size": 1e300,
            "kv_bytes_per_token": 100,
        },
    ],
)
async def test_an_absurd_card_never_leaves_a_stale_healthy_card(client, stub, bad):
    # Regression (issue 11): OverflowError/ValueError escaped every poll; the worker stayed HEALTHY.
    await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))
    await assert_eventually(lambda: health_of(client, "w1", H.WORKER_HEALTH_HEALTHY), timeout_s=5)
    stub.set_info({**stub.info, **bad})
    w = await assert_eventually(lambda: health_of(client, "w1", H.WORKER_HEALTH_UNHEALTHY), timeout_s=5)
    field = "hicache_ratio" if "hicache_ratio" in bad else "hicache_size"
    assert w.excluded_reason.startswith(f"server_info: {field} ") and not w.replicas


async def test_deep_json_never_leaves_a_stale_healthy_card(client):
    # Regression (issue 11): RecursionError escaped every poll; the worker stayed HEALTHY.
    raw = await RawWorker(Answer.json(sglang_info(max_total_num_tokens=1000, page_size=1))).start()
    try:
        await client.RegisterWorker(pb.RegisterWorkerRequest(url=raw.url, worker_id="w1"))
        await assert_eventually(lambda: health_of(client, "w1", H.WORKER_HEALTH_HEALTHY), timeout_s=5)
        raw.answer = Answer(b"[" * 200_000)
        w = await assert_eventually(lambda: health_of(client, "w1", H.WORKER_HEALTH_UNHEALTHY), timeout_s=5)
        assert w.excluded_reason == "server_info: JSON nested too deeply"
    finally:
        await raw.stop()


async def test_a_poller_bug_marks_the_worker_failing(client, stub, service, monkeypatch, caplog):
    await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.url, worker_id="w1"))
    await assert_eventually(lambda: health_of(client, "w1", H.WORKER_HEALTH_HEALTHY), timeout_s=5)

    async def broken(url):
        raise KeyError("bug")

    monkeypatch.setattr(service.runtime.poller, "poll", broken)
    w = await assert_eventually(lambda: health_of(client, "w1", H.WORKER_HEALTH_UNHEALTHY), timeout_s=5)
    assert w.excluded_reason == "unhealthy: polls failing (last: error)"
    assert "poll of worker w1 failed unexpectedly" in caplog.text


async def test_flapping_workers_are_damped_and_logged_once(service, caplog):
    caplog.set_level(logging.INFO, logger="services.capacity")
    runtime = service.runtime
    url = "http://127.0.0.1:9"
    runtime.registry.add("w1", url, Origin.RPC, 0.0)
    small, big = (
        PollOk(derive_card({"max_total_num_tokens": 1000, "page_size": 1})),
        PollOk(derive_card({"max_total_num_tokens": 2000, "page_size": 1})),
    )
    rejected = PollOk(derive_card({"max_total_num_tokens": 0, "page_size": 1}))
    runtime.apply("w1", url, big)
    for _ in range(20):
        runtime.apply("w1", url, small)
        runtime.apply("w1", url, big)
    assert runtime.registry.get("w1").card == small.card  # settled on the smaller card
    for _ in range(20):
        runtime.apply("w1", url, rejected)
        runtime.apply("w1", url, small)
    messages = [r.getMessage() for r in caplog.records if "worker w1" in r.getMessage()]
    assert sum("card_changed" in m for m in messages) == 1
    assert sum("card_rejected" in m for m in messages) == 1
    assert sum("health: HEALTHY -> UNHEALTHY" in m for m in messages) == 1


async def test_a_worker_without_cache_reports_says_so_in_the_snapshot(client, service, caplog):
    caplog.set_level(logging.WARNING, logger="services.capacity")
    bare = SglangStub(sglang_info(max_total_num_tokens=1000, page_size=1, enable_cache_report=False))
    await bare.start()
    try:
        await client.RegisterWorker(pb.RegisterWorkerRequest(url=bare.url, worker_id="bare"))

        async def healthy():
            w = await worker(client, "bare")
            assert w.health == H.WORKER_HEALTH_HEALTHY
            return w

        w = await assert_eventually(healthy, timeout_s=5)
        assert list(w.card.degraded) == [pb.DEGRADATION_CACHE_REPORT_OFF]
        assert [r.retention_tokens for r in w.replicas] == [1000]
        text = generate_latest(service.host.registry).decode()
        assert 'bandmaster_capacity_worker_degraded{reason="cache_report_off",worker_id="bare"} 1.0' in text
        assert 'bandmaster_capacity_worker_degraded{reason="priority_scheduling_off",worker_id="bare"} 0.0' in text
        warnings = [r.getMessage() for r in caplog.records if "degraded" in r.getMessage()]
        assert len(warnings) == 1 and "--enable-cache-report" in warnings[0]
    finally:
        await bare.stop()
