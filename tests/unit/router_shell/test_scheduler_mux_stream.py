"""The router's AdmitMux stream (services/router/adapters/scheduler_mux.py) against a scripted stream: the
scheduler's results and the stream's end are played by the test, so the races are exact: a decision that
crosses a cancel, a standby's refusal, a stream that breaks before answering anything, coalescing."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.common.outbound.leader_follow import MUX_OPS_METADATA_KEY, leader_hint
from services.router.adapters import scheduler_mux
from services.router.adapters.scheduler_mux import MuxNotNow, MuxUnsupported, SchedulerMux, rpc_error

pytestmark = pytest.mark.timeout(10)

WRITE_STALL_S = 0.2


class ScriptedCall:
    """One AdmitMux call: records what the router writes; `answer`/`end` play the scheduler."""

    def __init__(self) -> None:
        self.written: list[pb.MuxRequest] = []
        self.incoming: asyncio.Queue = asyncio.Queue()
        self.cancelled = False
        self.reading = asyncio.Event()  # cleared: the scheduler stopped reading, writes do not complete
        self.reading.set()
        # What the scheduler names as its operations (a scheduler from before MuxBind sends nothing).
        self.metadata: tuple = ((MUX_OPS_METADATA_KEY, "admit,cancel,complete,bind"),)

    async def initial_metadata(self) -> tuple:
        return self.metadata

    async def write(self, request: pb.MuxRequest) -> None:
        await self.reading.wait()
        self.written.append(request)

    def __aiter__(self):
        return self

    async def __anext__(self) -> pb.MuxResponse:
        item = await self.incoming.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> bool:
        self.cancelled = True
        self.incoming.put_nowait(asyncio.CancelledError())
        return True

    def answer(self, *results: pb.MuxResult) -> None:
        self.incoming.put_nowait(pb.MuxResponse(results=results))

    def end(self, error: BaseException | None = None) -> None:
        self.incoming.put_nowait(error)

    def ops(self) -> list[pb.MuxOp]:
        return [op for request in self.written for op in request.ops]


class ScriptedStub:
    def __init__(self) -> None:
        self.calls: list[ScriptedCall] = []

    def AdmitMux(self) -> ScriptedCall:
        self.calls.append(ScriptedCall())
        return self.calls[-1]


def _request(rid: str) -> pb.AdmitRequest:
    return pb.AdmitRequest(session_id=f"s-{rid}", request_id=rid, estimated_prompt_tokens=10)


def _decision(op_id: int, worker: str = "w1") -> pb.MuxResult:
    return pb.MuxResult(id=op_id, admit=pb.AdmitUpdate(decision=pb.AdmitResponse(worker_id=worker, pinned=True)))


def _no_fallback():
    raise AssertionError("the per-call path was not expected")


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
async def mux():
    stub = ScriptedStub()
    m = SchedulerMux(stub, "sched:1", write_stall_s=WRITE_STALL_S)  # type: ignore[arg-type]
    m.stub = stub  # type: ignore[attr-defined]
    yield m
    await m.close()


async def test_what_is_queued_in_one_loop_turn_goes_in_one_message(mux):
    calls = [
        mux.admit(_request(f"r{i}"), 30.0, {"traceparent": f"00-{i:032x}-{i:016x}-01"}, _no_fallback) for i in range(5)
    ]
    await _settle()
    (stream,) = mux.stub.calls
    assert len(stream.written) == 1 and [op.admit.request.request_id for op in stream.ops()] == [
        f"r{i}" for i in range(5)
    ]
    assert all(op.admit.timeout_seconds == 30.0 and op.admit.traceparent for op in stream.ops())
    stream.answer(*(_decision(call.id) for call in calls))
    for call in calls:
        assert (await call.read()).decision.worker_id == "w1"
    assert mux.pending == 0


async def test_a_decision_that_crosses_a_cancel_is_ended_not_started(mux):
    call = mux.admit(_request("r1"), 30.0, {}, _no_fallback)
    await _settle()
    call.cancel()  # the turn's client left
    await _settle()
    stream = mux.stub.calls[0]
    assert stream.ops()[-1].WhichOneof("op") == "cancel" and stream.ops()[-1].id == call.id
    stream.answer(_decision(call.id, worker="w2"))  # the scheduler had decided already
    await _settle()
    done = stream.ops()[-1]
    assert done.WhichOneof("op") == "complete"
    assert done.complete.request.request_id == "r1" and done.complete.request.worker_id == "w2"
    assert done.complete.request.outcome == pb.TURN_OUTCOME_NOT_STARTED


async def test_a_held_that_crosses_a_cancel_is_cancelled_again(mux):
    """A scheduler from before 3ced290 ignored a cancel read while the admission's `held` was being written
    (the admission then stayed held, nobody waiting, until its deadline): a `held` for an admission the
    router withdrew is answered with the cancel again, once."""
    call = mux.admit(_request("r1"), 30.0, {}, _no_fallback)
    await _settle()
    call.cancel()
    await _settle()
    stream = mux.stub.calls[0]
    held = pb.MuxResult(id=call.id, admit=pb.AdmitUpdate(held=pb.AdmitHeld(max_hold_seconds=60)))
    stream.answer(held)
    await _settle()
    cancels = [op for op in stream.ops() if op.WhichOneof("op") == "cancel"]
    assert [op.id for op in cancels] == [call.id, call.id]
    stream.answer(held)  # a heartbeat: the cancel is not sent a third time
    await _settle()
    assert sum(op.WhichOneof("op") == "cancel" for op in stream.ops()) == 2
    stream.answer(pb.MuxResult(id=call.id, error=pb.MuxError(code=grpc.StatusCode.CANCELLED.value[0])))
    await _settle()
    assert mux.pending == 0 and not mux._withdrawn


async def test_a_standbys_refusal_of_an_admit_names_the_leader_as_the_call_would(mux):
    call = mux.admit(_request("r1"), 30.0, {}, _no_fallback)
    await _settle()
    refusal = pb.MuxError(code=grpc.StatusCode.FAILED_PRECONDITION.value[0], message="standby", leader_address="l:2")
    mux.stub.calls[0].answer(pb.MuxResult(id=call.id, error=refusal))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and leader_hint(err.value) == "l:2"


class FallbackCall:
    """The per-call path's AdmitStream call, as the client would have made it."""

    def __init__(self, made: list[str], request_id: str) -> None:
        made.append(request_id)

    async def read(self):
        return pb.AdmitUpdate(decision=pb.AdmitResponse(worker_id="w9"))

    def cancel(self):
        pass


