"""Issue 21, "a router killed between Bind and its 200: phantom turn". A router SIGKILLed while its turn
waits for a frozen worker's first byte (its lease renewed meanwhile, its worker bound) leaves a client
that got no response and retries the turn: the scheduler must roll the turn back when its lease lapses,
so that the program's turns equal the client's. (Before the fix a renewal or a Bind confirmed the ticket
and the lapse ended it as CANCELLED, counted.)"""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from clients import session_headers
from tests.faults.support import Client, start_scheduler
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
LEASE_S = 3.0  # renewed every second
TICK_S = 0.1
MODEL = "bandmaster-sim"


async def _turn(url: str, sid: str) -> int:
    body = {"model": MODEL, "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": "hi " * 30}]}
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        async with s.post(url + "/v1/chat/completions", json=body, headers=session_headers(sid)) as r:
            await r.read()
            return r.status


async def test_a_router_killed_before_its_clients_first_byte_leaves_no_phantom_turn(tmp_path):
    st = stack.Stack(tmp_path)
    client = None
    worker = None
    try:
        worker = st.add(
            await stack.spawn(
                "simworker",
                "services.simworker",
                ["--port", "0", "--speedup", "1", "--max-total-tokens", "65536", "--served-model-name", MODEL],
                tmp_path,
            )
        )
        cap = st.add(await stack.capacity(tmp_path, [worker.ready["url"]]))
        sched = st.add(
            await start_scheduler(
                tmp_path,
                cap.ready["grpc"],
                "--ticket-lease-seconds",
                str(LEASE_S),
                "--scheduler-interval-seconds",
                str(TICK_S),
            )
        )
        router = st.add(
            await stack.router(tmp_path, cap.ready["grpc"], "--no-use-kv-events", scheduler_addr=sched.ready["grpc"])
        )
        client = Client.connect(sched.ready["grpc"])
        await client.wait_replicas(1)
        url = stack.router_url(router)
        await stack.healthy_workers(url, 1)

        assert await _turn(url, "prog-frozen") == 200  # the client's turn 1
        worker.send_signal(signal.SIGSTOP)  # the worker will not send turn 2's first byte
        turn2 = asyncio.ensure_future(_turn(url, "prog-frozen"))
        await asyncio.sleep(LEASE_S * 0.8)  # the router renews turn 2's lease at least once meanwhile
        program = await client.stub.GetProgram(pb.GetProgramRequest(session_id="prog-frozen"), timeout=5)
        assert program.turns == 2 and program.status == pb.PROGRAM_STATUS_REASONING
        router.kill()
        outcome = (await asyncio.gather(turn2, return_exceptions=True))[0]
        assert isinstance(outcome, aiohttp.ClientError), outcome  # no response at all: the client retries

        async def settled():
            stats = await client.stats()
            return stats.tickets_in_flight == 0 and stats.tickets_expired_total == 1

        await assert_eventually(settled, timeout_s=LEASE_S + 10, interval_s=0.1)
        program = await client.stub.GetProgram(pb.GetProgramRequest(session_id="prog-frozen"), timeout=5)
        assert program.turns == 1, "the scheduler counts a turn its client never received"
        assert program.status == pb.PROGRAM_STATUS_ACTING
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGCONT)
        if client is not None:
            await client.close()
        await st.close()
