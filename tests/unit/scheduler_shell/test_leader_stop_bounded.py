"""A graceful stop of the leading scheduler ends, bounded, even when the state store's client loses a
cancellation (docs/benchmarks/chaos.md, defect 5).

The state writer used to loop `while not fenced` and end only by its cancellation, and `stop` waited
for it without a bound: a CancelledError swallowed inside a store write (a client library's cleanup,
or Python 3.11's wait_for/timeout races) kept it writing for ever and the SIGTERM'd leader hung after
"stepping down ... (shutdown)", its held Admits already answered."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.common.clock import FakeClock
from services.scheduler import server as scheduler_server
from services.scheduler.adapters.state_store import SqliteStateStore, WriteBatch
from services.scheduler.core import SchedulerCore, make_pause_policy
from services.scheduler.core.leadership import LeaseParams
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.persist import StatePersister
from services.scheduler.server import start_scheduler
from tests.support.eventually import assert_eventually
from tests.unit.scheduler_shell.support import FakeCapacity, config, workers_snapshot

pytestmark = pytest.mark.timeout(20)
LEASE = LeaseParams(ttl_s=0.8, renew_s=0.1, poll_s=0.05, margin_s=0.2)


class LosesCancellations(SqliteStateStore):
    """A shared SQLite store whose writes, once `stuck`, hang and swallow the cancellation that ends them
    (then return as if written): what a store client that loses a CancelledError looks like."""

    stuck = False
    writes_while_stuck = 0

    async def write(self, batch: WriteBatch, epoch: int | None = None) -> None:
        if not self.stuck:
            await super().write(batch, epoch)
            return
        self.writes_while_stuck += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # lost


async def test_the_writer_stops_although_its_store_write_swallows_the_cancellation(tmp_path):
    from prometheus_client import CollectorRegistry

    cfg = config()
    store = LosesCancellations(tmp_path / "s.sqlite", shared=True)
    await store.open()
    core = SchedulerCore(
        cfg.control,
        make_pause_policy(cfg.pause_policy, cfg.pause_policy_params()),
        ticket_lease_seconds=cfg.ticket_lease_seconds,
    )
    persister = StatePersister(
        core, store, FakeClock(), SchedulerMetrics(CollectorRegistry()), flush_s=0.02, write_timeout_s=0.1, epoch=None
    )
    persister.start()
    await asyncio.sleep(0.05)
    store.stuck = True
    core.admit(0.0, "p", "", 10, "r1")
    pending = asyncio.ensure_future(persister.commit())  # a group commit pending at the stop
    await assert_eventually(lambda: store.writes_while_stuck >= 1, timeout_s=2)
    started = time.monotonic()
    await asyncio.wait_for(persister.stop(final_flush=True), timeout=3)
    assert time.monotonic() - started < 1.0
    assert await asyncio.wait_for(pending, timeout=1) in (True, False)  # answered, not left waiting
    writes = store.writes_while_stuck
    await asyncio.sleep(0.2)
    assert store.writes_while_stuck == writes  # the writer does not go on writing after its stop (store closed)


async def test_a_sigtermed_leader_with_held_admits_and_a_watcher_stops_within_the_bound(tmp_path, monkeypatch):
    """The in-process shape of the chaos run's hang: a leader with a held AdmitStream, a WatchEvents
    subscriber and a Complete waiting for its group commit, its store losing cancellations."""
    path = tmp_path / "s.sqlite"
    store = LosesCancellations(path, shared=True)
    monkeypatch.setattr(scheduler_server, "_open_store", lambda cfg: store)
    capacity = FakeCapacity()
    capacity.push(workers_snapshot(1, {("w1", 0): 1_000}))
    running = await start_scheduler(
        config(
            state_path=str(path),
            leader_election=True,
            lease=LEASE,
            state_flush_seconds=0.05,
            state_write_timeout_seconds=0.3,
            shutdown_grace_seconds=2.0,
        ),
        capacity_stub=capacity,
    )
    channel = grpc.aio.insecure_channel(running.address)
    stub = pb_grpc.SchedulerStub(channel)
    stopped = False
    try:

        async def leads() -> bool:
            view = await stub.GetLeadership(pb.GetLeadershipRequest(), timeout=2)
            return view.role == "leader"

        await assert_eventually(leads, timeout_s=5)
        # p1 fills the replica; p2 is then held at admission.
        await stub.Admit(pb.AdmitRequest(session_id="p1", request_id="r1", estimated_prompt_tokens=1), timeout=5)
        await stub.Complete(pb.CompleteRequest(session_id="p1", request_id="r1", prompt_tokens=990), timeout=5)
        held = stub.AdmitStream(pb.AdmitRequest(session_id="p2", request_id="r2", estimated_prompt_tokens=500))
        first = await asyncio.wait_for(held.read(), timeout=5)
        assert first.HasField("held")
        watch = stub.WatchEvents(pb.WatchEventsRequest())
        await asyncio.wait_for(watch.initial_metadata(), timeout=5)
        store.stuck = True
        commit = asyncio.ensure_future(
            stub.Release(pb.ReleaseRequest(session_id="p1"), timeout=10)
        )  # its group commit hangs in the store
        await assert_eventually(lambda: store.writes_while_stuck >= 1, timeout_s=3)
        started = time.monotonic()
        await asyncio.wait_for(running.stop(), timeout=8)
        stopped = True
        elapsed = time.monotonic() - started
        assert elapsed < 2.0 + 2.0 + 1.0  # the term's bound, then the gRPC server's own grace
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while True:
                update = await asyncio.wait_for(held.read(), timeout=5)
                assert update.HasField("held")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        try:  # the WatchEvents stream ended (closed by the term's end, or cancelled by the server's stop)
            async with asyncio.timeout(5):
                async for _ in watch:
                    pass
        except grpc.aio.AioRpcError:
            pass
        with pytest.raises(grpc.aio.AioRpcError):
            await commit
        writes = store.writes_while_stuck
        await asyncio.sleep(0.3)
        assert store.writes_while_stuck == writes
    finally:
        await channel.close()
        if not stopped:
            store.stuck = False
