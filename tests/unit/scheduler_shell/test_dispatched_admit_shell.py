"""A dispatched Admit over gRPC (a router's fast path started the turn first): never held, not even behind a
held turn of its program; a paused program is resumed where the turn runs, the held turn answered too, and
the metric counts it."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb

W = ("w1", 0)


async def test_a_dispatched_admit_of_a_paused_program_with_a_held_turn_is_answered_at_once(make_harness):
    h = await make_harness(resume_timeout_seconds=60.0)
    await h.set_capacity({W: 1_000})
    await h.admit("big", "big-fill", 1, timeout=5)
    await h.complete("big", "big-fill", 900, 0, *W)
    held = h.client.AdmitStream(pb.AdmitRequest(session_id="new", request_id="n1", estimated_prompt_tokens=100))
    assert (await asyncio.wait_for(held.read(), 5)).WhichOneof("update") == "held"
    await h.held(1)

    answer = await h.client.Admit(
        pb.AdmitRequest(
            session_id="new",
            request_id="n2",
            estimated_prompt_tokens=100,
            dispatched=True,
            dispatched_worker_id="w1",
            dispatched_dp_rank=0,
        ),
        timeout=5,
    )
    assert answer.was_paused and answer.lease_ttl_seconds >= 0
    resolved = await asyncio.wait_for(held.read(), 5)  # the resume answers the held turn too
    assert resolved.WhichOneof("update") == "decision"
    program = await h.program("new")
    assert program.lifecycle == pb.LIFECYCLE_ACTIVE and program.turns == 2 and program.worker_id == "w1"
    text = generate_latest(h.runtime.metrics.registry).decode()
    assert "bandmaster_scheduler_dispatched_while_paused_total 1.0" in text
