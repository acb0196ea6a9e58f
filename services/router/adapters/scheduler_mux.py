"""The router's AdmitMux stream to one scheduler replica (issue 24): its turns' admissions, binds and
completions as operations on one long-lived stream instead of an AdmitStream, a Bind and a Complete call
per turn.

Each operation reads as the call it replaces, so that the scheduler client (scheduler.py) keeps its
windows, failover and fail-open rules unchanged: `admit` returns a call whose `read()` gives the
AdmitUpdates (`held`, then the decision) or raises the `AioRpcError` that AdmitStream would have ended
with (a standby's FAILED_PRECONDITION carries the leader in its trailing metadata, as there), and whose
`cancel()` withdraws the admission; `complete` answers or raises as the unary Complete does.

A broken stream that had answered fails the operations pending on it, each with the stream's status, and
nothing else; the next operation reopens it. A stream that ended before it answered anything tells nothing
(`MuxNotNow`): its pending operations, and every operation until it is reopened after a backoff (50 ms
doubling to 1 s), take the per-call path, whose answer or failure decides. A replica without AdmitMux
(an older scheduler: UNIMPLEMENTED) is remembered, and its
operations go by the per-call path (`fallback`).

Writes are coalesced: what the router's turns queue in one event-loop turn goes in one message, and what
they queue while a write is under way in the next. A write that does not complete within `write_stall_s`
(the scheduler stopped reading) ends the stream, and past `MAX_QUEUED` waiting operations each takes the
per-call path: a frozen scheduler holds neither the writer nor the router's memory. A decision that arrives
for an admission already withdrawn (its cancel crossed the decision) is ended with Complete(NOT_STARTED),
the exact rollback; a `held` for one is answered with the cancel once more (an older scheduler ignored a
cancel that crossed the write of a `held`).

Binds go on the stream too, once its scheduler has named "bind" among the operations it takes (the
stream's initial metadata, `bandmaster-mux-ops`); before that, and to a scheduler from before MuxBind,
`bind` raises MuxUnsupported and the client makes the unary Bind.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import grpc

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.common.outbound.leader_follow import LEADER_METADATA_KEY, MUX_OPS_METADATA_KEY
from services.common.outbound.retry import RetryPolicy

log = logging.getLogger(__name__)

MAX_WITHDRAWN = 10_000
"""Withdrawn admits whose last result is awaited (to end a decision that crossed the cancel); past it the
oldest is forgotten, and its decision, if one comes, is rolled back at its lease instead (never confirmed)."""
REOPEN = RetryPolicy(first_delay_s=0.05, multiplier=2.0, max_delay_s=1.0)
"""Between reopenings of a stream that ended before answering anything."""
BASE_OPS = frozenset({"admit", "cancel", "complete"})
"""What every AdmitMux stream takes, also a scheduler's from before it named its operations."""
MAX_QUEUED = 10_000
"""Operations waiting for the stream's writer; past it (a write that does not complete: a scheduler that
stopped reading) an operation takes the per-call path, which has deadlines of its own, instead of growing
the queue."""


class MuxUnsupported(Exception):
    """The replica has no AdmitMux (an older scheduler): use the per-call path."""


class MuxNotNow(MuxUnsupported):
    """The stream could not carry this operation: it ended before answering anything (an older scheduler
    that closed it while the router wrote, which gRPC may report as INTERNAL instead of UNIMPLEMENTED; a
    replica that is down; a standby's refusal), or it waits to be reopened. The operation takes the
    per-call path, whose answer or failure the client's failover and fail-open rules read as before."""


def _mux_ops(metadata: Any) -> frozenset[str]:
    """The operations a stream's initial metadata names (BASE_OPS when it names none)."""
    for key, value in metadata or ():
        if key == MUX_OPS_METADATA_KEY:
            named = value.decode() if isinstance(value, bytes) else str(value)
            return frozenset(op.strip() for op in named.split(",") if op.strip())
    return BASE_OPS


