"""Admission commits only when its answer is handed to the call (issue 21, phantom admissions).

The servicer awaits the call before an answer counts (the unary Admit its initial metadata, AdmitStream
its decision message); a cancel that reached the server while the decision was being made lands on
that await. Here the call's context is one whose client is gone, so the landing is deterministic:
every kind of admission (placed at once, passthrough, resumed after a hold) is rolled back exactly.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from opentelemetry import trace

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.scheduler.servicer import SchedulerServicer

pytestmark = pytest.mark.timeout(30)
W = ("w1", 0)


class GoneClient:
    """The context of a call whose client cancelled while its admission was decided: the first await
    on the call after the decision raises CancelledError, as gRPC does once it sees the cancel."""

    def __init__(self) -> None:
        self.held_written = asyncio.Event()

    def invocation_metadata(self):
        return ()

    def time_remaining(self) -> float:
        return 30.0

    async def send_initial_metadata(self, metadata) -> None:
        raise asyncio.CancelledError()

    async def write(self, update: pb.AdmitUpdate) -> None:
        if update.HasField("held"):
            self.held_written.set()
            return
        raise asyncio.CancelledError()

    async def abort(self, code, details):  # pragma: no cover - no domain error expected here
        raise AssertionError(f"aborted: {code} {details}")


class StalledClient(GoneClient):
    """A client that never reads: the answer cannot be handed over (its stream's window is full)."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted: tuple | None = None

    async def send_initial_metadata(self, metadata) -> None:
        await asyncio.Event().wait()

    async def write(self, update: pb.AdmitUpdate) -> None:
        await asyncio.Event().wait()

    async def abort(self, code, details):
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


def _servicer(h, **kwargs) -> SchedulerServicer:
    return SchedulerServicer(h.runtime, h.running.config.kv_router, trace.get_tracer("test"), **kwargs)


def _state(h) -> tuple:
    stats = h.core.stats(h.clock.monotonic())
    return h.table(), stats.tickets_in_flight, stats.waiting_admissions, stats.passthrough_in_flight


@pytest.mark.parametrize("method", ["Admit", "AdmitStream"])
@pytest.mark.parametrize("session_id", ["p", "new", ""])
async def test_an_answer_that_cannot_be_delivered_is_rolled_back(make_harness, method, session_id):
    h = await make_harness(ticket_lease_seconds=30.0)
    await h.set_capacity({W: 100_000})
    await h.admit("p", "p-1", 1_000)
    await h.complete("p", "p-1", 2_000, 10, "w1", 0)
    before = _state(h)
    request = pb.AdmitRequest(session_id=session_id, request_id="gone", estimated_prompt_tokens=500)
    with pytest.raises(asyncio.CancelledError):
        await getattr(_servicer(h), method)(request, GoneClient())
    assert _state(h) == before
    h.core.ledger.check_invariants(h.clock.monotonic())


@pytest.mark.parametrize("method", ["Admit", "AdmitStream"])
async def test_a_held_admission_resumed_as_its_client_left_is_rolled_back(make_harness, method):
    h = await make_harness(
        ticket_lease_seconds=30.0,
        pause_threshold=0.95,
        pause_target=0.8,
        soft_demote_threshold=0.8,
        resume_hysteresis=0.1,
    )
    await h.set_capacity({W: 10_000})
    await h.admit("big", "big-1", 1)
    await h.complete("big", "big-1", 9_000, 0, "w1", 0)
    context = GoneClient()
    request = pb.AdmitRequest(session_id="new", request_id="gone", estimated_prompt_tokens=500)
    call = asyncio.ensure_future(getattr(_servicer(h), method)(request, context))
    await h.held(1)
    await h.client.Release(pb.ReleaseRequest(session_id="big"))
    h.tick()  # room again: the held admission resolves, and its answer meets a client that is gone
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, 5)
    stats = h.core.stats(h.clock.monotonic())
    assert stats.tickets_in_flight == 0 and stats.waiting_admissions == 0
    assert h.core.program("new") is None  # created by that admission: gone with it
    assert h.core.program("big") is None  # released: the only change left
    h.core.ledger.check_invariants(h.clock.monotonic())


@pytest.mark.parametrize("method", ["Admit", "AdmitStream"])
async def test_an_answer_the_call_never_takes_is_rolled_back_within_the_delivery_bound(make_harness, method):
    h = await make_harness(ticket_lease_seconds=30.0)
    await h.set_capacity({W: 100_000})
    before = _state(h)
    context = StalledClient()
    request = pb.AdmitRequest(session_id="p", request_id="stalled", estimated_prompt_tokens=500)
    with pytest.raises(grpc.aio.AbortError):
        await getattr(_servicer(h, delivery_timeout_s=0.05), method)(request, context)
    assert context.aborted is not None and context.aborted[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "rolled back" in context.aborted[1]
    assert _state(h) == before


async def test_complete_not_started_over_grpc_rolls_the_admission_back(make_harness):
    h = await make_harness(ticket_lease_seconds=30.0)
    await h.set_capacity({W: 100_000})
    await h.admit("p", "p-1", 1_000)
    await h.complete("p", "p-1", 2_000, 10, "w1", 0)
    before = _state(h)
    await h.admit("p", "p-2", 1_000)
    await h.complete("p", "p-2", 0, outcome=pb.TURN_OUTCOME_NOT_STARTED)
    assert _state(h) == before
    await h.complete("p", "p-2", 0, outcome=pb.TURN_OUTCOME_NOT_STARTED)  # repeated: ignored
    assert _state(h) == before
