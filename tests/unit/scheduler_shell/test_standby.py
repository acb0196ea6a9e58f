"""Two scheduler replicas on one shared SQLite file (in process, real clock, short leases): the standby
refuses every decision naming the leader; the leader answers only what is in the store; a leader that
loses its lease answers its held Admits UNAVAILABLE and writes nothing more."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.common.outbound.leader_follow import LEADER_METADATA_KEY, leader_hint
from services.common.settings.errors import ConfigError
from services.scheduler.adapters.file_lease import FileLease
from services.scheduler.adapters.state_store import SqliteStateStore
from services.scheduler.core.leadership import LeaseParams
from services.scheduler.server import start_scheduler
from tests.support.eventually import assert_eventually
from tests.support.redis_server import redis_server  # noqa: F401  (fixture)
from tests.unit.scheduler_shell.support import FakeCapacity, config, router_client, workers_snapshot

pytestmark = pytest.mark.timeout(30)
LEASE = LeaseParams(ttl_s=0.8, renew_s=0.1, poll_s=0.05, margin_s=0.2)


async def _replica(path, capacity):
    return await start_scheduler(
        config(state_path=str(path), leader_election=True, lease=LEASE, state_flush_seconds=0.05),
        capacity_stub=capacity,
    )


async def _role(stub) -> pb.Leadership:
    return await stub.GetLeadership(pb.GetLeadershipRequest(), timeout=2)


@pytest.fixture
async def pair(tmp_path):
    capacity = FakeCapacity()
    capacity.push(workers_snapshot(1, {("w1", 0): 1_000}))
    a = await _replica(tmp_path / "s.sqlite", capacity)
    stub_a = pb_grpc.SchedulerStub(channel_a := grpc.aio.insecure_channel(a.address))
    await assert_eventually(lambda: _is_leader(stub_a), timeout_s=5)
    b = await _replica(tmp_path / "s.sqlite", capacity)
    stub_b = pb_grpc.SchedulerStub(channel_b := grpc.aio.insecure_channel(b.address))
    await assert_eventually(lambda: _knows_leader(stub_b, a.address), timeout_s=5)
    yield a, stub_a, b, stub_b
    for channel in (channel_a, channel_b):
        await channel.close()
    for running in (b, a):
        await running.stop()


async def _is_leader(stub) -> bool:
    return (await _role(stub)).role == "leader"


async def _knows_leader(stub, address) -> bool:
    view = await _role(stub)
    return view.role == "standby" and view.leader_address == address


DECISIONS = [
    ("Admit", pb.AdmitRequest(session_id="p", request_id="r1")),
    ("Complete", pb.CompleteRequest(session_id="p", request_id="r1")),
    ("Release", pb.ReleaseRequest(session_id="p")),
    ("Bind", pb.BindRequest(request_id="r1", worker_id="w1")),
    ("RenewLeases", pb.RenewLeasesRequest(request_ids=["r1"])),
    ("GetProgram", pb.GetProgramRequest(session_id="p")),
    ("ListPrograms", pb.ListProgramsRequest()),
    ("GetStats", pb.GetStatsRequest()),
]


async def test_the_standby_refuses_every_decision_naming_the_leader(pair):
    a, stub_a, b, stub_b = pair
    for method, request in DECISIONS:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await getattr(stub_b, method)(request, timeout=2)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, method
        assert leader_hint(err.value) == a.address, method
        assert "standby" in err.value.details()
    for streaming in (stub_b.AdmitStream(DECISIONS[0][1], timeout=2), stub_b.WatchEvents(pb.WatchEventsRequest())):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in streaming:
                pass
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert dict(err.value.trailing_metadata())[LEADER_METADATA_KEY] == a.address
    mux = stub_b.AdmitMux(iter([pb.MuxRequest(ops=[pb.MuxOp(id=1, admit=pb.MuxAdmit(request=DECISIONS[0][1]))])]))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in mux:
            pass
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert dict(err.value.trailing_metadata())[LEADER_METADATA_KEY] == a.address
    # Configuration and leadership are answered by every replica.
    await stub_b.GetRouterConfig(pb.GetRouterConfigRequest(), timeout=2)

    async def one_term():
        # (Both views of the same term: on a loaded machine A's lease may lapse and A take it again.)
        view_a, view_b = await _role(stub_a), await _role(stub_b)
        return (view_a, view_b) if view_a.epoch == view_b.epoch else None

    view_a, view_b = await assert_eventually(one_term, timeout_s=5)
    assert (view_a.role, view_b.role) == ("leader", "standby")
    assert view_a.epoch >= 1 and view_a.replica_id != view_b.replica_id
    assert view_a.leader_address == view_b.leader_address == a.address
    assert b.runtime is None and a.runtime is not None


async def test_an_admission_is_in_the_store_before_its_answer_leaves(pair, tmp_path):
    a, stub_a, _, _ = pair
    await stub_a.Admit(pb.AdmitRequest(session_id="p", request_id="r1", estimated_prompt_tokens=10), timeout=5)
    reader = SqliteStateStore(tmp_path / "s.sqlite", shared=True)
    await reader.open()
    try:
        stored = await reader.load()  # no flush interval waited for: the answer came after the commit
    finally:
        await reader.close()
    assert len(stored.programs) == 1 and len(stored.tickets) == 1


async def test_a_leader_that_loses_its_lease_answers_held_admits_unavailable_and_writes_nothing(pair, tmp_path):
    a, stub_a, b, stub_b = pair
    # p1 fills the replica; p2, a new program, then queues (held) at admission.
    await stub_a.Admit(pb.AdmitRequest(session_id="p1", request_id="r1", estimated_prompt_tokens=1), timeout=5)
    await stub_a.Complete(pb.CompleteRequest(session_id="p1", request_id="r1", prompt_tokens=990), timeout=5)
    held = stub_a.AdmitStream(pb.AdmitRequest(session_id="p2", request_id="r2", estimated_prompt_tokens=500))
    first = await asyncio.wait_for(held.read(), timeout=5)
    assert first.HasField("held") and first.held.heartbeat_seconds > 0
    # Another replica took the lease (a later epoch; its clock says A's lease ran out): A's next renewal finds out.
    intruder = FileLease(f"{tmp_path / 's.sqlite'}.lease", wall=lambda: time.time() + 60)
    assert intruder.acquire("intruder", "elsewhere:1", 60, 0).held
    with pytest.raises(grpc.aio.AioRpcError) as err:
        while True:
            update = await asyncio.wait_for(held.read(), timeout=5)
            assert update.HasField("held")  # heartbeats until the term ends
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "no longer the leader" in err.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub_a.Admit(pb.AdmitRequest(session_id="p3", request_id="r3"), timeout=2)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (await _role(stub_a)).role == "standby" and a.runtime is None


async def test_leader_election_with_the_in_memory_table_refuses_to_start():
    with pytest.raises(ConfigError) as err:
        config(state_path="none", leader_election=True)
    assert err.value.field == "leader_election" and "share" in err.value.reason


async def test_the_planners_following_stub_and_the_routers_client_find_the_leader(pair):
    """Both clients given [standby, leader]: the standby's redirect sends the calls to the leader."""
    from services.common.outbound.leader_follow import FollowingStub
    from services.router.core.outcome import Outcome

    a, _, b, _ = pair
    channels: list[grpc.aio.Channel] = []

    def channel(address: str) -> grpc.aio.Channel:
        channels.append(opened := grpc.aio.insecure_channel(address))
        return opened

    stub = FollowingStub([b.address, a.address], channel, pb_grpc.SchedulerStub)
    await stub.GetStats(pb.GetStatsRequest(), timeout=2)
    assert stub.current == a.address
    for opened in channels:
        await opened.close()

    client = router_client(f"{b.address},{a.address}")
    try:
        admission = await client.admit("p9", "", "r9", 10)
        assert admission is not None and client.address == a.address
        await client.complete("p9", "r9", admission.worker_id, 0, 100, 5, 0, Outcome.OK)
        view = a.core.program("p9")
        assert view is not None and view.turns == 1 and view.token_total == 105
    finally:
        await client.close()


