"""The shell's own machinery: capacity follower, tick loop resilience, bounded event queues."""

import dataclasses
import logging

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bandmaster.capacity.v1 import capacity_pb2 as cap_pb
from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.common.process import heap
from services.scheduler.adapters.proto import capacity_from_proto
from services.scheduler.core import EventKind, ProgramEvent, ReplicaCapacity
from services.scheduler.loop import EventQueue
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.server import start_scheduler
from tests.support.eventually import assert_eventually
from tests.unit.scheduler_shell.support import FakeCapacity, config, workers_snapshot

pytestmark = pytest.mark.timeout(30)


def test_capacity_from_proto_keeps_only_healthy_workers():
    snap = workers_snapshot(4, {("a", 0): 100, ("a", 1): 200, ("b", 0): 300}, unhealthy=("b",), max_programs=8)
    converted = capacity_from_proto(snap)
    assert converted.version == 4
    assert converted.replicas == (ReplicaCapacity("a", 0, 100, 8), ReplicaCapacity("a", 1, 200, 8))


def test_capacity_from_proto_marks_replicas_of_workers_without_cache_reports():
    snap = workers_snapshot(5, {("a", 0): 100, ("a", 1): 100, ("b", 0): 300})
    snap.workers[0].card.degraded.extend(
        [cap_pb.DEGRADATION_CACHE_REPORT_OFF, cap_pb.DEGRADATION_PRIORITY_SCHEDULING_OFF]
    )
    snap.workers[1].card.degraded.append(cap_pb.DEGRADATION_PRIORITY_SCHEDULING_OFF)
    converted = capacity_from_proto(snap)
    assert [(r.worker_id, r.dp_rank, r.cache_report) for r in converted.replicas] == [
        ("a", 0, False),
        ("a", 1, False),
        ("b", 0, True),  # priority scheduling off changes nothing the scheduler learns
    ]


async def test_worker_leaving_the_snapshot_unplaces_its_programs(h):
    await h.set_capacity({("w1", 0): 10_000, ("w2", 0): 10_000})
    placed = {}
    for i in range(4):
        resp = await h.admit(f"p{i}", f"r{i}", 100)
        placed[f"p{i}"] = resp.worker_id
    on_w2 = [sid for sid, w in placed.items() if w == "w2"]
    assert on_w2, placed
    await h.set_capacity({("w1", 0): 10_000, ("w2", 0): 10_000}, unhealthy=("w2",))
    for sid in on_w2:
        assert (await h.program(sid)).worker_id == ""
    listing = await h.client.ListPrograms(pb.ListProgramsRequest())
    assert [r.worker_id for r in listing.replicas] == ["w1"]
    # The next turn of an unplaced program is placed again, on what is left.
    await h.complete(on_w2[0], f"r{on_w2[0][1:]}", 100, 0)
    resp = await h.admit(on_w2[0], "again", 100)
    assert resp.pinned and resp.worker_id == "w1"
    h.core.ledger.check_invariants(h.clock.monotonic())


async def test_follower_reconnects_with_one_warning_per_outage(h, caplog):
    caplog.set_level(logging.INFO, logger="services.scheduler.capacity")
    await h.set_capacity({("w1", 0): 1_000})
    follower = h.running.follower
    follower.initial_backoff_s = follower.max_backoff_s = 0.01
    h.capacity.latest = None  # the service is down: a new stream gets nothing before failing
    h.capacity.fail()
    await assert_eventually(lambda: len(h.capacity.watches) == 2, timeout_s=5)
    h.capacity.fail()  # still down on the first retry
    await assert_eventually(lambda: len(h.capacity.watches) == 3, timeout_s=5)
    await h.set_capacity({("w1", 0): 2_000}, version=2)  # back, with a change
    assert h.core.capacity[0].retention_tokens == 2_000
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "capacity stream to" in warnings[0].getMessage()
    assert "UNAVAILABLE" in warnings[0].getMessage()
    assert any(r.levelno == logging.INFO and "recovered" in r.getMessage() for r in caplog.records)
    assert all(w.cancelled for w in h.capacity.watches[:2])
    text = generate_latest(h.running.host.registry).decode()
    assert "bandmaster_scheduler_capacity_stream_failures_total 2.0" in text
    assert "bandmaster_scheduler_capacity_stream_connected 1.0" in text


