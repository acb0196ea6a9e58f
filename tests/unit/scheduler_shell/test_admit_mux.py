"""AdmitMux on 127.0.0.1:0 (FakeClock core, ticks by hand): admissions and completions multiplexed on one
stream behave as AdmitStream and Complete do, per operation: placed, held then resumed, cancelled, timed
out, completed, refused; and a stream that breaks rolls back every admission pending on it."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc
import pytest
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.common.outbound.leader_follow import MUX_OPS_METADATA_KEY
from tests.support.eventually import assert_eventually

pytestmark = pytest.mark.timeout(30)
W = ("w1", 0)
CANCELLED, DEADLINE, INVALID = (
    c.value[0] for c in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INVALID_ARGUMENT)
)


class Mux:
    """One AdmitMux call: `send` a batch of operations; `last(id)` waits for an operation's last result."""

    def __init__(self, client) -> None:
        self.call = client.AdmitMux()
        self.results: dict[int, list[pb.MuxResult]] = defaultdict(list)
        self.messages = 0
        self.changed = asyncio.Event()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            self.messages += 1
            for result in response.results:
                self.results[result.id].append(result)
            self.changed.set()

    async def send(self, *ops: pb.MuxOp) -> None:
        await self.call.write(pb.MuxRequest(ops=ops))

    async def last(self, op_id: int, timeout_s: float = 5) -> pb.MuxResult:
        async with asyncio.timeout(timeout_s):
            while True:
                for result in self.results.get(op_id, ()):
                    if result.WhichOneof("result") != "admit" or result.admit.HasField("decision"):
                        return result
                self.changed.clear()
                await self.changed.wait()

    async def first(self, op_id: int) -> pb.MuxResult:
        await assert_eventually(lambda: bool(self.results.get(op_id)), timeout_s=5)
        return self.results[op_id][0]


def admit(op_id: int, sid: str, rid: str, tokens: int = 100, timeout_s: float = 0, **fields) -> pb.MuxOp:
    request = pb.AdmitRequest(session_id=sid, request_id=rid, estimated_prompt_tokens=tokens)
    return pb.MuxOp(id=op_id, admit=pb.MuxAdmit(request=request, timeout_seconds=timeout_s, **fields))


def complete(op_id: int, sid: str, rid: str, prompt: int, worker: str = "w1", **fields) -> pb.MuxOp:
    request = pb.CompleteRequest(session_id=sid, request_id=rid, worker_id=worker, prompt_tokens=prompt, **fields)
    return pb.MuxOp(id=op_id, complete=pb.MuxComplete(request=request))


def cancel(op_id: int) -> pb.MuxOp:
    return pb.MuxOp(id=op_id, cancel=pb.MuxCancel())


@pytest.fixture
async def mux(h):
    m = Mux(h.client)
    yield m
    m.call.cancel()
    await asyncio.gather(m.reader, return_exceptions=True)


async def fill(h, mux: Mux, tokens: int) -> None:
    """An ACTING program `big` of `tokens` on w1."""
    await mux.send(admit(900, "big", "big-fill", 1))
    assert (await mux.last(900)).admit.decision.pinned
    await mux.send(complete(901, "big", "big-fill", tokens))
    assert (await mux.last(901)).HasField("complete")


async def test_a_batch_of_admits_is_placed_and_completes_make_them_acting(h, mux):
    await h.set_capacity({W: 10_000})
    await mux.send(*(admit(i, f"p{i}", f"r{i}", 1_000) for i in range(5)))
    for i in range(5):
        decision = (await mux.last(i)).admit.decision
        assert decision.pinned and (decision.worker_id, decision.dp_rank) == W and not decision.was_paused
        assert len(mux.results[i]) == 1  # placed at once: no `held`
    assert mux.messages < 5  # coalesced: one answer carried several results
    await mux.send(*(complete(10 + i, f"p{i}", f"r{i}", 1_200) for i in range(5)))
    for i in range(5):
        assert (await mux.last(10 + i)).HasField("complete")
        prog = await h.program(f"p{i}")
        assert prog.status == pb.PROGRAM_STATUS_ACTING and prog.token_total == 1_200 and prog.turns == 1
    h.core.ledger.check_invariants(h.clock.monotonic())


async def test_a_held_admission_says_held_then_gets_its_decision_when_resumed(h, mux):
    await h.set_capacity({W: 10_000})
    await fill(h, mux, 9_500)
    await mux.send(admit(1, "p1", "r1"))
    first = await mux.first(1)
    assert first.admit.HasField("held") and first.admit.held.max_hold_seconds > 0
    await h.held(1)
    await mux.send(admit(2, "p2", "r2", 1))  # the stream goes on while p1 is held
    assert (await mux.first(2)).admit.HasField("held")
    assert (await h.client.Release(pb.ReleaseRequest(session_id="big"))).released
    assert h.tick().resumed == 2
    for op_id in (1, 2):
        decision = (await mux.last(op_id)).admit.decision
        assert decision.was_paused and decision.pinned and decision.worker_id == "w1"
    assert h.runtime.held_count == 0