async def test_a_stream_that_breaks_before_answering_hands_its_operations_to_the_calls_then_reopens_after_a_backoff(
    mux,
):
    """Regression: a stream an older scheduler closed while the router wrote ended INTERNAL, not UNIMPLEMENTED;
    its pending turns failed UNAVAILABLE and the router failed open for its retry interval. A stream that
    answered nothing now tells nothing: its operations are made by the per-call path, which decides."""
    made: list[str] = []
    call = mux.admit(_request("r1"), 30.0, {}, lambda: FallbackCall(made, "r1"))
    complete = asyncio.ensure_future(mux.complete(pb.CompleteRequest(request_id="r0"), 5.0, {}))
    await _settle()
    mux.stub.calls[0].end(rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    assert (await call.read()).decision.worker_id == "w9" and made == ["r1"]
    with pytest.raises(MuxUnsupported):
        await complete  # the client makes the unary Complete
    assert not mux.unsupported  # not remembered: the stream is tried again
    # Until the first backoff (50 ms) has passed, operations go by the calls without a new stream ...
    assert (await mux.admit(_request("r2"), 30.0, {}, lambda: FallbackCall(made, "r2")).read()).HasField("decision")
    assert made == ["r1", "r2"] and len(mux.stub.calls) == 1
    await asyncio.sleep(0.06)  # ... then the stream is reopened
    again = mux.admit(_request("r3"), 30.0, {}, _no_fallback)
    await _settle()
    assert len(mux.stub.calls) == 2
    mux.stub.calls[1].answer(_decision(again.id))
    assert (await again.read()).HasField("decision")


async def test_a_stream_that_answered_then_broke_fails_its_pending_operations_unavailable(mux):
    first = mux.admit(_request("r1"), 30.0, {}, _no_fallback)
    await _settle()
    mux.stub.calls[0].answer(_decision(first.id))
    await first.read()
    call = mux.admit(_request("r2"), 30.0, {}, _no_fallback)
    complete = asyncio.ensure_future(mux.complete(pb.CompleteRequest(request_id="r1"), 5.0, {}))
    await _settle()
    mux.stub.calls[0].end(rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    for waiting in (call.read(), complete):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await waiting
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # a lost connection, whatever gRPC called it


async def test_a_stream_that_answered_reopens_at_once_after_a_break(mux):
    first = mux.admit(_request("r1"), 30.0, {}, _no_fallback)
    await _settle()
    mux.stub.calls[0].answer(_decision(first.id))
    await first.read()
    mux.stub.calls[0].end(rpc_error(grpc.StatusCode.UNAVAILABLE, "gone"))
    await _settle()
    call = mux.admit(_request("r2"), 30.0, {}, _no_fallback)
    await _settle()
    assert len(mux.stub.calls) == 2 and mux.stub.calls[1].ops()[0].admit.request.request_id == "r2"
    mux.stub.calls[1].answer(_decision(call.id))
    assert (await call.read()).HasField("decision")


async def test_an_older_scheduler_is_remembered_and_its_pending_admits_use_the_calls(mux):
    fallback_calls = []

    class FallbackCall:
        async def read(self):
            return pb.AdmitUpdate(decision=pb.AdmitResponse(worker_id="w9"))

        def cancel(self):
            pass

    def fallback():
        fallback_calls.append(1)
        return FallbackCall()

    call = mux.admit(_request("r1"), 30.0, {}, fallback)
    await _settle()
    mux.stub.calls[0].end(rpc_error(grpc.StatusCode.UNIMPLEMENTED, "unknown method AdmitMux"))
    assert (await call.read()).decision.worker_id == "w9" and fallback_calls == [1]
    assert mux.unsupported
    with pytest.raises(MuxUnsupported):
        await mux.complete(pb.CompleteRequest(request_id="r1"), 5.0, {})


async def test_a_complete_not_answered_in_time_is_deadline_exceeded(mux):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await mux.complete(pb.CompleteRequest(request_id="r1"), 0.05, {})
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert mux.pending == 0


async def test_a_write_the_scheduler_does_not_read_ends_the_stream_within_the_stall_bound(mux):
    """Regression: a scheduler that stopped reading (frozen, its connection alive) held the writer in
    `call.write` for as long as it stayed so; every later operation queued behind it without bound."""
    first = mux.admit(_request("r1"), 30.0, {}, _no_fallback)
    await _settle()
    stream = mux.stub.calls[0]
    stream.answer(_decision(first.id))
    await first.read()
    stream.reading.clear()
    stuck = mux.admit(_request("r2"), 30.0, {}, _no_fallback)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(stuck.read(), 5 * WRITE_STALL_S)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and stream.cancelled
    # The next operation opens a new stream.
    again = mux.admit(_request("r3"), 30.0, {}, _no_fallback)
    await _settle()
    assert len(mux.stub.calls) == 2
    mux.stub.calls[1].answer(_decision(again.id))
    assert (await again.read()).HasField("decision")


async def test_operations_past_the_queue_bound_take_the_per_call_path(mux, monkeypatch):
    monkeypatch.setattr(scheduler_mux, "MAX_QUEUED", 3)
    first = mux.admit(_request("r0"), 30.0, {}, _no_fallback)
    await _settle()
    mux.stub.calls[0].answer(_decision(first.id))
    await first.read()
    mux.stub.calls[0].reading.clear()
    mux.admit(_request("r1"), 30.0, {}, _no_fallback)  # taken by the writer, whose write does not complete
    await _settle()
    queued = [mux.admit(_request(f"q{i}"), 30.0, {}, _no_fallback) for i in range(3)]
    assert len(queued) == 3 and mux.pending == 4
    made: list[str] = []
    over = mux.admit(_request("r9"), 30.0, {}, lambda: FallbackCall(made, "r9"))
    assert (await over.read()).decision.worker_id == "w9" and made == ["r9"]
    with pytest.raises(MuxNotNow):
        await mux.complete(pb.CompleteRequest(request_id="r0"), 5.0, {})


async def test_a_bind_goes_on_the_stream_once_its_scheduler_names_bind(mux):
    first = mux.admit(_request("r1"), 30.0, {}, _no_fallback)
    await _settle()
    stream = mux.stub.calls[0]
    stream.answer(_decision(first.id, worker=""))
    await first.read()
    bound = asyncio.ensure_future(mux.bind(pb.BindRequest(request_id="r1", worker_id="w2"), 5.0, {"traceparent": "tp"}))
    await _settle()
    op = stream.ops()[-1]
    assert op.WhichOneof("op") == "bind" and op.bind.request.worker_id == "w2" and op.bind.traceparent == "tp"
    stream.answer(pb.MuxResult(id=op.id, bind=pb.BindResponse(bound=True)))
    assert (await bound).bound and mux.pending == 0
    # An error answers as the unary Bind would have ended.
    failing = asyncio.ensure_future(mux.bind(pb.BindRequest(request_id="r9", worker_id="w2"), 5.0, {}))
    await _settle()
    stream.answer(pb.MuxResult(id=stream.ops()[-1].id, error=pb.MuxError(code=grpc.StatusCode.NOT_FOUND.value[0])))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await failing
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_scheduler_that_does_not_name_bind_gets_the_unary_bind(mux):
    """A scheduler from before MuxBind answers an op it does not know INVALID_ARGUMENT: never send it one."""
    mux.stub.AdmitMux = lambda: _old_call(mux.stub)
    first = mux.admit(_request("r1"), 30.0, {}, _no_fallback)
    await _settle()
    mux.stub.calls[0].answer(_decision(first.id))
    await first.read()
    with pytest.raises(MuxUnsupported):
        await mux.bind(pb.BindRequest(request_id="r1", worker_id="w2"), 5.0, {})
    assert all(op.WhichOneof("op") != "bind" for op in mux.stub.calls[0].ops())


def _old_call(stub: ScriptedStub) -> ScriptedCall:
    call = ScriptedCall()
    call.metadata = ()
    stub.calls.append(call)
    return call
