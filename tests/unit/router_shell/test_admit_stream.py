"""The scheduler's side of the router's admission contract (`Scheduler.AdmitStream`, docs/protocols/router.md):
the first message comes at once (the decision, or `held` with the scheduler's bound on the hold), a held
call ends with the decision, and a caller that gives up rolls the admission back. Against the real
scheduler servicer on a fake clock (tests/unit/scheduler_shell/support.py)."""

from __future__ import annotations

import asyncio

import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from tests.unit.scheduler_shell.support import start_harness

W = ("w1", 0)


@pytest.fixture
async def h():
    harness = await start_harness(resume_timeout_seconds=30.0)
    await harness.set_capacity({W: 1_000})
    yield harness
    await harness.channel.close()
    await harness.running.stop()


async def _fill(h, tokens: int) -> None:
    await h.admit("big", "big-fill", 1, timeout=5)
    await h.complete("big", "big-fill", tokens, 0, *W)


def _stream(h, sid: str, rid: str, tokens: int = 100):
    return h.client.AdmitStream(
        pb.AdmitRequest(session_id=sid, request_id=rid, estimated_prompt_tokens=tokens), timeout=60
    )


async def test_an_admission_that_is_not_held_is_one_decision():
    h = await start_harness()
    try:
        await h.set_capacity({W: 10_000})
        updates = [u async for u in _stream(h, "p", "r1")]
        assert [u.WhichOneof("update") for u in updates] == ["decision"]
        assert updates[0].decision.pinned and updates[0].decision.worker_id == "w1"
    finally:
        await h.channel.close()
        await h.running.stop()


async def test_a_held_admission_says_held_at_once_with_the_resume_timeout_then_decides(h):
    await _fill(h, 900)
    call = _stream(h, "new", "n1")
    first = await asyncio.wait_for(call.read(), 5)
    assert first.WhichOneof("update") == "held" and first.held.max_hold_seconds == 30.0
    await h.held(1)
    assert (await h.client.Release(pb.ReleaseRequest(session_id="big"))).released
    h.tick()
    last = await asyncio.wait_for(call.read(), 5)
    assert last.WhichOneof("update") == "decision" and last.decision.was_paused


async def test_a_second_turn_behind_a_held_one_is_held_too(h):
    await _fill(h, 900)
    first = _stream(h, "new", "n1")
    assert (await first.read()).WhichOneof("update") == "held"
    second = _stream(h, "new", "n2")  # the same program: waits at its gate
    assert (await asyncio.wait_for(second.read(), 5)).WhichOneof("update") == "held"
    first.cancel()
    assert (await asyncio.wait_for(second.read(), 5)).WhichOneof("update") in ("held", "decision")
    second.cancel()


async def test_a_caller_that_gives_up_while_held_rolls_the_admission_back(h):
    await _fill(h, 900)
    call = _stream(h, "new", "n1")
    assert (await call.read()).WhichOneof("update") == "held"
    await h.held(1)
    call.cancel()
    await h.held(0)
    assert (await h.client.GetStats(pb.GetStatsRequest())).waiting_admissions == 0
