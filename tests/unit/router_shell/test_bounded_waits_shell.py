"""Bounded waits (issue 21) against an in-process router and scripted workers: a turn that has sent nothing
fails over when its worker, past the turn's answer deadline, misses a health probe, and at once when the
fleet view drops the worker; a slow worker that answers its probe keeps its turn; one Complete per turn
names the worker that answered. Also the shared health probe and the context-length refusal's switch."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web

from bandmaster.scheduler.v1 import scheduler_pb2 as spb
from services.router.core.types import Replica, WorkerView
from services.router.workers.health import WorkerProbes
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL, FaultyWorker
from tests.support.router_inprocess import InProcessRouter

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
FAST = dict(failover_floor_seconds=0.2, failover_probe_timeout_seconds=0.2)


@pytest.fixture
def frozen_health(monkeypatch):
    """Workers whose `frozen` attribute is set do not answer /health (a SIGSTOPped process answers nothing)."""

    async def health(self, request):
        if getattr(self, "frozen", False):
            await self.gate.wait()  # until the test closes it
        return web.Response(status=200)

    monkeypatch.setattr(FaultyWorker, "_health", health)


async def _chat(router, *, stream: bool, session: str = "p", timeout_s: float = 20) -> tuple[int, bytes, float]:
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
        async with s.post(
            router.url + "/v1/chat/completions",
            json={**CHAT, "stream": stream},
            headers={"X-Dynamo-Session-ID": session},
        ) as r:
            return r.status, await r.read(), time.monotonic() - started


async def _one_complete(r: InProcessRouter) -> spb.CompleteRequest:
    done = await assert_eventually(lambda: r.sched.of("Complete"))
    await asyncio.sleep(0.1)  # a second one would have come by now
    assert len(r.sched.of("Complete")) == 1, r.sched.of("Complete")
    return done[0]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non_streamed"])
async def test_a_worker_that_misses_its_probe_past_the_deadline_loses_the_turn(frozen_health, stream):
    r = await InProcessRouter.start(["stall" if stream else "hang", "ok"], **FAST)
    r.workers[0].frozen = True
    r.sched.pin = ("w0", 0)  # the first attempt goes to the frozen worker
    try:
        status, raw, elapsed = await _chat(r, stream=stream)
        assert status == 200
        assert b"partial" in raw if stream else json.loads(raw)["choices"][0]["message"]["content"] == "ok ok"
        assert 0.4 <= elapsed < 3.0, elapsed  # deadline 0.2 s (+ a 2-token prompt) + probe 0.2 s; slack for load
        assert r.workers[0].requests == 1 and r.workers[1].requests == 1
        assert r.sample("bandmaster_router_retries_total") == 1
        assert r.sample("bandmaster_router_upstream_errors_total", kind="WorkerUnresponsive", phase="connect") == 1
        complete = await _one_complete(r)
        assert complete.worker_id == "w1" and complete.outcome == spb.TURN_OUTCOME_OK
    finally:
        await r.close()


async def test_a_slow_worker_that_answers_its_probe_keeps_the_turn(frozen_health):
    r = await InProcessRouter.start(["stall", "ok"], upstream_first_token_timeout_seconds=5, **FAST)
    r.sched.pin = ("w0", 0)
    try:
        asyncio.get_running_loop().call_later(1.0, r.workers[0].gate.set)  # a long prefill, well past 0.2 s
        status, raw, elapsed = await _chat(r, stream=True)
        assert status == 200 and b"partial" in raw and 1.0 <= elapsed < 4.0
        assert r.workers[1].requests == 0 and r.sample("bandmaster_router_retries_total") == 0
        assert (await _one_complete(r)).worker_id == "w0"
    finally:
        await r.close()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non_streamed"])
async def test_a_worker_dropped_from_the_fleet_gives_up_its_turns_at_once(stream):
    # Deadline 30 s: only the fleet view (capacity's verdict) can move the turn.
    r = await InProcessRouter.start(["stall" if stream else "hang", "ok"], failover_floor_seconds=30)
    r.sched.pin = ("w0", 0)
    try:
        turn = asyncio.create_task(_chat(r, stream=stream))
        await assert_eventually(lambda: r.workers[0].requests == 1)
        await asyncio.sleep(0.2)
        dropped_at = time.monotonic()
        r.set_workers([1])  # capacity marked w0 unhealthy
        status, raw, _ = await turn
        assert status == 200 and time.monotonic() - dropped_at < 2.0  # at once (the deadline is 30 s)
        assert r.workers[1].requests == 1
        assert r.sample("bandmaster_router_upstream_errors_total", kind="WorkerEvacuated", phase="connect") == 1
        complete = await _one_complete(r)
        assert complete.worker_id == "w1" and complete.outcome == spb.TURN_OUTCOME_OK
    finally:
        await r.close()


async def test_a_dropped_worker_keeps_its_turn_when_no_other_can_take_it():
    r = await InProcessRouter.start(["hang"], failover_floor_seconds=30)
    try:
        turn = asyncio.create_task(_chat(r, stream=False))
        await assert_eventually(lambda: r.workers[0].requests == 1)
        r.running.fleet.update({})  # the only worker marked unhealthy: nowhere to go
        await asyncio.sleep(0.2)
        assert not turn.done()
        r.workers[0].gate.set()  # it recovers: the turn it kept is answered
        status, _, _ = await turn
        assert status == 200 and r.sample("bandmaster_router_retries_total") == 0
    finally:
        await r.close()


async def test_probes_are_shared_per_worker_and_reused_while_fresh():
    calls: list[str] = []
    answer = asyncio.Event()
    now = [0.0]

    async def probe(url: str) -> bool:
        calls.append(url)
        await answer.wait()
        return True

    probes = WorkerProbes(probe, fresh_s=1.0, clock=lambda: now[0])
    asking = [asyncio.create_task(probes.alive("w", "http://w")) for _ in range(5)]
    await asyncio.sleep(0.01)
    asking[0].cancel()  # one asker leaving does not cancel the probe the others wait on
    answer.set()
    assert await asyncio.gather(*asking[1:]) == [True] * 4 and calls == ["http://w"]
    now[0] = 0.5
    assert await probes.alive("w", "http://w") and len(calls) == 1  # fresh: reused
    now[0] = 1.5
    assert await probes.alive("w", "http://w") and len(calls) == 2  # stale: asked again


async def test_the_context_check_refuses_before_admit_and_can_be_turned_off():
    for check in (True, False):
        r = await InProcessRouter.start(["ok"], context_length_check=check)
        r.running.fleet.update({"w0": WorkerView("w0", r.workers[0].url, MODEL, 16, (Replica("w0", 0),), 100)})
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(
                    r.url + "/v1/completions",
                    json={"model": MODEL, "prompt": [5] * 100, "max_tokens": 2},
                    headers={"X-Dynamo-Session-ID": "p"},
                ) as resp:
                    status, body = resp.status, await resp.json()
            if check:
                assert status == 400 and body["error"]["code"] == "context_length_exceeded"
                assert "has 100 tokens" in body["error"]["message"] and not r.sched.of("Admit")
            else:
                assert status == 200 and r.workers[0].requests == 1  # the worker decides
        finally:
            await r.close()
