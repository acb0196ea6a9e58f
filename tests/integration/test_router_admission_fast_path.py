"""Issue 20 item 4, the admission fast path, in process: a router against the real scheduler servicer (fake
clock, scripted capacity) and a simworker. A later turn of an ACTIVE program starts on its cached admission
without waiting for Admit (here the scheduler's answers are held back: the turn's first token arrives
first), and the scheduler still counts every turn the client ran; a pause event takes the fast path away
from that program (its next turn is held as usual)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import grpc
import pytest

from clients import session_headers
from services.router.config import KvOverrides, RouterConfig
from services.router.server import start_router
from services.scheduler.election import SingleReplica
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL
from tests.unit.scheduler_shell.support import start_harness

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


async def _first_token(url: str, sid: str, done: asyncio.Event | None = None) -> tuple[asyncio.Future, asyncio.Event]:
    first = asyncio.Event()

    async def turn() -> int:
        body = {
            "model": MODEL,
            "stream": True,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "tell me " * 20}],
        }
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json=body, headers=session_headers(sid)) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data:"):
                        first.set()
                return r.status

    return asyncio.ensure_future(turn()), first


async def _cluster(tmp_path, st):
    h = await start_harness(ticket_lease_seconds=30.0, resume_timeout_seconds=60.0)
    w = st.add(await stack.simworker(tmp_path, "w"))
    cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
    router = await start_router(
        RouterConfig(
            capacity_addr=cap.ready["grpc"],
            scheduler_addr=h.running.address,
            kv=KvOverrides(use_kv_events=False),
            listen="127.0.0.1:0",
            http_port=0,
            metrics_port=-1,
        )
    )
    workers = await assert_eventually(lambda: router.fleet.workers)
    worker_id = next(iter(workers))
    await h.set_capacity({(worker_id, 0): 1_000_000})
    await assert_eventually(lambda: router.runner.scheduler.cache.live)
    return h, router, worker_id


def _fast_turns(router) -> float:
    return router.metrics.admission_fast_path._value.get()


def _failed_open(router) -> float:
    return sum(
        sample.value
        for metric in router.metrics.fail_open.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


async def test_a_later_turn_starts_before_its_admit_answers_and_is_still_counted(tmp_path, monkeypatch):
    st = stack.Stack(tmp_path)
    h = router = None
    try:
        h, router, worker_id = await _cluster(tmp_path, st)
        url = router.base_url
        turn, _ = await _first_token(url, "prog")
        assert await turn == 200  # the first turn: the normal path, its admission cached
        await assert_eventually(lambda: h.core.program("prog").turns == 1)

        gate = asyncio.Event()
        blocked = []
        original = SingleReplica.commit

        async def slow_commit(self, runtime):
            blocked.append(1)
            await gate.wait()
            return await original(self, runtime)

        monkeypatch.setattr(SingleReplica, "commit", slow_commit)
        turn, first = await _first_token(url, "prog")
        await asyncio.wait_for(first.wait(), 20)
        assert blocked and not gate.is_set(), "the first token came while the scheduler held its Admit answer"
        assert _fast_turns(router) == 1 and _failed_open(router) == 0  # not a fail-open after the decision deadline
        assert await turn == 200  # the client has its whole answer; its Admit is still unanswered
        # One Admit in flight per program: the next turn takes the normal path (else a program whose turns
        # end before their Admits answer would pile Admits up at the scheduler).
        turn3, first3 = await _first_token(url, "prog")
        await asyncio.sleep(0.3)
        assert _fast_turns(router) == 1 and not first3.is_set()
        gate.set()
        assert await turn3 == 200

        async def counted():
            view = h.core.program("prog")
            stats = h.core.stats(h.clock.monotonic())
            return view.turns == 3 and stats.tickets_in_flight == 0 and stats.completes_ignored_total == 0

        await assert_eventually(counted, timeout_s=10)
    finally:
        if router is not None:
            await router.stop()
        await st.close()
        if h is not None:
            await h.channel.close()
            await h.running.stop()


async def test_a_pause_event_takes_the_fast_path_away_from_that_program(tmp_path):
    st = stack.Stack(tmp_path)
    h = router = None
    try:
        h, router, worker_id = await _cluster(tmp_path, st)
        url = router.base_url
        for sid in ("prog", "other"):
            turn, _ = await _first_token(url, sid)
            assert await turn == 200
        await assert_eventually(lambda: h.core.program("prog").turns == 1 and h.core.program("other").turns == 1)
        cache = router.runner.scheduler.cache
        assert cache.get(time.monotonic(), "prog") is not None

        # Pressure: the capacity shrinks below both programs; the tick pauses them at their tool boundary.
        await h.set_capacity({(worker_id, 0): 100})
        h.tick()
        assert h.core.program("prog").lifecycle.value == "paused"
        await assert_eventually(lambda: cache.get(time.monotonic(), "prog") is None)

        before = _fast_turns(router)
        turn, first = await _first_token(url, "prog")
        await h.held(1)  # the normal path: held while paused
        assert _fast_turns(router) == before and not first.is_set()
        await h.set_capacity({(worker_id, 0): 1_000_000})
        h.tick()  # room again: resumed, the held turn goes
        assert await asyncio.wait_for(turn, 20) == 200
        program = await h.program("prog")
        assert program.turns == 2
    finally:
        if router is not None:
            await router.stop()
        await st.close()
        if h is not None:
            await h.channel.close()
            await h.running.stop()


# -- the scheduler must still learn every turn (docs/benchmarks/chaos.md, defect 6) ---------------------


async def _fast_cluster(tmp_path, st):
    """A cluster whose program "prog" ran one turn (the normal path, its admission cached)."""
    h, router, worker_id = await _cluster(tmp_path, st)
    turn, _ = await _first_token(router.base_url, "prog")
    assert await turn == 200
    await assert_eventually(lambda: h.core.program("prog").turns == 1)
    await assert_eventually(lambda: router.runner.scheduler.cache.get(time.monotonic(), "prog") is not None)
    return h, router


async def _all_counted(h, turns: int) -> None:
    async def counted():
        stats = h.core.stats(h.clock.monotonic())
        return h.core.program("prog").turns == turns and stats.tickets_in_flight == 0

    await assert_eventually(counted, timeout_s=15)


async def _stop(router, st, h) -> None:
    if router is not None:
        await router.stop()
    await st.close()
    if h is not None:
        await h.channel.close()
        await h.running.stop()


async def test_a_transient_unavailable_on_the_background_admit_is_tried_again(tmp_path, monkeypatch):
    """One scheduler address (no failover bound for a waiting client's Admit): the background Admit of a
    fast-path turn meets UNAVAILABLE once (a connection reset); it tries again, and the turn is counted."""
    from services.router.adapters.scheduler import SchedulerClient

    st = stack.Stack(tmp_path)
    h = router = None
    try:
        h, router = await _fast_cluster(tmp_path, st)
        original = SchedulerClient._admit_once
        failed = []

        async def flaky(self, address, request, request_id, **kw):
            if request.dispatched and not failed:
                failed.append(request_id)
                exc = grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "reset"
                )
                return "unreachable", None, exc
            return await original(self, address, request, request_id, **kw)

        monkeypatch.setattr(SchedulerClient, "_admit_once", flaky)
        turn, _ = await _first_token(router.base_url, "prog")
        assert await turn == 200
        assert failed and _fast_turns(router) == 1
        await _all_counted(h, 2)  # the client ran 2 turns
        assert _failed_open(router) == 0
    finally:
        await _stop(router, st, h)


async def test_a_fast_path_admit_goes_after_the_previous_turns_complete(tmp_path, monkeypatch):
    """The client starts its next turn as the previous one ends; that turn's Complete is still on its way
    (held back here) when the fast path starts the next: its Admit reaches the scheduler after it."""
    from services.router.adapters.scheduler import SchedulerClient

    st = stack.Stack(tmp_path)
    h = router = None
    try:
        h, router = await _fast_cluster(tmp_path, st)
        order: list[str] = []
        gate = asyncio.Event()
        original_complete, original_admit = SchedulerClient.complete, SchedulerClient._admit_once

        async def slow_complete(self, *args, **kw):
            await gate.wait()
            await original_complete(self, *args, **kw)
            order.append("complete")

        async def admit_once(self, address, request, request_id, **kw):
            order.append("admit-dispatched" if request.dispatched else "admit")
            return await original_admit(self, address, request, request_id, **kw)

        monkeypatch.setattr(SchedulerClient, "complete", slow_complete)
        monkeypatch.setattr(SchedulerClient, "_admit_once", admit_once)
        turn, _ = await _first_token(router.base_url, "prog")  # turn 2: fast path; its Complete held back
        assert await turn == 200
        await asyncio.sleep(0.2)
        turn, first = await _first_token(router.base_url, "prog")  # turn 3 starts while Complete 2 waits
        await asyncio.wait_for(first.wait(), 20)
        await asyncio.sleep(0.3)
        gate.set()
        assert await turn == 200
        await _all_counted(h, 3)
        assert _failed_open(router) == 0
        assert order.count("complete") == 2
        dispatched = [i for i, what in enumerate(order) if what == "admit-dispatched"]
        first_complete = order.index("complete")
        assert dispatched and all(i > first_complete for i in dispatched[1:]), order
        # (Turn 2's Admit went before anything completed; turn 3's, if it took the fast path, after.)
    finally:
        await _stop(router, st, h)


async def test_a_client_gone_right_after_a_fast_path_turn_started_is_still_counted(tmp_path, monkeypatch):
    """The client disconnects after its first token while the turn's background Admit is unanswered (the
    scheduler's answer held back): the Admit is not cancelled with the turn; the scheduler counts it."""
    st = stack.Stack(tmp_path)
    h = router = None
    try:
        h, router = await _fast_cluster(tmp_path, st)
        gate = asyncio.Event()
        original = SingleReplica.commit

        async def slow_commit(self, runtime):
            await gate.wait()
            return await original(self, runtime)

        monkeypatch.setattr(SingleReplica, "commit", slow_commit)
        body = {
            "model": MODEL,
            "stream": True,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "tell me " * 20}],
        }
        async with aiohttp.ClientSession() as s:
            async with s.post(
                router.base_url + "/v1/chat/completions", json=body, headers=session_headers("prog")
            ) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data:"):
                        break  # started: the client leaves
        assert _fast_turns(router) == 1
        await asyncio.sleep(0.5)  # the router has seen the client go
        gate.set()
        await _all_counted(h, 2)  # the client started 2 turns
        assert _failed_open(router) == 0
    finally:
        await _stop(router, st, h)