def rpc_error(code: grpc.StatusCode, details: str, leader_address: str | None = None) -> grpc.aio.AioRpcError:
    """The AioRpcError a call would have raised; a standby's refusal names the leader as its trailers do."""
    trailing = grpc.aio.Metadata()
    if leader_address is not None:
        trailing.add(LEADER_METADATA_KEY, leader_address)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details)


def _result_error(error: pb.MuxError) -> grpc.aio.AioRpcError:
    code = _CODES.get(error.code, grpc.StatusCode.UNKNOWN)
    return rpc_error(code, error.message, error.leader_address if code is grpc.StatusCode.FAILED_PRECONDITION else None)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _stream_error(exc: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    """What the operations pending on a stream that ended with `exc` fail with. The scheduler answers each
    operation in its own result; the stream's own status is its refusal (a standby's FAILED_PRECONDITION,
    which names the leader) or the transport's failure, which gRPC reports on a broken bidirectional
    stream as INTERNAL or UNKNOWN as often as UNAVAILABLE: each pending operation then fails UNAVAILABLE,
    as its AdmitStream call on that connection would have."""
    if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE):
        return exc
    return rpc_error(grpc.StatusCode.UNAVAILABLE, f"the AdmitMux stream broke: {exc.code().name}: {exc.details()}")


class MuxAdmitCall:
    """One admission on the stream, read as an AdmitStream call. If the replica turns out to have no
    AdmitMux, the admission is made by `fallback()` (an AdmitStream call) instead, transparently."""

    def __init__(self, mux: SchedulerMux, op_id: int, request: pb.AdmitRequest, fallback: Callable[[], Any]) -> None:
        self._mux = mux
        self.id = op_id
        self.request = request
        self._fallback = fallback
        self._inner: Any = None
        self.updates: asyncio.Queue[pb.AdmitUpdate | BaseException] = asyncio.Queue()

    async def read(self) -> pb.AdmitUpdate:
        if self._inner is not None:
            return await self._inner.read()
        item = await self.updates.get()
        if isinstance(item, MuxUnsupported):
            self._inner = self._fallback()
            return await self._inner.read()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        if self._inner is not None:
            self._inner.cancel()
        else:
            self._mux.withdraw(self)


