"""Router replica sync, the router's shell: two PeerSync loops against a real capacity service."""

import grpc
import pytest

from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from services.capacity.server import start_capacity
from services.common.clock import SystemClock
from services.common.settings.errors import ConfigError
from services.router.adapters.peer_sync import TTL_INTERVALS, PeerSync
from services.router.config import load_config
from services.router.core.load import ReplicaLoad
from services.router.core.peer_loads import PeerLoads
from services.router.core.types import Replica
from services.router.observe.metrics import RouterMetrics
from tests.support.eventually import assert_eventually
from tests.unit.capacity.test_servicer import config

W1 = Replica("w1")
INTERVAL_S = 0.05


def test_the_flag_and_its_dynamo_variable_switch_sync_on_and_it_is_off_by_default():
    assert load_config([], {}).router_replica_sync is False
    assert load_config(["--router-replica-sync"], {}).router_replica_sync is True
    assert load_config([], {"DYN_ROUTER_REPLICA_SYNC": "true"}).router_replica_sync is True
    assert load_config(["--replica-sync-interval-ms", "250"], {}).replica_sync_interval_ms == 250
    with pytest.raises(ConfigError):
        load_config(["--replica-sync-interval-ms", "5"], {})


@pytest.fixture
async def capacity():
    running = await start_capacity(config())
    yield running
    await running.stop()


def sync(stub, router_id, loads):
    peers = PeerLoads(router_id, ttl_s=INTERVAL_S * TTL_INTERVALS)
    return PeerSync(
        stub, peers, lambda: dict(loads), SystemClock(), RouterMetrics(), interval_s=INTERVAL_S, address="test"
    )


async def test_each_router_sees_the_others_load_and_loses_it_when_the_other_stops(capacity):
    loads_a = {W1: ReplicaLoad(2, 100, 10)}
    loads_b = {W1: ReplicaLoad(1, 0, 4)}
    async with grpc.aio.insecure_channel(capacity.address) as channel:
        stub = pb_grpc.CapacityStub(channel)
        a, b = sync(stub, "ra", loads_a), sync(stub, "rb", loads_b)
        a.start()
        b.start()
        try:
            await assert_eventually(lambda: a.peers.get(W1) == ReplicaLoad(1, 0, 4))
            await assert_eventually(lambda: b.peers.get(W1) == ReplicaLoad(2, 100, 10))
            assert a.peers.peers == b.peers.peers == 1
            loads_a[W1] = ReplicaLoad(3, 0, 12)  # a change is reported within an interval or so
            await assert_eventually(lambda: b.peers.get(W1) == ReplicaLoad(3, 0, 12))
            await a.stop()  # killed: its report ages out of capacity's table, and so of b's view
            await assert_eventually(lambda: b.peers.get(W1) is None and b.peers.peers == 0)
        finally:
            await a.stop()
            await b.stop()


async def test_without_capacity_the_peer_view_goes_stale_and_is_dropped():
    async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:  # nothing listens
        s = sync(pb_grpc.CapacityStub(channel), "ra", {W1: ReplicaLoad(1, 1, 1)})
        s.peers.replace([], now=SystemClock().monotonic())
        assert await s.report_once() is False
        s.start()
        try:
            await assert_eventually(lambda: s.peers.age_s(SystemClock().monotonic()) is None)
        finally:
            await s.stop()
