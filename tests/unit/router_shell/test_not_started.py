"""A turn that never reached a worker is not counted: the router completes it `NOT_STARTED` (the scheduler
rolls the admission back), never `CANCELLED` or `FAILED`, whether its client left while it was being
admitted or no worker could take it once admitted. A turn whose request went to a worker keeps its outcome."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from bandmaster.scheduler.v1 import scheduler_pb2 as spb
from services.router.adapters.scheduler import _OUTCOME_TO_PROTO
from services.router.core.outcome import Outcome
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL
from tests.support.router_inprocess import InProcessRouter

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def _chat(router, session: str, *, stream: bool = False) -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        async with s.post(
            router.url + "/v1/chat/completions",
            json={**CHAT, "stream": stream},
            headers={"X-Dynamo-Session-ID": session},
        ) as r:
            await r.read()
            return r.status


def _outcomes(router) -> list[int | None]:
    """The outcome each admitted turn was completed with, in the order of admission (None: not yet)."""
    done = {c.request_id: c.outcome for c in router.sched.of("Complete")}
    return [done.get(a.request_id) for a in router.sched.of("Admit")]


def test_every_outcome_reaches_the_scheduler_as_its_own_value():
    assert set(_OUTCOME_TO_PROTO) == set(Outcome)
    assert _OUTCOME_TO_PROTO[Outcome.NOT_STARTED] == spb.TURN_OUTCOME_NOT_STARTED


async def test_a_client_that_leaves_while_its_turn_is_held_is_completed_not_started():
    r = await InProcessRouter.start(["ok"])
    r.sched.hold.add("paused")
    try:
        call = asyncio.ensure_future(_chat(r, "paused", stream=True))
        await assert_eventually(lambda: r.sched.of("Admit"))  # the router is in Admit, held
        call.cancel()  # the client leaves
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await assert_eventually(lambda: _outcomes(r) == [spb.TURN_OUTCOME_NOT_STARTED])
        assert r.workers[0].requests == 0
    finally:
        r.sched.hold.clear()
        await r.close()


async def test_an_admitted_turn_no_worker_could_take_is_completed_not_started():
    r = await InProcessRouter.start(["refuse"], worker_failure_threshold=1, worker_eject_seconds=5)
    try:
        assert await _chat(r, "p") == 502  # sent to the worker, which failed: FAILED, and out of rotation
        assert await _chat(r, "p") == 503  # admitted, then no worker in rotation: never sent
        await assert_eventually(lambda: _outcomes(r) == [spb.TURN_OUTCOME_FAILED, spb.TURN_OUTCOME_NOT_STARTED])
        assert r.workers[0].requests == 1
    finally:
        await r.close()


async def test_a_client_that_leaves_once_its_request_reached_a_worker_is_cancelled():
    r = await InProcessRouter.start(["hang"])
    try:
        call = asyncio.ensure_future(_chat(r, "p"))
        await assert_eventually(lambda: r.workers[0].requests == 1)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await assert_eventually(lambda: _outcomes(r) == [spb.TURN_OUTCOME_CANCELLED])
    finally:
        await r.close()
