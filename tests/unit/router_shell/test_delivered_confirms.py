"""Issue 21: a turn counts at the scheduler once its client has received something. The router's scheduler
client queues `delivered` and confirms every turn delivered meanwhile in one RenewLeases call (~50 ms); a
turn whose lease lapses unconfirmed (its router died before its client's first byte) is rolled back. The
gRPC Router.Generate path confirms on its first message. Against the real scheduler servicer on a fake
clock (tests/unit/scheduler_shell/support.py)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider

from bandmaster.router.v1 import router_pb2 as rpb
from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.router.adapters.scheduler import SchedulerClient
from services.router.core.outcome import Outcome
from services.router.ingress.grpc_api import RouterServicer
from services.router.observe.metrics import RouterMetrics
from services.router.turn.relay import LineKind
from tests.support.eventually import assert_eventually
from tests.unit.scheduler_shell.support import router_client, start_harness

pytestmark = pytest.mark.timeout(30)
W = ("w1", 0)
LEASE_S = 20.0


@pytest.fixture
async def h():
    harness = await start_harness(ticket_lease_seconds=LEASE_S)
    await harness.set_capacity({W: 10_000})
    yield harness
    await harness.channel.close()
    await harness.running.stop()


def _client(h) -> SchedulerClient:
    return router_client(h.running.address)


async def _first_turn_done(h, client: SchedulerClient) -> None:
    assert await client.admit("p", "", "r1", 100) is not None
    await client.complete("p", "r1", "w1", 0, 100, 5, 0, Outcome.OK)


async def test_a_delivered_turn_is_confirmed_and_counts_when_its_router_dies(h):
    client = _client(h)
    try:
        await _first_turn_done(h, client)
        assert await client.admit("p", "", "r2", 100) is not None
        await client.bind("r2", "w1", 0)
        client.delivered("r2")
        client.delivered("r2")  # idempotent
        await assert_eventually(lambda: _confirmed(h, "r2"), timeout_s=5, interval_s=0.02)
    finally:
        await client.close()  # the router dies: no Complete, no renewal
    h.clock.advance(LEASE_S)
    h.tick()
    program = await h.program("p")
    assert program.turns == 2 and program.status == pb.PROGRAM_STATUS_ACTING


async def test_a_bound_turn_never_delivered_is_rolled_back_when_its_router_dies(h):
    client = _client(h)
    try:
        await _first_turn_done(h, client)
        assert await client.admit("p", "", "r2", 100) is not None
        await client.bind("r2", "w1", 0)
        await asyncio.sleep(0.2)  # longer than a delivery flush
    finally:
        await client.close()
    h.clock.advance(LEASE_S)
    h.tick()
    program = await h.program("p")
    assert program.turns == 1 and program.status == pb.PROGRAM_STATUS_ACTING


async def _confirmed(h, request_id: str) -> bool:
    turn = h.core.ledger.turns.get(request_id)
    return turn is not None and turn.confirmed


class _Turn:
    def __init__(self) -> None:
        self.replica = SimpleNamespace(worker_id="w0")
        self.usage = SimpleNamespace(prompt_tokens=3, completion_tokens=2, cached_tokens=0)
        self.finish_reason = "stop"
        self.delivered_at: list[int] = []
        self.sent = 0

    async def lines(self):
        for n in range(1, 4):
            self.sent = n
            chunk = {"choices": [{"text": "x"}], "usage": {"completion_tokens": n}}
            yield b"data: " + json.dumps(chunk).encode(), LineKind.DATA

    def delivered(self) -> None:
        self.delivered_at.append(self.sent)

    async def close(self, outcome: Outcome) -> None:
        pass


class _Runner:
    def __init__(self) -> None:
        self.turn = _Turn()

    async def open(self, spec):
        return self.turn


class _Context:
    def invocation_metadata(self):
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"


async def test_grpc_generate_confirms_on_its_first_message():
    runner = _Runner()
    servicer = RouterServicer(runner, RouterMetrics(), TracerProvider().get_tracer("test"))
    stream = servicer.Generate(rpb.GenerateRequest(session_id="p", prompt="hi"), _Context())
    first = await stream.__anext__()
    assert first.text == "x" and runner.turn.delivered_at == []  # not before it went out
    await stream.__anext__()
    assert runner.turn.delivered_at[0] == 1  # as soon as the first message was taken
    await stream.aclose()