FINAL_TURN = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "the end"}]}
FINAL_WITHOUT_CONTENT = {"model": MODEL, "messages": []}


@pytest.mark.parametrize("final", [FINAL_TURN, FINAL_WITHOUT_CONTENT], ids=["final-turn", "final-without-content"])
async def test_a_final_request_releases_the_program_after_the_fast_path_admit_before_it(tmp_path, monkeypatch, final):
    """A fast-path turn whose Admit is slow to leave, then at once the final request: a final turn (the normal
    path: its Admit, Complete and the program's Release), or a final request without content (`messages: []`:
    it only releases the program). The Release reaches the scheduler after the earlier Admit, so that the
    program ends there with every turn, not re-created by a late Admit after its Release. The request without
    content was found by bench/router_memory.py: its Release went at once, before the turn's background
    Admit, which re-created the program, kept until the idle TTL (5 of 320 programs of a quick run)."""
    from services.router.adapters.scheduler import SchedulerClient

    st = stack.Stack(tmp_path)
    h = router = None
    try:
        h, router = await _fast_cluster(tmp_path, st)
        order: list[str] = []
        original_admit, original_release = SchedulerClient._admit_once, SchedulerClient.release

        async def admit_once(self, address, request, request_id, **kw):
            if request.dispatched:
                await asyncio.sleep(1.0)  # slow to leave (a loaded router)
            answer = await original_admit(self, address, request, request_id, **kw)
            order.append("admit-dispatched" if request.dispatched else "admit")
            return answer

        async def release(self, session_id):
            order.append("release")
            return await original_release(self, session_id)

        monkeypatch.setattr(SchedulerClient, "_admit_once", admit_once)
        monkeypatch.setattr(SchedulerClient, "release", release)
        turn, _ = await _first_token(router.base_url, "prog")  # turn 2: fast path
        assert await turn == 200 and _fast_turns(router) == 1
        async with aiohttp.ClientSession() as s:
            headers = session_headers("prog", final=True)
            async with s.post(router.base_url + "/v1/chat/completions", json=final, headers=headers) as r:
                assert r.status == 200
        await assert_eventually(lambda: "release" in order, timeout_s=15)
        await asyncio.sleep(0.5)
        assert order.index("release") > order.index("admit-dispatched"), order
        assert h.core.program("prog") is None  # released with its turns, not re-created by a late Admit
        assert _failed_open(router) == 0
    finally:
        await _stop(router, st, h)


async def _admission_header(url: str, sid: str, stream: bool) -> str:
    body = {"model": MODEL, "stream": stream, "max_tokens": 4, "messages": [{"role": "user", "content": "hi " * 20}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=body, headers=session_headers(sid)) as r:
            assert r.status == 200
            await r.read()
            return r.headers.get("X-Bandmaster-Admission", "")


async def test_the_client_is_told_how_its_turn_was_admitted(tmp_path):
    """X-Bandmaster-Admission: `admitted` on the normal path, `cached` on the fast path (its Admit still to
    reach the scheduler), `fail-open` when the scheduler does not answer."""
    st = stack.Stack(tmp_path)
    h = router = None
    try:
        h, router = await _fast_cluster(tmp_path, st)
        url = router.base_url
        assert await _admission_header(url, "prog", stream=True) == "cached"
        await _all_counted(h, 2)
        assert await _admission_header(url, "other", stream=False) == "admitted"
        await h.running.stop()  # the scheduler is gone: the next turns fail open
        assert await _admission_header(url, "third", stream=True) == "fail-open"
    finally:
        await _stop(router, st, h)