class SchedulerMux:
    """The AdmitMux stream to one replica, opened on the first operation and after each break."""

    def __init__(self, stub: pb_grpc.SchedulerStub, address: str, write_stall_s: float) -> None:
        self._stub = stub
        self.address = address
        # A write that has not completed in this long (the scheduler stopped reading: frozen, or its
        # connection is) carries nothing that can still be answered in time: the stream is ended.
        self._write_stall_s = write_stall_s
        self.unsupported = False
        self._call: Any = None
        self._tasks: list[asyncio.Task] = []
        self._queued: list[pb.MuxOp] = []
        self._wake = asyncio.Event()
        self._next_id = 0
        self._admits: dict[int, MuxAdmitCall] = {}
        # Completes and binds waiting for their answer: the kind of result each expects, and its future.
        self._unaries: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        # The operations the current stream's scheduler takes (its initial metadata); until it has sent
        # them, and on a scheduler from before the list, admit, cancel and complete.
        self._ops: frozenset[str] = BASE_OPS
        self._withdrawn: dict[int, pb.AdmitRequest] = {}  # cancelled; their decision may still come
        self._cancel_resent: set[int] = set()  # withdrawn ids whose cancel went again (a `held` crossed it)
        self._answered = False  # the current stream delivered a result
        self._failures = 0  # streams in a row that ended before answering anything
        self._retry_at = 0.0

    @property
    def pending(self) -> int:
        return len(self._admits) + len(self._unaries)

    def admit(
        self, request: pb.AdmitRequest, timeout_s: float, trace_carrier: dict[str, str], fallback: Callable[[], Any]
    ) -> MuxAdmitCall:
        call = MuxAdmitCall(self, self._take_id(), request, fallback)
        refusal = self._open()
        if refusal is not None:
            call.updates.put_nowait(refusal)
            return call
        self._admits[call.id] = call
        admit = pb.MuxAdmit(
            request=request,
            timeout_seconds=timeout_s,
            traceparent=trace_carrier.get("traceparent", ""),
            tracestate=trace_carrier.get("tracestate", ""),
        )
        self._queue(pb.MuxOp(id=call.id, admit=admit))
        return call

    async def complete(
        self, request: pb.CompleteRequest, timeout_s: float, trace_carrier: dict[str, str]
    ) -> pb.CompleteResponse:
        """Complete on the stream; raises as the unary call would (MuxUnsupported: make that call)."""
        op = pb.MuxComplete(
            request=request,
            traceparent=trace_carrier.get("traceparent", ""),
            tracestate=trace_carrier.get("tracestate", ""),
        )
        return await self._unary("complete", lambda op_id: pb.MuxOp(id=op_id, complete=op), timeout_s)

    async def bind(self, request: pb.BindRequest, timeout_s: float, trace_carrier: dict[str, str]) -> pb.BindResponse:
        """Bind on the stream; raises as the unary call would (MuxUnsupported: make that call, as for a
        scheduler whose stream has not named "bind" among its operations)."""
        if "bind" not in self._ops:
            raise MuxUnsupported(self.address)
        op = pb.MuxBind(
            request=request,
            traceparent=trace_carrier.get("traceparent", ""),
            tracestate=trace_carrier.get("tracestate", ""),
        )
        return await self._unary("bind", lambda op_id: pb.MuxOp(id=op_id, bind=op), timeout_s)

    async def _unary(self, kind: str, make_op: Callable[[int], pb.MuxOp], timeout_s: float) -> Any:
        refusal = self._open()
        if refusal is not None:
            raise refusal
        op_id = self._take_id()
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._unaries[op_id] = (kind, answer)
        self._queue(make_op(op_id))
        try:
            async with asyncio.timeout(timeout_s):
                return await answer
        except TimeoutError:
            message = f"{kind.capitalize()} on the AdmitMux stream timed out"
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, message) from None
        finally:
            self._unaries.pop(op_id, None)

    def withdraw(self, call: MuxAdmitCall) -> None:
        """The caller gave up on `call`: the scheduler rolls its admission back (or, if its decision was
        already on its way, the decision is answered with Complete(NOT_STARTED))."""
        if self._admits.pop(call.id, None) is None or self._call is None:
            return  # answered already, or the stream broke (the scheduler rolled it back)
        self._withdrawn[call.id] = call.request
        if len(self._withdrawn) > MAX_WITHDRAWN:  # a replica that stopped answering: bounded memory
            oldest = next(iter(self._withdrawn))
            del self._withdrawn[oldest]
            self._cancel_resent.discard(oldest)
        self._queue(pb.MuxOp(id=call.id, cancel=pb.MuxCancel()))

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the stream --------------------------------------------------------------------------------

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _queue(self, op: pb.MuxOp) -> None:
        self._queued.append(op)
        self._wake.set()

    def _open(self) -> BaseException | None:
        """Open the stream if it is not; the error an operation fails with at once when it cannot be."""
        if self.unsupported:
            return MuxUnsupported(self.address)
        if self._call is not None:
            return MuxNotNow(self.address) if len(self._queued) >= MAX_QUEUED else None
        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at:
            return MuxNotNow(self.address)
        self._call = self._stub.AdmitMux()
        self._answered = False
        self._tasks = [loop.create_task(self._write(self._call)), loop.create_task(self._read(self._call))]
        return None

    async def _write(self, call: Any) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                ops, self._queued = self._queued, []
                if ops:
                    async with asyncio.timeout(self._write_stall_s):
                        await call.write(pb.MuxRequest(ops=ops))
        except TimeoutError:
            log.warning(
                "AdmitMux write to %s stalled for %.1f s (the scheduler does not read): the stream is ended",
                self.address,
                self._write_stall_s,
            )
            call.cancel()
        except Exception as exc:  # the call ended under the write, or it cannot be written: end it
            log.debug("AdmitMux write to %s failed: %r", self.address, exc)
            call.cancel()

    async def _read(self, call: Any) -> None:
        error: BaseException
        try:
            self._ops = _mux_ops(await call.initial_metadata())
            async for response in call:
                self._answered = True
                for result in response.results:
                    self._dispatch(result)
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, "the AdmitMux stream ended")
        except grpc.aio.AioRpcError as exc:
            error = _stream_error(exc)
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                log.info("scheduler %s has no AdmitMux: Admit and Complete go by calls of their own", self.address)
                self.unsupported = True
                error = MuxUnsupported(self.address)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # closed
            # The call was cancelled here (its write failed): a broken stream, as the scheduler's end sees it.
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, "the AdmitMux stream broke (a write failed)")
        finally:
            self._ended()
        if not self._answered and not isinstance(error, MuxUnsupported):
            # Nothing was answered on it: the scheduler rolls back what it had begun of the pending
            # operations when the stream ends, so each is made again by the per-call path.
            error = MuxNotNow(self.address)
        log.debug("AdmitMux stream to %s ended: %r", self.address, error)
        self._fail_pending(error)

    def _ended(self) -> None:
        self._call = None
        self._ops = BASE_OPS  # the next stream's scheduler names its own
        self._queued.clear()
        self._withdrawn.clear()  # the scheduler rolled back whatever was pending on the stream
        self._cancel_resent.clear()
        if self._answered:
            self._failures = 0
            self._retry_at = 0.0
        else:
            self._failures += 1
            self._retry_at = asyncio.get_running_loop().time() + REOPEN.delay_s(self._failures)
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()

    def _fail_pending(self, error: BaseException) -> None:
        admits, self._admits = self._admits, {}
        for admit in admits.values():
            admit.updates.put_nowait(error)
        unaries, self._unaries = self._unaries, {}
        for _, answer in unaries.values():
            if not answer.done():
                answer.set_exception(error)
                answer.add_done_callback(lambda f: f.exception())  # a timed-out caller may be gone

    def _dispatch(self, result: pb.MuxResult) -> None:
        kind = result.WhichOneof("result")
        admit = self._admits.get(result.id)
        if admit is not None:
            if kind == "admit":
                admit.updates.put_nowait(result.admit)
                if result.admit.HasField("decision"):
                    del self._admits[result.id]
            else:
                del self._admits[result.id]
                admit.updates.put_nowait(
                    _result_error(result.error)
                    if kind == "error"
                    else rpc_error(grpc.StatusCode.INTERNAL, f"AdmitMux answered an admit with {kind}")
                )
            return
        unary = self._unaries.get(result.id)
        if unary is not None:
            expected, answer = unary
            if not answer.done():
                if kind == expected:
                    answer.set_result(getattr(result, expected))
                else:
                    answer.set_exception(
                        _result_error(result.error)
                        if kind == "error"
                        else rpc_error(grpc.StatusCode.INTERNAL, f"AdmitMux answered a {expected} with {kind}")
                    )
            return
        withdrawn = self._withdrawn.get(result.id)
        if withdrawn is None:
            return  # a result nobody waits for (a timed-out Complete)
        if kind == "admit" and not result.admit.HasField("decision"):
            # A `held` of a withdrawn admit. A scheduler from before 3ced290 ignored a cancel that crossed the
            # write of that `held`, and kept the admission held with nobody waiting: the cancel goes again,
            # once (to a scheduler that took the first, it names nothing pending and is ignored).
            if result.id not in self._cancel_resent:
                self._cancel_resent.add(result.id)
                self._queue(pb.MuxOp(id=result.id, cancel=pb.MuxCancel()))
            return
        del self._withdrawn[result.id]
        self._cancel_resent.discard(result.id)
        if kind == "admit":
            # The decision crossed our cancel: the admission stands there. End it as never started.
            done = pb.CompleteRequest(
                session_id=withdrawn.session_id,
                request_id=withdrawn.request_id,
                worker_id=result.admit.decision.worker_id,
                dp_rank=result.admit.decision.dp_rank,
                outcome=pb.TURN_OUTCOME_NOT_STARTED,
            )
            self._queue(pb.MuxOp(id=self._take_id(), complete=pb.MuxComplete(request=done)))
