"""A frozen scheduler (SIGSTOP) must not freeze the fleet: every turn, program and passthrough alike, runs
within the admission decision deadline, failing open (counted, one WARN); admission resumes once the
scheduler answers again (SIGCONT)."""

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

DECISION_S = 0.5
FAST_PATH = "bandmaster_router_admission_fast_path_total"


async def _turn(url: str, sid: str, i: int) -> float:
    client = AsyncOpenAI(
        base_url=url + "/v1",
        api_key="none",
        max_retries=0,
        timeout=30,
        default_headers=session_headers(sid) if sid else None,
    )
    started = time.monotonic()
    answer = await client.chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": f"turn {i} of {sid}"}]
    )
    assert answer.choices[0].message.content
    return time.monotonic() - started


async def test_frozen_scheduler_turns_fail_open_within_the_decision_deadline(tmp_path):
    st = stack.Stack(tmp_path)
    sched = None
    try:
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        sched = st.add(await stack.scheduler(tmp_path, cap.ready["grpc"]))
        router = st.add(
            await stack.router(
                tmp_path,
                cap.ready["grpc"],
                "--admit-decision-timeout-seconds",
                str(DECISION_S),
                "--scheduler-retry-seconds",
                "0.5",
                scheduler_addr=sched.ready["grpc"],
            )
        )
        url = stack.router_url(router)
        await assert_eventually(lambda: _turn(url, "warm", 0), timeout_s=20, interval_s=0.2)
        assert await stack.metric(url, "bandmaster_router_scheduler_fail_open_total") == 0

        # Run "warm" until one of its turns starts on its cached admission (the fast path is live once the
        # router's event stream is connected, which races the first turns), so that how its frozen turn runs
        # is fixed below, not left to that race.
        turns_done = 1

        async def warm_on_the_fast_path() -> bool:
            nonlocal turns_done
            await _turn(url, "warm", turns_done)
            turns_done += 1
            return await stack.metric(url, FAST_PATH) > 0

        await assert_eventually(warm_on_the_fast_path, timeout_s=20, interval_s=0.2)
        fast_before = await stack.metric(url, FAST_PATH)

        sched.send_signal(signal.SIGSTOP)
        # New programs and passthrough turns wait for the scheduler's answer until the deadline, then fail
        # open. "warm" is ACTIVE with a cached admission: it starts at once on it, and its Admit, sent in the
        # background, fails open on its own deadline, possibly after the turn has ended (counted then: that
        # race once made this test read 4 fail-opens of 5).
        turns = [("prog-a", 1), ("prog-b", 1), ("warm", turns_done), ("", 1), ("", 2)]
        # Before the fix each of these waited for the scheduler (an hour's deadline): bound the test instead.
        elapsed = await asyncio.wait_for(asyncio.gather(*(_turn(url, sid, i) for sid, i in turns)), 20)
        assert max(elapsed) < DECISION_S + 2.5, elapsed
        assert await stack.metric(url, FAST_PATH) == fast_before + 1

        async def all_failed_open() -> bool:
            return await stack.metric(url, "bandmaster_router_scheduler_fail_open_total") == len(turns)

        await assert_eventually(all_failed_open, timeout_s=5, interval_s=0.1)
        assert await stack.metric(url, "bandmaster_router_scheduler_reachable") == 0
        # Once known down, later turns do not wait at all.
        assert await asyncio.wait_for(_turn(url, "prog-c", 1), 10) < DECISION_S
        assert router.log_text().count("failing open") == 1

        sched.send_signal(signal.SIGCONT)

        async def admitted_again():
            await _turn(url, "prog-d", 1)
            return await stack.metric(url, "bandmaster_router_scheduler_reachable") == 1

        await assert_eventually(admitted_again, timeout_s=15, interval_s=0.3)
        assert "reachable again" in router.log_text()
    finally:
        if sched is not None:
            sched.send_signal(signal.SIGCONT)
        await st.close()