async def test_a_cancelled_held_admission_is_rolled_back_and_answered_cancelled(h, mux):
    await h.set_capacity({W: 1_000})
    await fill(h, mux, 900)
    before = h.table()
    await mux.send(admit(1, "new", "n1"))
    await h.held(1)
    await mux.send(cancel(1))
    result = await mux.last(1)
    assert result.error.code == CANCELLED
    await h.held(0)
    assert h.table() == before
    assert h.core.stats(h.clock.monotonic()).admissions_cancelled_total == 1
    await mux.send(cancel(1))  # answered already: nothing more comes
    await mux.send(complete(2, "big", "no-such-turn", 1))
    await mux.last(2)
    assert len(mux.results[1]) == 2  # held, then the error


async def test_a_cancel_that_crosses_the_held_write_still_withdraws_the_admission(h, monkeypatch):
    """Found by CI (tests/faults/test_scheduler_http_disconnect.py): a cancel read while the write carrying
    the admission's `held` was under way was taken for one crossing its decision and ignored, so the
    admission stayed held, with nobody waiting, until its deadline. Only a decision in a write stands."""
    from services.scheduler import servicer as servicer_module

    held_write_began, release = asyncio.Event(), asyncio.Event()

    class SlowHeldWrite:
        """The servicer's context, whose write of op 1's `held` does not return until released."""

        def __init__(self, context) -> None:
            self._context = context

        def __getattr__(self, name):
            return getattr(self._context, name)

        async def write(self, response: pb.MuxResponse) -> None:
            if any(r.id == 1 and r.admit.HasField("held") for r in response.results):
                held_write_began.set()
                await release.wait()
            await self._context.write(response)

    init = servicer_module.MuxStream.__init__

    def slow_init(self, servicer, context) -> None:
        init(self, servicer, SlowHeldWrite(context))

    monkeypatch.setattr(servicer_module.MuxStream, "__init__", slow_init)
    mux = Mux(h.client)
    try:
        await h.set_capacity({W: 1_000})
        await fill(h, mux, 900)
        before = h.table()
        await mux.send(admit(1, "new", "n1"))
        await asyncio.wait_for(held_write_began.wait(), 5)
        await mux.send(cancel(1))  # read while the `held` is being written
        await asyncio.sleep(0.2)
        release.set()
        result = await mux.last(1)
        assert result.error.code == CANCELLED
        await h.held(0)
        assert h.table() == before
    finally:
        release.set()
        mux.call.cancel()
        await asyncio.gather(mux.reader, return_exceptions=True)


async def test_a_cancel_after_the_decision_leaves_the_admission_standing(h, mux):
    await h.set_capacity({W: 10_000})
    await mux.send(admit(1, "p1", "r1"))
    assert (await mux.last(1)).admit.decision.pinned
    await mux.send(cancel(1))
    await mux.send(complete(2, "p1", "r1", 10, outcome=pb.TURN_OUTCOME_NOT_STARTED))
    assert (await mux.last(2)).HasField("complete")
    assert mux.results[1][-1].admit.HasField("decision")


async def test_the_per_admit_deadline_while_held_rolls_back(h, mux):
    await h.set_capacity({W: 1_000})
    await fill(h, mux, 900)
    before = h.table()
    await mux.send(admit(1, "new", "n1", timeout_s=0.3))
    result = await mux.last(1)
    assert result.error.code == DEADLINE and "rolled back" in result.error.message
    await h.held(0)
    assert h.table() == before
    assert h.core.stats(h.clock.monotonic()).admissions_cancelled_total == 1


async def test_a_broken_stream_rolls_back_every_pending_admission(h, mux):
    await h.set_capacity({W: 1_000})
    await fill(h, mux, 900)
    before = h.table()
    await mux.send(*(admit(i, f"new{i}", f"n{i}") for i in range(3)))
    await h.held(3)
    mux.call.cancel()  # the router's process died or its connection broke
    await h.held(0)
    assert h.table() == before
    assert h.core.stats(h.clock.monotonic()).admissions_cancelled_total == 3
    # The next stream works.
    again = Mux(h.client)
    await again.send(complete(1, "big", "no-such-turn", 1))
    assert (await again.last(1)).HasField("complete")  # ignored, as a unary Complete of it is
    again.call.cancel()


async def test_a_half_closed_stream_still_answers_what_is_pending(h, mux):
    await h.set_capacity({W: 10_000})
    await fill(h, mux, 9_500)
    await mux.send(admit(1, "p1", "r1"))
    await h.held(1)
    await mux.call.done_writing()
    assert (await h.client.Release(pb.ReleaseRequest(session_id="big"))).released
    h.tick()
    assert (await mux.last(1)).admit.decision.was_paused
    await mux.reader
    assert await mux.call.code() == grpc.StatusCode.OK


