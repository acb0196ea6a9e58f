"""Issue 24: the router's scheduler client admits and completes its turns on one AdmitMux stream per
replica, with the per-call path (AdmitStream + Complete) for a scheduler that has no AdmitMux, and the
same failure rules: a held turn waits, a turn given up is rolled back, a broken stream fails only the turns
pending on it and the next turn reopens it. Against the real scheduler servicer on a fake clock
(tests/unit/scheduler_shell/support.py); the calls are counted by an interceptor on the router's channel."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.router.adapters.scheduler import SchedulerClient
from services.router.core.outcome import Outcome
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import WithoutAdmitMux
from tests.unit.scheduler_shell.support import router_client, start_harness

pytestmark = pytest.mark.timeout(30)
W = ("w1", 0)


class CountCalls:
    """Counts the calls the router's channel makes, by method name (one interceptor per call kind: a
    channel files each interceptor under one kind only)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def count(self, details) -> None:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        self.calls[method.rsplit("/", 1)[-1]] += 1

    def interceptors(self) -> list:
        return [_Unary(self), _UnaryStream(self), _StreamStream(self)]


class _Unary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, counter: CountCalls) -> None:
        self.counter = counter

    async def intercept_unary_unary(self, continuation, details, request):
        self.counter.count(details)
        return await continuation(details, request)


class _UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, counter: CountCalls) -> None:
        self.counter = counter

    async def intercept_unary_stream(self, continuation, details, request):
        self.counter.count(details)
        return await continuation(details, request)


class _StreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, counter: CountCalls) -> None:
        self.counter = counter

    async def intercept_stream_stream(self, continuation, details, request_iterator):
        self.counter.count(details)
        return await continuation(details, request_iterator)


def _client(address: str, counter: CountCalls, *, mux: bool = True, retry_s: float = 1.0) -> SchedulerClient:
    return router_client(
        address,
        breaker_s=retry_s,
        channel_factory=lambda a: grpc.aio.insecure_channel(a, interceptors=counter.interceptors()),
        mux=mux,
    )


@pytest.fixture
async def h():
    harness = await start_harness()
    yield harness
    await harness.channel.close()
    await harness.running.stop()


async def _fill(h, tokens: int) -> None:
    await h.admit("big", "big-fill", 1, timeout=5)
    await h.complete("big", "big-fill", tokens, 0, *W)


def _fail_opens(client: SchedulerClient, reason: str) -> float:
    return client._metrics.fail_open.labels(reason)._value.get()


async def _turn(client: SchedulerClient, sid: str, rid: str) -> None:
    admission = await client.admit(sid, "", rid, 100)
    assert admission is not None and admission.pinned and admission.worker_id == "w1"
    await client.complete(sid, rid, admission.worker_id, admission.dp_rank, 100, 10, 0, Outcome.OK)


async def test_concurrent_turns_admit_and_complete_on_one_stream(h):
    await h.set_capacity({W: 100_000})
    counter = CountCalls()
    client = _client(h.running.address, counter)
    try:
        await asyncio.gather(*(_turn(client, f"p{i}", f"r{i}") for i in range(20)))
        await asyncio.gather(*(_turn(client, f"p{i}", f"r{i}-2") for i in range(20)))
    finally:
        await client.close()
    assert counter.calls == {"AdmitMux": 1}
    for i in range(20):
        program = await h.program(f"p{i}")
        assert program.turns == 2 and program.status == pb.PROGRAM_STATUS_ACTING


async def test_with_the_mux_off_each_turn_makes_its_own_calls(h):
    await h.set_capacity({W: 100_000})
    counter = CountCalls()
    client = _client(h.running.address, counter, mux=False)
    try:
        await _turn(client, "p", "r1")
    finally:
        await client.close()
    assert counter.calls == {"AdmitStream": 1, "Complete": 1}


async def test_a_held_turn_waits_on_the_stream_for_its_decision(h):
    await h.set_capacity({W: 1_000})
    await _fill(h, 900)
    client = _client(h.running.address, CountCalls())
    try:
        turn = asyncio.ensure_future(client.admit("new", "", "n1", 100))
        await h.held(1)
        assert (await h.client.Release(pb.ReleaseRequest(session_id="big"))).released
        h.tick()
        admission = await asyncio.wait_for(turn, 5)
        assert admission is not None and admission.was_paused and admission.worker_id == "w1"
    finally:
        await client.close()


async def test_a_turn_given_up_while_held_is_rolled_back(h):
    await h.set_capacity({W: 1_000})
    await _fill(h, 900)
    before = h.table()
    client = _client(h.running.address, CountCalls())
    try:
        turn = asyncio.ensure_future(client.admit("new", "", "n1", 100))
        await h.held(1)
        turn.cancel()  # the turn's client went away
        with pytest.raises(asyncio.CancelledError):
            await turn
        await h.held(0)
        assert h.table() == before
        await _release_and_take_a_turn(h, client)
    finally:
        await client.close()


async def _release_and_take_a_turn(h, client: SchedulerClient) -> None:
    assert (await h.client.Release(pb.ReleaseRequest(session_id="big"))).released
    await _turn(client, "other", "o1")


async def test_a_broken_stream_fails_only_its_pending_turns_and_the_next_turn_reopens_it(h):
    await h.set_capacity({W: 1_000})
    await _fill(h, 900)
    counter = CountCalls()
    client = _client(h.running.address, counter, retry_s=0.1)
    try:
        held = [asyncio.ensure_future(client.admit(f"new{i}", "", f"n{i}", 100)) for i in range(2)]
        await h.held(2)
        mux = client._muxes[h.running.address]
        mux._call.cancel()  # the connection under the stream breaks
        assert await asyncio.wait_for(asyncio.gather(*held), 5) == [None, None]  # failed open, like AdmitStream
        assert _fail_opens(client, "unreachable") == 2  # each pending turn, as two broken AdmitStreams
        await h.held(0)  # the scheduler rolled both back
        assert (await h.client.Release(pb.ReleaseRequest(session_id="big"))).released

        async def admitted() -> bool:
            return await client.admit("after", "", f"a{counter.calls['AdmitMux']}", 100) is not None

        await assert_eventually(admitted, timeout_s=5, interval_s=0.05)  # the breaker's probe reopens it
        assert counter.calls["AdmitMux"] == 2 and "AdmitStream" not in counter.calls
    finally:
        await client.close()


class OlderScheduler(WithoutAdmitMux):
    """A scheduler from before AdmitMux: AdmitStream and Complete only."""

    def __init__(self) -> None:
        self.completed: list[str] = []

    async def AdmitStream(self, request, context):
        yield pb.AdmitUpdate(decision=pb.AdmitResponse(worker_id="w1", pinned=True))

    async def Complete(self, request, context):
        self.completed.append(request.request_id)
        return pb.CompleteResponse()


async def test_an_older_scheduler_without_admitmux_gets_the_calls_of_their_own():
    older = OlderScheduler()
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(older, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    counter = CountCalls()
    client = _client(f"127.0.0.1:{port}", counter)
    try:
        for i in range(3):
            await _turn(client, "p", f"r{i}")
    finally:
        await client.close()
        await server.stop(0)
    assert older.completed == ["r0", "r1", "r2"]
    assert counter.calls == {"AdmitMux": 1, "AdmitStream": 3, "Complete": 3}
    assert _fail_opens(client, "unreachable") == 0
