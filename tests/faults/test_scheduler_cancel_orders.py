"""Phantom admissions (issue 21): a paused program with a held Admit and thousands more queued behind
it, all cancelled while the program is being resumed, in every order (held first, queued first, the
channel closed, the caller SIGKILLed). Against a real scheduler process.

The resume is what turns a late-seen cancel into a phantom: once the program runs again, every queued
call is answered at once, and a call whose cancel was still in gRPC's queue used to be admitted and
counted anyway. Now an answer that cannot be delivered rolls its admission back, and one that left
just as its call was cancelled is rolled back when its lease lapses unconfirmed.

Invariant after each storm: the program's turns, status and tokens, the other program's whole row,
the tickets in flight and the held admissions are what they were before it (the resume itself, which
capacity caused, is the only change); and once the capacity is as it was, the whole table is.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from tests.faults.conftest import W
from tests.faults.support import Client, start_scheduler, table
from tests.support import processes
from tests.support.eventually import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LEASE_S = 2.0  # the unconfirmed-answer backstop acts within a lease and a tick
STORM = 500
BIG_STORM = 5_000
ORDERS = ("held_first", "queued_first", "channel_closed", "caller_killed")


async def _paused_program(client: Client) -> None:
    """`b` (800 tokens) paused behind `a` (9,000) on one replica of 10,000 tokens."""
    await client.wait_replicas(1)
    await client.turn("a", "a-1", 9_000)
    await client.turn("b", "b-1", 800)

    async def paused():
        return (await client.programs())["b"].lifecycle == pb.LIFECYCLE_PAUSED

    await assert_eventually(paused, timeout_s=10)


def _invariant(programs: dict[str, pb.Program], stats: pb.Stats) -> tuple:
    """What a storm of cancelled calls must not change (b's lifecycle and placement are the resume's)."""
    rows = table(programs)
    b = programs["b"]
    return rows["a"], (b.status, b.token_total, b.turns, b.parent_session_id), stats.tickets_in_flight


def _call(stub, request_id: str, stream: bool):
    request = pb.AdmitRequest(session_id="b", request_id=request_id, estimated_prompt_tokens=50)
    return (stub.AdmitStream if stream else stub.Admit)(request, timeout=60)


async def _drain(call):
    if isinstance(call, grpc.aio.UnaryStreamCall):
        return [update async for update in call]
    return await call


async def _storm_in_process(address: str, order: str, calls: int, resume) -> None:
    storm = Client.connect(address)
    try:
        held = _call(storm.stub, "held", False)
        held_task = asyncio.ensure_future(_drain(held))
        await asyncio.sleep(0.5)
        queued = [_call(storm.stub, f"q{i}", i % 2 == 1) for i in range(calls)]
        tasks = [asyncio.ensure_future(_drain(call)) for call in queued]
        await asyncio.sleep(1.0)  # the queue forms behind the held call
        resume()
        await asyncio.sleep(0.05)
        if order == "held_first":
            held.cancel()
            for call in queued:
                call.cancel()
        elif order == "queued_first":
            for call in queued:
                call.cancel()
            held.cancel()
        else:
            await storm.close()
        await asyncio.gather(held_task, *tasks, return_exceptions=True)
    finally:
        await storm.close()


async def _storm_killed(address: str, calls: int, resume, tmp_path) -> None:
    client = processes.start(
        "storm-client",
        [
            sys.executable,
            "-m",
            "tests.faults.admit_storm_client",
            "--address",
            address,
            "--session-id",
            "b",
            "--calls",
            str(calls),
            "--tag",
            "k",
        ],
        tmp_path,
    )
    try:
        await client.wait_for_log_async("sent", timeout_s=60)
        await asyncio.sleep(1.0)  # the queue forms behind the held call
        resume()
        await asyncio.sleep(0.05)
        os.kill(client.pid, signal.SIGKILL)
        await client.wait_exit_async(timeout_s=10)
    finally:
        client.stop()


async def _run(tmp_path, scripted_capacity, order: str, calls: int) -> None:
    sched = await start_scheduler(
        tmp_path, scripted_capacity.address, "--pause-target", "0.92", "--ticket-lease-seconds", str(LEASE_S)
    )
    client = Client.connect(sched.ready["grpc"])
    try:
        await _paused_program(client)
        before = _invariant(await client.programs(), await client.stats())
        table_before = table(await client.programs())

        def resume():
            scripted_capacity.set({W: 40_000})  # room for b: the next tick resumes it

        if order == "caller_killed":
            await _storm_killed(sched.ready["grpc"], calls, resume, tmp_path)
        else:
            # An answer that reached the client before its cancel did is a ticket nobody confirms (no
            # RenewLeases, Bind or Complete follows): it lapses and is rolled back like the rest.
            await _storm_in_process(sched.ready["grpc"], order, calls, resume)

        async def settled():
            stats = await client.stats()
            assert stats.waiting_admissions == 0
            assert _invariant(await client.programs(), stats) == before
            return True

        # Within one lease and a few ticks: answers that left as their call was cancelled lapse unconfirmed.
        await assert_eventually(settled, timeout_s=LEASE_S + 10)
        # And with the capacity as it was, the control law pauses b again: the whole table is as before.
        scripted_capacity.set({W: 10_000})

        async def as_before():
            stats = await client.stats()
            assert table(await client.programs()) == table_before and stats.tickets_in_flight == 0
            return True

        await assert_eventually(as_before, timeout_s=10)
    finally:
        await client.close()
        await sched.stop_async()


@pytest.mark.parametrize("order", ORDERS)
async def test_a_cancel_storm_leaves_no_phantom_turn(tmp_path, scripted_capacity, order):
    await _run(tmp_path, scripted_capacity, order, STORM)


@pytest.mark.slow
@pytest.mark.parametrize("order", ORDERS)
async def test_a_5000_call_cancel_storm_leaves_no_phantom_turn(tmp_path, scripted_capacity, order):
    await _run(tmp_path, scripted_capacity, order, BIG_STORM)