async def test_a_router_given_one_address_learns_the_leader_from_the_standbys_redirect(pair):
    """As behind a Kubernetes Service: the one address reaches a standby, whose redirect names the leader."""

    a, _, b, _ = pair
    client = router_client(b.address)
    try:
        assert await client.admit("p8", "", "r8", 10) is not None
        assert client.address == a.address and client.addresses == [b.address, a.address]
        assert await client.release("p8")
    finally:
        await client.close()


async def test_a_decision_the_store_does_not_take_is_refused_and_rolled_back(tmp_path, redis_server):
    """With leader election an answer means "stored": Redis frozen, an Admit is refused (UNAVAILABLE, or
    FAILED_PRECONDITION once the leader stepped down for want of renewals) and rolled back, never answered."""
    import signal

    from services.scheduler.core.leadership import LeaseParams as Lease

    capacity = FakeCapacity()
    capacity.push(workers_snapshot(1, {("w1", 0): 1_000}))
    running = await start_scheduler(
        config(
            state_redis_url=redis_server.url,
            leader_election=True,
            lease=Lease(ttl_s=2.0, renew_s=0.4, poll_s=0.05, margin_s=0.5),
            state_write_timeout_seconds=0.3,
        ),
        capacity_stub=capacity,
    )
    stub = pb_grpc.SchedulerStub(channel := grpc.aio.insecure_channel(running.address))
    try:
        await assert_eventually(lambda: _is_leader(stub), timeout_s=5)
        runtime = running.runtime
        redis_server.signal(signal.SIGSTOP)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Admit(pb.AdmitRequest(session_id="q", request_id="q1", estimated_prompt_tokens=5), timeout=5)
            assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)
            assert runtime.core.program("q") is None  # rolled back
        finally:
            redis_server.signal(signal.SIGCONT)
    finally:
        await channel.close()
        await running.stop()


