"""The capacity service itself frozen (SIGSTOP) or killed (SIGKILL) and restarted, under a running
fleet: turns keep flowing on the last known worker set within a bound, no stream is dropped, and
once capacity is back the router and the scheduler follow its new snapshot (a worker added while
it was down is routed to)."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from openai import AsyncOpenAI

from clients import session_headers
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL

pytestmark = pytest.mark.integration

TURN_BOUND_S = 5.0


async def _turn(url: str, sid: str, i: int) -> float:
    client = AsyncOpenAI(
        base_url=url + "/v1", api_key="none", max_retries=0, timeout=30, default_headers=session_headers(sid)
    )
    started = time.monotonic()
    stream = await client.chat.completions.create(
        model=MODEL, max_tokens=8, stream=True, messages=[{"role": "user", "content": f"turn {i} of {sid}"}]
    )
    text, finished = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finished = chunk.choices[0].finish_reason or finished
    assert text and finished in ("stop", "length"), (text, finished)  # the stream ended properly
    return time.monotonic() - started


async def _turns(url: str, tag: str) -> list[float]:
    return await asyncio.wait_for(
        asyncio.gather(*(_turn(url, f"{tag}-{p}", i) for p in range(3) for i in range(2))), 30
    )


async def test_capacity_frozen_then_killed_and_restarted(tmp_path):
    st = stack.Stack(tmp_path)
    cap = None
    try:
        w1 = st.add(await stack.simworker(tmp_path, "w1"))
        w2 = st.add(await stack.simworker(tmp_path, "w2"))
        port = stack.free_port()
        cap = st.add(await stack.capacity(tmp_path, [w1.ready["url"]], "--listen", f"127.0.0.1:{port}"))
        addr = f"127.0.0.1:{port}"
        sched = st.add(await stack.scheduler(tmp_path, addr))
        router = st.add(await stack.router(tmp_path, addr, scheduler_addr=sched.ready["grpc"]))
        url = stack.router_url(router)
        await assert_eventually(lambda: _turn(url, "warm", 0), timeout_s=20, interval_s=0.2)
        assert await stack.metric(url, "bandmaster_router_workers") == 1

        # Frozen: the fleet keeps serving on the snapshot it has.
        cap.send_signal(signal.SIGSTOP)
        try:
            assert max(await _turns(url, "frozen")) < TURN_BOUND_S
        finally:
            cap.send_signal(signal.SIGCONT)
        assert max(await _turns(url, "thawed")) < TURN_BOUND_S

        # Killed: the same, and nothing waits on the dead service.
        cap.kill()
        await cap.wait_exit_async()
        st.procs.remove(cap)
        assert max(await _turns(url, "down")) < TURN_BOUND_S

        # Restarted on the same address with a second worker: the router and the scheduler reconnect
        # and follow the new snapshot.
        cap = st.add(await stack.capacity(tmp_path, [w1.ready["url"], w2.ready["url"]], "--listen", addr))

        async def both_workers_known():
            return await stack.metric(url, "bandmaster_router_workers") == 2

        await assert_eventually(both_workers_known, timeout_s=30, interval_s=0.3)
        assert max(await _turns(url, "back")) < TURN_BOUND_S

        async def new_worker_serves():
            await _turn(url, f"spread-{time.monotonic()}", 0)
            return await _served_by(w2)

        await assert_eventually(new_worker_serves, timeout_s=30, interval_s=0.2)
    finally:
        if cap is not None and cap.returncode is None:
            cap.send_signal(signal.SIGCONT)
        await st.close()


async def _served_by(worker: stack.Process) -> bool:
    """True once `worker` has served at least one request (its prompt-token counter moved)."""
    return await stack.metric(worker.ready["url"], "sglang:prompt_tokens_total") > 0
