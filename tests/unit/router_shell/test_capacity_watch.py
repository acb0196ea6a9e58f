"""The router's worker set follows the capacity service's WatchWorkers stream, and a broken stream
never freezes it: a stream that goes silent past the idle timeout (not even heartbeats) and a worker
set the router's own callback failed to take are both given up and the stream reopened, which brings
the latest snapshot. A real router on 127.0.0.1:0 against a scripted capacity server."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bandmaster.capacity.v1 import capacity_pb2 as cap_pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as cap_grpc
from services.common.observe.telemetry import setup_telemetry
from services.router.config import KvOverrides, RouterConfig
from services.router.server import RunningRouter, start_router
from tests.support.eventually import assert_eventually

pytestmark = pytest.mark.timeout(60)


def snapshot(version: int, *worker_ids: str) -> cap_pb.WorkersSnapshot:
    return cap_pb.WorkersSnapshot(
        version=version,
        workers=[
            cap_pb.Worker(
                worker_id=w,
                url=f"http://127.0.0.1:1/{w}",
                health=cap_pb.WORKER_HEALTH_HEALTHY,
                card=cap_pb.WorkerCard(model_name="m", page_size=16),
                replicas=[cap_pb.Replica(worker_id=w, dp_rank=0, retention_tokens=1000)],
            )
            for w in worker_ids
        ],
    )


class ScriptedCapacity(cap_grpc.CapacityServicer):
    """Each WatchWorkers stream starts with the latest snapshot, like the service, then sends what is
    pushed to it. `latest` set without a push reaches only the streams opened after it: the streams
    already open stay silent (no heartbeats either)."""

    def __init__(self) -> None:
        self.latest: cap_pb.WorkersSnapshot | None = None
        self.streams: list[asyncio.Queue] = []

    async def WatchWorkers(self, request, context):
        queue: asyncio.Queue = asyncio.Queue()
        if self.latest is not None:
            queue.put_nowait(self.latest)
        self.streams.append(queue)
        while True:
            yield await queue.get()

    def push(self, snap: cap_pb.WorkersSnapshot) -> None:
        self.latest = snap
        self.streams[-1].put_nowait(snap)


async def _serve(capacity: ScriptedCapacity) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    cap_grpc.add_CapacityServicer_to_server(capacity, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _router(address: str, **start) -> RunningRouter:
    config = RouterConfig(
        capacity_addr=address,
        use_scheduler=False,
        listen="127.0.0.1:0",
        http_port=0,
        metrics_port=-1,
        shutdown_grace_seconds=0.5,
        seed=0,
        capacity_retry_max_seconds=0.05,
        kv=KvOverrides(use_kv_events=False),
    )
    return await start_router(config, telemetry=setup_telemetry("router-test", set_global=False), **start)


async def test_a_stalled_stream_is_given_up_and_reopened():
    capacity = ScriptedCapacity()
    capacity.latest = snapshot(1, "w1")
    server, address = await _serve(capacity)
    router = await _router(address, capacity_idle_timeout_s=0.3)
    try:
        await assert_eventually(lambda: set(router.fleet.workers) == {"w1"})
        capacity.latest = snapshot(2, "w1", "w2")  # the open stream stalls: it never sends this
        await assert_eventually(lambda: set(router.fleet.workers) == {"w1", "w2"}, timeout_s=10)
        assert len(capacity.streams) >= 2
    finally:
        await router.stop()
        await server.stop(None)


async def test_a_failing_callback_does_not_end_the_watch():
    capacity = ScriptedCapacity()
    server, address = await _serve(capacity)
    router = await _router(address)
    calls: list[set[str]] = []

    def fails_once(workers) -> None:
        calls.append(set(workers))
        if len(calls) == 1:
            raise RuntimeError("a listener failed")

    router.fleet.on_workers.append(fails_once)
    try:
        await assert_eventually(lambda: capacity.streams)
        capacity.push(snapshot(1, "w1"))
        await assert_eventually(lambda: calls)
        capacity.push(snapshot(2, "w1", "w2"))
        await assert_eventually(lambda: set(router.fleet.workers) == {"w1", "w2"}, timeout_s=10)
        assert calls[-1] == {"w1", "w2"}
    finally:
        await router.stop()
        await server.stop(None)