async def test_invalid_operations_fail_alone_with_their_unary_status(h, mux):
    await h.set_capacity({W: 10_000})
    await mux.send(
        admit(1, "p1", ""),  # no request id
        complete(2, "p1", "r1", -5),
        pb.MuxOp(id=3),  # no operation
        admit(4, "p4", "r4"),
    )
    for op_id in (1, 2, 3):
        assert (await mux.last(op_id)).error.code == INVALID
    assert (await mux.last(4)).admit.decision.pinned
    await mux.send(admit(5, "p5", "r4"))  # the request id is in flight
    assert (await mux.last(5)).error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]


async def test_a_duplicate_pending_id_ends_the_stream_invalid_argument(h, mux):
    await h.set_capacity({W: 1_000})
    await fill(h, mux, 900)
    await mux.send(admit(1, "a", "a1"))
    await h.held(1)
    await mux.send(admit(1, "b", "b1"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await mux.reader
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await h.held(0)  # the stream's end rolled its pending admission back


async def test_each_admit_continues_its_own_callers_trace(h, mux):
    carrier: dict[str, str] = {}
    from opentelemetry.sdk.trace import TracerProvider

    with TracerProvider().get_tracer("t").start_as_current_span("caller") as caller:
        TraceContextTextMapPropagator().inject(carrier)
    await mux.send(admit(1, "p1", "r1", traceparent=carrier["traceparent"]))
    await mux.last(1)

    def admit_span():
        return next((s for s in h.exporter.get_finished_spans() if s.name == "scheduler.admit"), None)

    await assert_eventually(lambda: admit_span() is not None, timeout_s=5)
    span = admit_span()
    assert span.kind == SpanKind.SERVER
    assert span.context.trace_id == caller.get_span_context().trace_id
    assert span.parent.span_id == caller.get_span_context().span_id


def bind(op_id: int, rid: str, worker: str, dp_rank: int = 0) -> pb.MuxOp:
    return pb.MuxOp(
        id=op_id, bind=pb.MuxBind(request=pb.BindRequest(request_id=rid, worker_id=worker, dp_rank=dp_rank))
    )


async def test_the_stream_names_its_operations_and_binds_as_the_unary_bind_does(h, mux):
    """A router sends binds on the stream only to a scheduler that names them (an older one would answer
    an op it does not know INVALID_ARGUMENT); each bind answers as the unary Bind would."""
    metadata = dict(await mux.call.initial_metadata())
    assert set(metadata[MUX_OPS_METADATA_KEY].split(",")) == {"admit", "cancel", "complete", "bind"}
    await mux.send(admit(1, "p", "t1", 50), admit(2, "q", "u1", 50), admit(3, "q", "u2", 50))
    assert not (await mux.last(1)).admit.decision.pinned  # cold start: the router picks
    await h.set_capacity({("7", 2): 10_000})
    await mux.send(bind(4, "t1", "7", 2), bind(5, "u1", "7", 2), bind(6, "u2", "7", 2), bind(7, "t1", ""))
    assert (await mux.last(4)).bind.bound
    assert not (await mux.last(5)).bind.bound  # a superseded turn's bind is ignored, as in the unary call
    assert (await mux.last(6)).bind.bound
    assert (await mux.last(7)).error.code == INVALID  # no worker
    await mux.send(complete(8, "p", "t1", 50, worker="7", dp_rank=2))
    assert (await mux.last(8)).HasField("complete")
    await mux.send(admit(9, "p", "t2", 60))
    decision = (await mux.last(9)).admit.decision
    assert decision.pinned and (decision.worker_id, decision.dp_rank) == ("7", 2)


async def test_without_span_export_the_operations_parse_no_trace_context(monkeypatch):
    """A scheduler whose spans go nowhere records none: an operation's W3C fields are not parsed (about a
    fifth of its own CPU per turn went to that) and every operation answers as before."""
    from services.common.observe.telemetry import setup_telemetry
    from services.scheduler import servicer as servicer_module
    from tests.unit.scheduler_shell.support import start_harness

    def parsed(*_args):
        raise AssertionError("a trace context was parsed for a span nobody records")

    monkeypatch.setattr(servicer_module, "_trace_parent", parsed)
    h = await start_harness(telemetry=setup_telemetry("scheduler-test", set_global=False))
    mux = Mux(h.client)
    try:
        carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        await h.set_capacity({W: 10_000})
        await mux.send(admit(1, "p1", "r1", 1_000, traceparent=carrier["traceparent"]), admit(2, "p2", "r2", 50))
        assert (await mux.last(1)).admit.decision.pinned
        assert (await mux.last(2)).admit.decision.pinned
        done = complete(3, "p1", "r1", 1_200)
        done.complete.traceparent = carrier["traceparent"]
        await mux.send(done)
        assert (await mux.last(3)).HasField("complete")
        assert (await h.program("p1")).status == pb.PROGRAM_STATUS_ACTING
    finally:
        mux.call.cancel()
        await asyncio.gather(mux.reader, return_exceptions=True)
        await h.channel.close()
        await h.running.stop()