async def test_heartbeats_do_not_reapply_capacity(h):
    await h.set_capacity({("w1", 0): 1_000}, version=3)
    applied = h.runtime.metrics.capacity_snapshots._value.get()
    h.capacity.push(workers_snapshot(3, {("w1", 0): 1_000}, heartbeat=True))
    await h.set_capacity({("w1", 0): 1_000}, version=4)
    assert h.runtime.metrics.capacity_snapshots._value.get() == applied + 1


async def test_silent_stream_counts_as_dead_and_is_reopened():
    capacity = FakeCapacity()
    capacity.latest = workers_snapshot(1, {("w1", 0): 1_000})
    running = await start_scheduler(config(), capacity_stub=capacity, tick_loop=False, capacity_idle_timeout_s=0.05)
    try:
        running.follower.initial_backoff_s = 0.01
        await assert_eventually(lambda: len(capacity.watches) >= 2, timeout_s=5)
        assert running.core.capacity[0].retention_tokens == 1_000
    finally:
        await running.stop()


@pytest.mark.pure_core
async def test_tick_loop_survives_a_failing_tick(caplog):
    capacity = FakeCapacity()
    running = await start_scheduler(config(scheduler_interval_seconds=0.02), capacity_stub=capacity)
    real_tick = running.core.tick
    calls = {"n": 0}

    def flaky(now, snapshot=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real_tick(now, snapshot)

    running.core.tick = flaky
    try:
        with caplog.at_level(logging.ERROR, logger="services.scheduler"):
            await assert_eventually(lambda: running.runtime.ticks >= 2, timeout_s=5)
        assert any("scheduler tick failed" in r.getMessage() for r in caplog.records)
    finally:
        await running.stop()


@pytest.mark.pure_core
async def test_tick_loop_settles_the_heap_before_each_tick_with_the_table_size(monkeypatch):
    capacity = FakeCapacity()
    running = await start_scheduler(config(scheduler_interval_seconds=0.02), capacity_stub=capacity)
    order: list[object] = []
    monkeypatch.setattr(heap, "settle_if_grown", lambda programs: order.append(programs) or False)
    real_tick = running.core.tick

    def tick(now, snapshot=None):
        order.append("tick")
        return real_tick(now, snapshot)

    running.core.tick = tick
    try:
        await assert_eventually(lambda: order.count("tick") >= 2, timeout_s=5)
        first = order.index("tick")
        assert first > 0 and order[first - 1] == len(running.core.ledger.programs)
    finally:
        await running.stop()


def test_slow_watcher_drops_oldest_events():
    queue = EventQueue(3)
    events = tuple(ProgramEvent(EventKind.ADMITTED, f"p{i}", None, 0, float(i)) for i in range(5))
    assert queue.put(events[:2]) == 0
    assert queue.put(events[2:]) == 2
    assert [e.session_id for e in queue.events] == ["p2", "p3", "p4"] and queue.dropped == 2


async def test_slow_watcher_never_blocks_the_tick(h):
    h.runtime.watch_queue = 2
    queue = h.runtime.subscribe()  # never read
    await h.set_capacity({("w1", 0): 100_000})
    for i in range(10):
        await h.admit(f"p{i}", f"r{i}", 10)
    assert h.tick() is not None
    assert len(queue.events) == 2
    assert h.runtime.metrics.watch_dropped._value.get() == 8
    h.runtime.unsubscribe(queue)


def test_metrics_register_on_a_fresh_registry():
    registry = CollectorRegistry()
    SchedulerMetrics(registry)
    assert "bandmaster_scheduler_tick_seconds" in generate_latest(registry).decode()


async def test_capacity_unreachable_still_serves_and_admits_any():
    running = await start_scheduler(dataclasses.replace(config(), capacity_addr="127.0.0.1:1"), tick_loop=False)
    try:
        running.follower.initial_backoff_s = 0.01
        await assert_eventually(lambda: running.follower.failures >= 1, timeout_s=5)
        async with grpc.aio.insecure_channel(running.address) as channel:
            from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

            resp = await pb_grpc.SchedulerStub(channel).Admit(
                pb.AdmitRequest(session_id="p", request_id="r"), timeout=5
            )
        assert not resp.pinned
    finally:
        await running.stop()
