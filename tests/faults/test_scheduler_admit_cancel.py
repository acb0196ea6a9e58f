"""Cancelling many held Admits at once, against a real scheduler process.

The protocol: cancelling every waiting Admit of a program leaves the table exactly as it was. Each
cancelled call must be rolled back when it is cancelled, not when its deadline would have passed.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from tests.faults.support import Client, start_scheduler, table
from tests.support.eventually import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def _paused_program(client: Client) -> None:
    """`b` (800 tokens) paused behind `a` (9,000) on one replica of 10,000 tokens."""
    await client.wait_replicas(1)
    await client.turn("a", "a-1", 9_000)
    await client.turn("b", "b-1", 800)

    async def paused():
        return (await client.programs())["b"].lifecycle == pb.LIFECYCLE_PAUSED

    await assert_eventually(paused, timeout_s=10)


async def _cancel_storm(client: Client, sids: list[str], calls: int, cancel_after_s: float, tag: str) -> None:
    """`calls` concurrent Admits (30 s deadline) spread over `sids`, all cancelled after `cancel_after_s`."""
    pending = [
        client.stub.Admit(
            pb.AdmitRequest(session_id=sids[i % len(sids)], request_id=f"{tag}-{i}", estimated_prompt_tokens=50),
            timeout=30,
        )
        for i in range(calls)
    ]
    tasks = [asyncio.ensure_future(call) for call in pending]
    await asyncio.sleep(cancel_after_s)
    for call in pending:
        call.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, (asyncio.CancelledError, grpc.aio.AioRpcError)) for r in results)


async def test_cancelling_many_held_admits_leaves_the_table_as_it_was(tmp_path, scripted_capacity):
    sched = await start_scheduler(tmp_path, scripted_capacity.address, "--pause-target", "0.92")
    client = Client.connect(sched.ready["grpc"])
    try:
        await _paused_program(client)
        before = table(await client.programs())
        for round_, cancel_after_s in enumerate((0.05, 1.0, 0.3, 1.0)):
            await _cancel_storm(client, ["b"], 1_250, cancel_after_s, f"r{round_}")

            # Rolled back as the calls are cancelled: well before their 30 s deadline.
            async def settled():
                stats = await client.stats()
                assert stats.waiting_admissions == 0, stats.waiting_admissions
                assert table(await client.programs()) == before
                return True

            await assert_eventually(settled, timeout_s=5)
        stats = await client.stats()
        assert stats.admissions_cancelled_total == stats.admissions_total - 2  # all but a-1 and b-1
    finally:
        await client.close()
        await sched.stop_async()


async def test_cancelling_held_admits_over_several_programs_leaves_no_trace(tmp_path, scripted_capacity):
    sched = await start_scheduler(tmp_path, scripted_capacity.address)
    client = Client.connect(sched.ready["grpc"])
    try:
        await client.wait_replicas(1)
        # A turn in flight that fills the replica (marked, never paused): every new program queues.
        await client.turn("big", "big-1", 9_000)
        await client.stub.Admit(
            pb.AdmitRequest(session_id="big", request_id="big-2", estimated_prompt_tokens=9_800), timeout=5
        )
        before = table(await client.programs())
        await _cancel_storm(client, [f"new{i}" for i in range(4)], 2_000, 1.0, "n")

        async def settled():
            stats = await client.stats()
            assert stats.waiting_admissions == 0 and stats.programs_paused == 0
            assert table(await client.programs()) == before
            return True

        await assert_eventually(settled, timeout_s=5)
    finally:
        await client.close()
        await sched.stop_async()
