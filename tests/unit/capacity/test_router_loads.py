"""Router replica sync at the capacity service: the pure table (sequence, TTL) and the gRPC fan-out."""

import asyncio

import grpc
import pytest

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from services.capacity.core.router_loads import RouterLoadTable
from services.capacity.server import start_capacity
from services.common.clock import FakeClock
from tests.unit.capacity.test_servicer import config


def test_the_table_keeps_the_newest_report_per_router_and_bumps_its_version():
    table: RouterLoadTable[str] = RouterLoadTable()
    assert table.report("r1", 1, 1.0, "r1@1", now=0.0) and table.version == 1
    assert table.report("r2", 1, 1.0, "r2@1", now=0.0)
    assert not table.report("r1", 1, 1.0, "r1@1 again", now=0.1)  # a retried call: ignored
    assert table.report("r1", 2, 1.0, "r1@2", now=0.2)
    assert table.live() == ["r1@2", "r2@1"] and table.version == 3


def test_a_router_that_stops_reporting_is_dropped_after_its_ttl():
    table: RouterLoadTable[str] = RouterLoadTable()
    table.report("r1", 1, 1.0, "r1", now=0.0)
    table.report("r2", 1, 3.0, "r2", now=0.0)
    assert table.next_expiry() == 1.0
    assert table.expire(0.99) == [] and table.version == 2
    assert table.expire(1.0) == ["r1"] and table.live() == ["r2"] and table.version == 3
    assert table.expire(3.0) == ["r2"] and len(table) == 0 and table.next_expiry() is None


def test_an_expired_router_may_come_back_with_any_sequence():
    table: RouterLoadTable[str] = RouterLoadTable()
    table.report("r1", 5, 1.0, "old", now=0.0)
    assert table.report("r1", 1, 1.0, "new", now=2.0)  # expired at 1.0: the old sequence no longer holds
    assert table.live() == ["new"]


def report(router_id, sequence, *loads, ttl_ms=1000):
    return pb.RouterLoadReport(
        router_id=router_id,
        sequence=sequence,
        ttl_ms=ttl_ms,
        loads=[
            pb.ReplicaActiveLoad(worker_id=w, active_requests=n, prefill_tokens=p, decode_blocks=d)
            for w, n, p, d in loads
        ],
    )


@pytest.fixture
async def service():
    clock = FakeClock()
    running = await start_capacity(config(), clock=clock)
    running.clock = clock
    yield running
    await running.stop()


async def next_table(stream, version):
    """The next table at or past `version` (the stream may resend a table as a heartbeat)."""
    while True:
        snapshot = await asyncio.wait_for(stream.read(), timeout=5)
        if snapshot.version >= version:
            return snapshot


async def test_reports_of_two_routers_are_merged_and_streamed_and_a_stale_one_dropped(service):
    async with grpc.aio.insecure_channel(service.address) as channel:
        client = pb_grpc.CapacityStub(channel)
        stream = client.WatchRouterLoads(pb.WatchRouterLoadsRequest())
        first = await asyncio.wait_for(stream.read(), timeout=5)
        assert first.version == 0 and list(first.routers) == []

        assert (await client.ReportRouterLoad(report("ra", 1, ("w1", 2, 100, 10)))).accepted
        assert (await client.ReportRouterLoad(report("rb", 1, ("w1", 1, 0, 4), ("w2", 3, 30, 9), ttl_ms=5000))).accepted
        table = await next_table(stream, 2)
        assert [r.router_id for r in table.routers] == ["ra", "rb"]
        assert [(x.worker_id, x.active_requests) for x in table.routers[1].loads] == [("w1", 1), ("w2", 3)]
        assert not (await client.ReportRouterLoad(report("ra", 1, ("w1", 9, 9, 9)))).accepted  # a duplicate

        service.clock.advance(1.0)  # ra's report (TTL 1 s) is now stale; rb's (5 s) is not
        assert service.router_loads.sweep() == ["ra"]
        table = await next_table(stream, 3)
        assert [r.router_id for r in table.routers] == ["rb"]
        stream.cancel()


@pytest.mark.parametrize("bad", [report("", 1), report("ra", 1, ttl_ms=0), report("ra", 1, ttl_ms=60_001)])
async def test_an_invalid_report_is_refused(service, bad):
    async with grpc.aio.insecure_channel(service.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pb_grpc.CapacityStub(channel).ReportRouterLoad(bad)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