async def test_a_write_lock_held_by_a_frozen_replica_does_not_stop_the_leader_deciding(pair, tmp_path):
    """A shared SQLite file whose write lock another process holds: the store is up and the leader keeps
    its lease (another file), so it decides on, and the table is rewritten whole once the lock is free."""
    a, stub_a, _, _ = pair
    blocker = sqlite3.connect(tmp_path / "s.sqlite", isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        await stub_a.Admit(pb.AdmitRequest(session_id="q", request_id="q1", estimated_prompt_tokens=5), timeout=5)
        assert a.core.program("q").turns == 1
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()

    async def stored() -> bool:
        reader = SqliteStateStore(tmp_path / "s.sqlite", shared=True)
        await reader.open()
        try:
            return len((await reader.load()).programs) == 1
        finally:
            await reader.close()

    await assert_eventually(stored, timeout_s=10, interval_s=0.2)


async def test_a_leader_that_loses_its_lease_answers_each_mux_operation_as_the_unary_calls(pair, tmp_path):
    """On one AdmitMux stream: the held admit ends UNAVAILABLE (rolled back) when the term ends, and a later
    admit on the same stream is refused FAILED_PRECONDITION, as AdmitStream calls would be."""
    a, stub_a, b, stub_b = pair
    await stub_a.Admit(pb.AdmitRequest(session_id="p1", request_id="r1", estimated_prompt_tokens=1), timeout=5)
    await stub_a.Complete(pb.CompleteRequest(session_id="p1", request_id="r1", prompt_tokens=990), timeout=5)
    mux = stub_a.AdmitMux()
    request = pb.AdmitRequest(session_id="p2", request_id="r2", estimated_prompt_tokens=500)
    await mux.write(pb.MuxRequest(ops=[pb.MuxOp(id=1, admit=pb.MuxAdmit(request=request))]))
    first = await asyncio.wait_for(mux.read(), timeout=5)
    assert first.results[0].admit.HasField("held") and first.results[0].admit.held.heartbeat_seconds > 0
    intruder = FileLease(f"{tmp_path / 's.sqlite'}.lease", wall=lambda: time.time() + 60)
    assert intruder.acquire("intruder", "elsewhere:1", 60, 0).held
    while True:
        result = (await asyncio.wait_for(mux.read(), timeout=5)).results[0]
        if result.WhichOneof("result") == "error":
            break
        assert result.admit.HasField("held")  # heartbeats until the term ends
    assert result.error.code == grpc.StatusCode.UNAVAILABLE.value[0] and "no longer the leader" in result.error.message
    request = pb.AdmitRequest(session_id="p3", request_id="r3", estimated_prompt_tokens=1)
    await mux.write(pb.MuxRequest(ops=[pb.MuxOp(id=2, admit=pb.MuxAdmit(request=request))]))
    refused = (await asyncio.wait_for(mux.read(), timeout=5)).results[0]
    assert refused.id == 2 and refused.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    mux.cancel()
