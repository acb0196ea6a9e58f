"""A graceful SIGTERM of the leading scheduler (Redis store, a standby beside it) ends the process within
its shutdown bound while it holds Admits, streams WatchEvents to a subscriber and has a decision waiting
for its group commit: the held calls are answered UNAVAILABLE, the stream ends, the term ends and the
standby takes over (docs/benchmarks/chaos.md, defect 5: such a leader hung past 20 s)."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from tests.faults.support import Client, ScriptedCapacity, start_scheduler
from tests.support.eventually import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
GRACE_S = 1.0  # start_scheduler's --shutdown-grace-seconds
EXIT_BOUND_S = 2 * GRACE_S + 2.0  # the term's stop bound, the gRPC server's grace, the interpreter's exit


async def _role(client: Client) -> str:
    return (await client.stub.GetLeadership(pb.GetLeadershipRequest(), timeout=2)).role


async def test_a_sigtermed_leader_with_held_admits_and_a_watcher_exits_within_the_bound(tmp_path, redis_server):
    capacity = ScriptedCapacity({("w1", 0): 1_000})
    await capacity.start()
    flags = ["--leader-election", "--state-redis-url", redis_server.url]
    procs = []
    clients: list[Client] = []
    try:
        for name in ("scheduler-a", "scheduler-b"):
            procs.append(await start_scheduler(tmp_path, capacity.address, *flags, name=name))
            clients.append(Client.connect(procs[-1].ready["grpc"]))

        async def one_leader() -> bool:
            return sorted([await _role(c) for c in clients]) == ["leader", "standby"]

        await assert_eventually(one_leader, timeout_s=10)
        index = 0 if await _role(clients[0]) == "leader" else 1
        leader, client = procs[index], clients[index]
        standby = clients[1 - index]
        await client.wait_replicas(1)
        # p1's turn in flight fills the replica: new programs are held at admission. (A completed turn
        # would leave p1 ACTING above the pause threshold, and a tick before the Admits below would
        # pause it and make room for them.)
        await client.stub.Admit(
            pb.AdmitRequest(session_id="p1", request_id="r1", estimated_prompt_tokens=800), timeout=5
        )
        held = [
            client.stub.AdmitStream(
                pb.AdmitRequest(session_id=f"q{i}", request_id=f"q{i}-1", estimated_prompt_tokens=500)
            )
            for i in range(3)
        ]
        for call in held:
            first = await asyncio.wait_for(call.read(), timeout=5)
            assert first.HasField("held")
        watch = client.stub.WatchEvents(pb.WatchEventsRequest())
        await asyncio.wait_for(watch.initial_metadata(), timeout=5)
        release = asyncio.ensure_future(client.stub.Release(pb.ReleaseRequest(session_id="p1"), timeout=10))

        sent = time.monotonic()
        leader.send_signal(signal.SIGTERM)
        code = await leader.wait_exit_async(timeout_s=EXIT_BOUND_S + 5)
        exit_s = time.monotonic() - sent
        log = leader.log_text()
        assert exit_s <= EXIT_BOUND_S, f"exit took {exit_s:.2f}s\n{leader.log_tail()}"
        assert code == 0, leader.log_tail()
        assert "term of epoch" in log and "scheduler stopped" in log, leader.log_tail()

        for call in held:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while True:
                    update = await asyncio.wait_for(call.read(), timeout=5)
                    assert update.HasField("held")
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        try:  # ended by the term's end (OK) or by the server going away
            async with asyncio.timeout(5):
                async for _ in watch:
                    pass
        except grpc.aio.AioRpcError:
            pass
        try:
            await asyncio.wait_for(release, timeout=5)
        except grpc.aio.AioRpcError:
            pass  # answered before the stop, or refused by it: never left hanging

        async def standby_leads() -> bool:
            return await _role(standby) == "leader"

        await assert_eventually(standby_leads, timeout_s=5)
        print(f"\nleader SIGTERM -> exit {exit_s:.2f}s")
    finally:
        for c in clients:
            await c.close()
        for proc in procs:
            await proc.stop_async()
        await capacity.stop()
