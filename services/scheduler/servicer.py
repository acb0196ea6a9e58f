"""The gRPC edge of the scheduler. Thin: validate, call the runtime, convert, map errors.

Domain errors map to status codes in `DOMAIN_ERRORS` and nowhere else. `Admit` may hold the call while
its program is paused; whatever ends the call before its answer is handed to gRPC (client cancel,
deadline, shutdown, a closed channel), held or not, rolls the admission back before the RPC ends.

Every RPC but GetRouterConfig and GetLeadership asks the replica (services/scheduler/election.py) for the
deciding runtime: a standby ends the call FAILED_PRECONDITION with the leader's address in the
`bandmaster-scheduler-leader` trailing metadata. With leader election, Admit, Complete and Release are
answered only once their change is in the store (group commit), and a term that ends under a call
answers it UNAVAILABLE (rolled back), so its router retries on the new leader.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Awaitable, Callable, Coroutine

import grpc
from opentelemetry import propagate, trace
from prometheus_client import Gauge

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.common.observe.telemetry import grpc_parent
from services.common.outbound.leader_follow import LEADER_METADATA_KEY, MUX_OPS_METADATA_KEY
from services.common.serve.grpc_errors import ErrorTable
from services.scheduler.adapters.proto import (
    InvalidArgument,
    WallTime,
    decision_to_proto,
    event_kinds_from_proto,
    event_to_proto,
    outcome_from_proto,
    program_to_proto,
    replica_from_fields,
    replica_stats_to_proto,
    router_config_to_proto,
    stats_to_proto,
    validate_request_id,
    validate_session_id,
    validate_tokens,
    validate_ttft,
)
from services.scheduler.core import DuplicateRequest, MissingRequestId, RequestMismatch, Verdict
from services.scheduler.core.defaults import KvRouterConfig
from services.scheduler.election import Election, NotLeader, SingleReplica
from services.scheduler.loop import SchedulerRuntime, ShuttingDown

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Scheduler"].full_name
MAX_RENEW_IDS = 10_000
"""RenewLeases ids per call (10,000 ids of up to 256 bytes stay under gRPC's 4 MB message limit)."""
DELIVERY_TIMEOUT_S = 10.0
"""How long an Admit answer may wait for its call to take it (a stalled stream's flow control) before
the admission is rolled back instead."""


class ProgramNotFound(LookupError):
    """GetProgram for an unknown session id (gRPC: NOT_FOUND)."""


class HoldDeadlineExceeded(Exception):
    """The caller's deadline passed while its admission was held (gRPC: DEADLINE_EXCEEDED)."""


class AnswerNotTaken(Exception):
    """The call did not take its answer within the delivery bound; rolled back (gRPC: DEADLINE_EXCEEDED)."""


DOMAIN_ERRORS = ErrorTable(
    [
        ((InvalidArgument, MissingRequestId, RequestMismatch), grpc.StatusCode.INVALID_ARGUMENT),
        (DuplicateRequest, grpc.StatusCode.ALREADY_EXISTS),
        (ProgramNotFound, grpc.StatusCode.NOT_FOUND),
        (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
        (NotLeader, grpc.StatusCode.FAILED_PRECONDITION),
        ((HoldDeadlineExceeded, AnswerNotTaken), grpc.StatusCode.DEADLINE_EXCEEDED),
    ]
)
"""The one mapping from the scheduler's domain errors to gRPC codes."""


class SchedulerServicer(pb_grpc.SchedulerServicer):
    def __init__(
        self,
        replica: SingleReplica | Election | SchedulerRuntime,
        kv_router: KvRouterConfig,
        tracer: trace.Tracer,
        *,
        delivery_timeout_s: float = DELIVERY_TIMEOUT_S,
        held_heartbeat_s: float | None = None,
        mux_streams: Gauge | None = None,
    ) -> None:
        """`replica`: who decides (a bare runtime = a single scheduler). `held_heartbeat_s`: re-send `held`
        this often on a held AdmitStream (default: with leader election, 1 s; otherwise never)."""
        if isinstance(replica, SchedulerRuntime):
            replica = SingleReplica(replica, lambda: "")
        self.replica = replica
        if held_heartbeat_s is None:
            held_heartbeat_s = 1.0 if isinstance(replica, Election) else 0.0
        self.held_heartbeat_s = held_heartbeat_s
        self.kv_router = kv_router
        self.tracer = tracer
        # A no-op tracer records nothing: an AdmitMux operation then needs no parent context and no span
        # (the caller's W3C fields are not parsed: about a fifth of the scheduler's own CPU per turn).
        self.recording = not isinstance(tracer, trace.NoOpTracer)
        self.delivery_timeout_s = delivery_timeout_s
        self.mux_streams = mux_streams
        """AdmitMux streams open (a gauge), when the server exports metrics."""

    def _runtime(self, context: grpc.aio.ServicerContext) -> SchedulerRuntime:
        """The deciding runtime, or NotLeader with the leader's address in the trailing metadata."""
        try:
            return self._current()
        except NotLeader as exc:
            context.set_trailing_metadata(((LEADER_METADATA_KEY, exc.leader_address),))
            raise

    async def Admit(self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext) -> pb.AdmitResponse:
        async def deliver(response: pb.AdmitResponse) -> None:
            # An await on the call itself: a cancel that reached the server while the decision was made
            # (it sits in gRPC's queue until this task awaits) lands here, before the answer is sent.
            await context.send_initial_metadata(())

        return await self._admit(request, context, None, deliver)

    async def AdmitStream(self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext) -> None:
        """Admit, with `held` sent as soon as the call is held (the router's decision deadline covers
        only the first message)."""

        async def on_held(runtime: SchedulerRuntime) -> None:
            await context.write(
                pb.AdmitUpdate(
                    held=pb.AdmitHeld(
                        max_hold_seconds=runtime.core.params.resume_timeout_seconds,
                        heartbeat_seconds=self.held_heartbeat_s,
                    )
                )
            )

        async def deliver(response: pb.AdmitResponse) -> None:
            await context.write(pb.AdmitUpdate(decision=response))

        await self._admit(request, context, on_held, deliver)

    async def AdmitMux(self, request_iterator: AsyncIterator[pb.MuxRequest], context: grpc.aio.ServicerContext) -> None:
        """Admit (as AdmitStream), cancel and Complete multiplexed on one stream per router (issue 24): one
        call instead of two per turn. A standby refuses the stream as it refuses any call."""
        async with DOMAIN_ERRORS.guard(context):
            self._runtime(context)
        if self.mux_streams is not None:
            self.mux_streams.inc()
        try:
            await MuxStream(self, context).serve(request_iterator)
        finally:
            if self.mux_streams is not None:
                self.mux_streams.dec()

    def _current(self) -> SchedulerRuntime:
        """The deciding runtime, or NotLeader (an AdmitMux operation answers it in its MuxError)."""
        try:
            return self.replica.current()
        except NotLeader:
            self.replica.refused()
            raise

    async def _admit(
        self,
        request: pb.AdmitRequest,
        context: grpc.aio.ServicerContext,
        on_held: Callable[[SchedulerRuntime], Awaitable[None]] | None,
        deliver: Callable[[pb.AdmitResponse], Awaitable[None]],
    ) -> pb.AdmitResponse:
        # Unary Admit: a child of the instrumentation's SERVER span. AdmitStream is not instrumented (a
        # streaming handler, see GrpcServerTracing): this span is its SERVER span, from the metadata.
        trace_parent, kind = grpc_parent(context)
        with self.tracer.start_as_current_span("scheduler.admit", context=trace_parent, kind=kind) as span:
            async with DOMAIN_ERRORS.guard(context):
                runtime = self._runtime(context)
                return await self._decide(runtime, request, span, context.time_remaining, on_held, deliver)
        raise AssertionError("unreachable: the guard aborts the call")  # pragma: no cover

    async def _decide(
        self,
        runtime: SchedulerRuntime,
        request: pb.AdmitRequest,
        span: trace.Span,
        time_remaining: Callable[[], float | None],
        on_held: Callable[[SchedulerRuntime], Awaitable[None]] | None,
        deliver: Callable[[pb.AdmitResponse], Awaitable[None]],
    ) -> pb.AdmitResponse:
        """Decide, then deliver: the admission is a transaction that commits only once `deliver` (an
        await on the call) returned. A call cancelled, timed out or broken before that is rolled back
        to the exact table it found, whether it was held, waiting at the gate or already placed. The one
        admission path of Admit, AdmitStream and each AdmitMux admit; raises the domain errors.
        `time_remaining`: seconds left of the caller's deadline (None = none)."""
        session_id = validate_session_id(request.session_id)
        parent = validate_session_id(request.parent_session_id, "parent_session_id")
        request_id = validate_request_id(request.request_id)
        validate_tokens(estimated_prompt_tokens=request.estimated_prompt_tokens)
        span.set_attribute("scheduler.passthrough", not session_id)
        dispatched = request.dispatched and bool(session_id)
        dispatched_replica = (
            replica_from_fields(request.dispatched_worker_id, request.dispatched_dp_rank) if dispatched else None
        )
        if dispatched:
            span.set_attribute("scheduler.dispatched", True)
        if runtime.gated(session_id) and not dispatched:
            span.add_event("scheduler.gated")
            if on_held is not None:
                await on_held(runtime)
            try:
                # Awaited in this task (not through wait_for's inner task, which on Python 3.11
                # swallows a cancellation that lands as the gate opens): a cancelled call stops
                # here, and one that passes admits before anything else can run.
                async with asyncio.timeout(time_remaining()):
                    await self._heartbeat(runtime.pass_gate(session_id), runtime, on_held)
            except TimeoutError:
                raise HoldDeadlineExceeded("deadline exceeded while another turn of the program was held") from None
        if runtime.stopping:  # the term ended while this call waited at the gate
            raise ShuttingDown(runtime.stop_reason)
        result = runtime.admit(
            session_id,
            parent,
            request.estimated_prompt_tokens,
            request_id,
            dispatched=dispatched,
            dispatched_replica=dispatched_replica,
        )
        decision = result.decision
        held = decision.verdict is Verdict.WAIT
        span.set_attribute("scheduler.held", held)
        if held:
            span.add_event("scheduler.held")
            decision = await self._hold(runtime, request_id, time_remaining(), on_held)
            span.add_event("scheduler.resumed", {"scheduler.forced_resume": decision.forced_resume})
        span.set_attribute("scheduler.pinned", decision.pinned)
        span.set_attribute("scheduler.was_paused", decision.was_paused)
        span.set_attribute("scheduler.forced_resume", decision.forced_resume)
        span.set_attribute("scheduler.priority", decision.priority)
        response = decision_to_proto(decision, runtime.core.ticket_lease_seconds)
        delivered = False
        try:
            # Leader election: the admission is in the store before its answer leaves (a failover
            # after the answer cannot lose it); a term that ended meanwhile rolls it back here.
            await self.replica.commit(runtime)
            async with asyncio.timeout(self.delivery_timeout_s):
                await deliver(response)
            delivered = True
        except TimeoutError:
            raise AnswerNotTaken(
                f"the answer was not taken within {self.delivery_timeout_s:g}s; admission rolled back"
            ) from None
        finally:
            if not delivered:
                span.add_event("scheduler.rolled_back")
                runtime.cancel(request_id)
        return response

    async def _heartbeat(
        self,
        waiting: Awaitable,
        runtime: SchedulerRuntime,
        on_held: Callable[[SchedulerRuntime], Awaitable[None]] | None,
    ):
        """Await `waiting`, re-sending `held` every `held_heartbeat_s` (AdmitStream with leader election):
        the caller then tells a live hold from a frozen or deposed leader within about that."""
        if on_held is None or self.held_heartbeat_s <= 0:
            return await waiting
        task = asyncio.ensure_future(waiting)
        try:
            while True:
                done, _ = await asyncio.wait((task,), timeout=self.held_heartbeat_s)
                if done:
                    return task.result()
                await on_held(runtime)
        finally:
            if not task.done():
                task.cancel()

    async def _hold(
        self,
        runtime: SchedulerRuntime,
        request_id: str,
        timeout: float | None,
        on_held: Callable[[SchedulerRuntime], Awaitable[None]] | None = None,
    ):
        """Wait for the resolution; roll back on cancellation or the caller's deadline.

        The wait runs in this task under `asyncio.timeout`: `asyncio.wait_for` (Python 3.11) returns the
        inner result when the call is cancelled just as it resolves, and a cancelled call then went on
        holding an admission nobody waited for until its deadline."""
        resolved = False
        # Taken before writing "held": the program may be resumed while that write is under way.
        resolution = runtime.wait(request_id)
        try:
            if on_held is not None:
                await on_held(runtime)
            async with asyncio.timeout(timeout):
                decision = await self._heartbeat(resolution, runtime, on_held)
            resolved = True
            return decision
        except TimeoutError:
            raise HoldDeadlineExceeded(
                "deadline exceeded while the program was paused; admission rolled back"
            ) from None
        finally:
            if not resolved:
                resolution.cancel()
                runtime.cancel(request_id)

    async def RenewLeases(
        self, request: pb.RenewLeasesRequest, context: grpc.aio.ServicerContext
    ) -> pb.RenewLeasesResponse:
        async with DOMAIN_ERRORS.guard(context):
            runtime = self._runtime(context)
            if len(request.request_ids) > MAX_RENEW_IDS:
                raise InvalidArgument(f"request_ids: at most {MAX_RENEW_IDS} per call, got {len(request.request_ids)}")
            if len(request.delivered_request_ids) > MAX_RENEW_IDS:
                raise InvalidArgument(
                    f"delivered_request_ids: at most {MAX_RENEW_IDS} per call, got {len(request.delivered_request_ids)}"
                )
            ids = [validate_request_id(rid, f"request_ids[{i}]") for i, rid in enumerate(request.request_ids)]
            delivered = [
                validate_request_id(rid, f"delivered_request_ids[{i}]")
                for i, rid in enumerate(request.delivered_request_ids)
            ]
            unknown = runtime.renew_leases(ids, delivered)
            return pb.RenewLeasesResponse(
                renewed=len(set(ids) | set(delivered)) - len(unknown),
                unknown_request_ids=unknown,
                lease_ttl_seconds=runtime.core.ticket_lease_seconds,
            )

    async def Bind(self, request: pb.BindRequest, context: grpc.aio.ServicerContext) -> pb.BindResponse:
        async with DOMAIN_ERRORS.guard(context):
            return self._bind(self._runtime(context), request, trace.get_current_span())

    def _bind(self, runtime: SchedulerRuntime, request: pb.BindRequest, span: trace.Span) -> pb.BindResponse:
        """The one Bind path (the unary call and each AdmitMux bind); raises the domain errors."""
        request_id = validate_request_id(request.request_id)
        replica = replica_from_fields(request.worker_id, request.dp_rank)
        if replica is None:
            raise InvalidArgument("worker_id is required")
        bound = runtime.bind(request_id, replica)
        span.set_attribute("scheduler.bound", bound)
        return pb.BindResponse(bound=bound)

    async def Complete(self, request: pb.CompleteRequest, context: grpc.aio.ServicerContext) -> pb.CompleteResponse:
        async with DOMAIN_ERRORS.guard(context):
            runtime = self._runtime(context)
            await self._complete(runtime, request, trace.get_current_span())  # the instrumentation's SERVER span
            return pb.CompleteResponse()

    async def _complete(self, runtime: SchedulerRuntime, request: pb.CompleteRequest, span: trace.Span) -> None:
        """The one Complete path (the unary call and each AdmitMux complete); raises the domain errors."""
        session_id = validate_session_id(request.session_id)
        request_id = validate_request_id(request.request_id)
        validate_tokens(
            prompt_tokens=request.prompt_tokens,
            completion_tokens=request.completion_tokens,
            cached_tokens=request.cached_tokens,
        )
        replica = replica_from_fields(request.worker_id, request.dp_rank)
        outcome = outcome_from_proto(request.outcome)
        ttft_s = validate_ttft(request.ttft_seconds)
        runtime.complete(
            session_id,
            request_id,
            replica,
            request.prompt_tokens,
            request.completion_tokens,
            request.cached_tokens,
            outcome,
            ttft_s=ttft_s or None,
        )
        await self.replica.commit(runtime)
        span.set_attribute("scheduler.outcome", outcome.value)
        span.set_attribute("scheduler.prompt_tokens", request.prompt_tokens)
        span.set_attribute("scheduler.cached_tokens", request.cached_tokens)

    async def Release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        async with DOMAIN_ERRORS.guard(context):
            runtime = self._runtime(context)
            session_id = validate_session_id(request.session_id)
            if not session_id:
                raise InvalidArgument("session_id is required")
            released = runtime.release(session_id)
            await self.replica.commit(runtime)
            trace.get_current_span().set_attribute("scheduler.released", released)
            return pb.ReleaseResponse(released=released)

    async def GetProgram(self, request: pb.GetProgramRequest, context: grpc.aio.ServicerContext) -> pb.Program:
        async with DOMAIN_ERRORS.guard(context):
            runtime = self._runtime(context)
            session_id = validate_session_id(request.session_id)
            view = runtime.core.program(session_id) if session_id else None
            if view is None:
                raise ProgramNotFound(f"no program {session_id!r}")
            return program_to_proto(view, WallTime.now(runtime.clock))

    async def ListPrograms(
        self, request: pb.ListProgramsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListProgramsResponse:
        async with DOMAIN_ERRORS.guard(context):
            runtime = self._runtime(context)
        clock = runtime.clock
        now = clock.monotonic()
        wall = WallTime.now(clock)
        core = runtime.core
        return pb.ListProgramsResponse(
            programs=[program_to_proto(v, wall) for v in core.programs(now)],
            replicas=[replica_stats_to_proto(r) for r in core.replica_stats(now)],
        )

    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProgramEvent]:
        async with DOMAIN_ERRORS.guard(context):
            runtime = self._runtime(context)
        queue = runtime.subscribe(event_kinds_from_proto(request.exclude_kinds))
        try:
            # Subscribed: say so at once (a router's admission fast path counts on the stream only once
            # it knows that every later change reaches it).
            await context.send_initial_metadata(())
            while True:
                await queue.wake.wait()
                queue.wake.clear()
                if queue.closed:
                    return
                if request.end_on_gap and queue.dropped:
                    return  # this watcher must see every change: it re-subscribes
                wall = WallTime.now(runtime.clock)
                while queue.events:
                    yield event_to_proto(queue.events.popleft(), wall)
        finally:
            runtime.unsubscribe(queue)

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.Stats:
        async with DOMAIN_ERRORS.guard(context):
            runtime = self._runtime(context)
        stats = stats_to_proto(runtime.core.stats(runtime.clock.monotonic()))
        recovery = runtime.recovery
        if recovery is not None:
            stats.state_recovery_seconds = recovery.seconds
            stats.state_recovered_programs = recovery.programs
        return stats

    async def GetRouterConfig(
        self, request: pb.GetRouterConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.RouterConfig:
        return router_config_to_proto(self.kv_router)

    async def GetLeadership(self, request: pb.GetLeadershipRequest, context: grpc.aio.ServicerContext) -> pb.Leadership:
        view = self.replica.view()
        return pb.Leadership(
            role=view.role,
            replica_id=view.replica_id,
            address=view.address,
            leader_address=view.leader_address,
            epoch=view.epoch,
            leader_for_seconds=view.leader_for_s,
            terms_total=view.terms,
        )


def _is_decision(result: pb.MuxResult) -> bool:
    return result.WhichOneof("result") == "admit" and result.admit.HasField("decision")


class MuxStream:
    """One AdmitMux stream: each admit runs `SchedulerServicer._decide` in a task of its own (it may be
    held), each complete `_complete`; their results go out coalesced, one MuxResponse per event-loop turn
    that had any (no timer).

    Delivery is AdmitStream's: an admission commits once the write that carries its decision returned. A
    cancel withdraws an admission whose decision is not yet in a write under way (rolled back, answered
    CANCELLED); otherwise its decision stands and the caller ends the turn with Complete(NOT_STARTED).
    Whatever ends the stream (the caller gone, a broken write, shutdown) rolls back every admission still
    pending on it, as a cancelled AdmitStream is."""

    def __init__(self, servicer: SchedulerServicer, context: grpc.aio.ServicerContext) -> None:
        self.servicer = servicer
        self.context = context
        self.pending: dict[int, asyncio.Task] = {}
        self.admits: set[int] = set()  # the pending ids that are admits (what a cancel may withdraw)
        self.cancelled: set[int] = set()  # ids the caller withdrew while pending
        self.outbox: dict[int, pb.MuxResult] = {}  # a later update of an id replaces an unsent one
        self.in_write: frozenset[int] = frozenset()  # admits whose decision is in the write under way
        self.flushed: asyncio.Future[None] | None = None  # resolves when the outbox's write returned
        self.wake = asyncio.Event()

    async def serve(self, request_iterator: AsyncIterator[pb.MuxRequest]) -> None:
        # What this scheduler takes on the stream, before anything else: a router sends an operation an
        # older scheduler would not know (bind) only to one that names it here.
        await self.context.send_initial_metadata(((MUX_OPS_METADATA_KEY, MUX_OPS),))
        reader = asyncio.ensure_future(self._read(request_iterator))
        writer = asyncio.ensure_future(self._write())
        try:
            await asyncio.wait((reader, writer), return_when=asyncio.FIRST_COMPLETED)
            if writer.done():
                writer.result()  # a broken write ends the stream
            reader.result()  # raises what ended the read (a protocol error)
            # The caller half-closed: answer what is pending, then end the call.
            while self.pending:
                await asyncio.wait(tuple(self.pending.values()))
            if self.outbox:
                async with asyncio.timeout(self.servicer.delivery_timeout_s):
                    await self._flushed()
        finally:
            reader.cancel()
            tasks = tuple(self.pending.values())
            for task in tasks:
                task.cancel()  # each rolls its admission back in its own finally
            await asyncio.gather(*tasks, return_exceptions=True)
            writer.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)

    async def _read(self, request_iterator: AsyncIterator[pb.MuxRequest]) -> None:
        async for request in request_iterator:
            for op in request.ops:
                kind = op.WhichOneof("op")
                if kind == "cancel":
                    self._cancel(op.id)
                    continue
                if op.id in self.pending:
                    await self.context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT, f"operation id {op.id} is already pending on this stream"
                    )
                if len(self.pending) >= MAX_MUX_PENDING:
                    self._send(op.id, _mux_error(grpc.StatusCode.RESOURCE_EXHAUSTED, f"over {MAX_MUX_PENDING} pending"))
                elif kind == "admit":
                    self.admits.add(op.id)
                    self._spawn(op.id, self._admit(op.id, op.admit))
                elif kind == "complete":
                    self._spawn(op.id, self._complete(op.id, op.complete))
                elif kind == "bind":
                    self._bind(op.id, op.bind)
                else:
                    self._send(op.id, _mux_error(grpc.StatusCode.INVALID_ARGUMENT, "operation: none given"))

    def _spawn(self, op_id: int, work: Coroutine[None, None, None]) -> None:
        task = asyncio.ensure_future(work)
        self.pending[op_id] = task
        task.add_done_callback(lambda _: self._forget(op_id, task))

    def _forget(self, op_id: int, task: asyncio.Task) -> None:
        if self.pending.get(op_id) is task:
            del self.pending[op_id]
            self.admits.discard(op_id)
            self.cancelled.discard(op_id)

    def _cancel(self, op_id: int) -> None:
        task = self.pending.get(op_id)
        if task is None or op_id not in self.admits or op_id in self.in_write:
            return  # answered already, a complete, or its decision is being written: it stands
        self.outbox.pop(op_id, None)  # an unsent decision is withdrawn with its admission
        self.cancelled.add(op_id)
        task.cancel()

    def _send(self, op_id: int, result: pb.MuxResult) -> asyncio.Future[None]:
        result.id = op_id
        self.outbox[op_id] = result
        self.wake.set()
        return self._flushed()

    def _flushed(self) -> asyncio.Future[None]:
        if self.flushed is None:
            self.flushed = asyncio.get_running_loop().create_future()
            # Retrieved here so that a write nobody waits for any more logs nothing.
            self.flushed.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self.flushed

    async def _write(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            if not self.outbox:
                continue
            batch, flushed = self.outbox, self._flushed()
            self.outbox, self.flushed = {}, None
            # Only a decision in the write stands against a cancel: one read while a `held` is being written
            # still withdraws its admission (else it stayed held, nobody waiting, until its deadline).
            self.in_write = frozenset(op_id for op_id, result in batch.items() if _is_decision(result))
            try:
                await self.context.write(pb.MuxResponse(results=batch.values()))
            except BaseException as exc:
                flushed.set_exception(StreamEnded(f"the AdmitMux stream ended: {exc!r}"))
                raise
            finally:
                self.in_write = frozenset()
            for op_id, result in batch.items():
                if result.WhichOneof("result") != "admit" or _is_decision(result):
                    self.admits.discard(op_id)  # its last result is out: a cancel no longer withdraws it
            flushed.set_result(None)

    async def _admit(self, op_id: int, admit: pb.MuxAdmit) -> None:
        servicer = self.servicer
        loop = asyncio.get_running_loop()
        deadline = loop.time() + admit.timeout_seconds if admit.timeout_seconds > 0 else None

        def time_remaining() -> float | None:
            return None if deadline is None else max(0.0, deadline - loop.time())

        async def on_held(runtime: SchedulerRuntime) -> None:
            held = pb.AdmitHeld(
                max_hold_seconds=runtime.core.params.resume_timeout_seconds,
                heartbeat_seconds=servicer.held_heartbeat_s,
            )
            await asyncio.shield(self._send(op_id, pb.MuxResult(admit=pb.AdmitUpdate(held=held))))

        async def deliver(response: pb.AdmitResponse) -> None:
            flushed = self._send(op_id, pb.MuxResult(admit=pb.AdmitUpdate(decision=response)))
            try:
                await asyncio.shield(flushed)
            except asyncio.CancelledError:
                # Withdrawn (a cancel, the delivery bound, the stream's end) before its write began: the
                # decision never leaves. One already in a write may: the error that follows withdraws it.
                if op_id not in self.in_write:
                    self.outbox.pop(op_id, None)
                raise

        try:
            with self._span("scheduler.admit", admit) as span:
                await servicer._decide(servicer._current(), admit.request, span, time_remaining, on_held, deliver)
        except asyncio.CancelledError:
            if op_id in self.cancelled:
                self._send(op_id, _mux_error(grpc.StatusCode.CANCELLED, "admission cancelled; rolled back"))
            raise
        except StreamEnded:
            return  # rolled back; the stream's end is the writer's to report
        except Exception as exc:
            self._send(op_id, _domain_error(exc))

    def _span(self, name: str, op: pb.MuxAdmit | pb.MuxComplete | pb.MuxBind):
        """An operation's SERVER span, continuing its caller's trace (the unary calls' SERVER spans are the
        instrumentation's; an operation on the stream has its own). None is built when nothing records it."""
        if not self.servicer.recording:
            return _NOT_RECORDED
        parent = _trace_parent(op.traceparent, op.tracestate)
        return self.servicer.tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER)

    async def _complete(self, op_id: int, complete: pb.MuxComplete) -> None:
        servicer = self.servicer
        try:
            with self._span("scheduler.complete", complete) as span:
                await servicer._complete(servicer._current(), complete.request, span)
        except Exception as exc:
            self._send(op_id, _domain_error(exc))
        else:
            self._send(op_id, pb.MuxResult(complete=pb.CompleteResponse()))

    def _bind(self, op_id: int, bind: pb.MuxBind) -> None:
        """A bind answers at once (no write awaited, nothing held): no task of its own."""
        servicer = self.servicer
        try:
            with self._span("scheduler.bind", bind) as span:
                result = pb.MuxResult(bind=servicer._bind(servicer._current(), bind.request, span))
        except Exception as exc:
            result = _domain_error(exc)
        self._send(op_id, result)


MUX_OPS = "admit,cancel,complete,bind"
"""The operations an AdmitMux stream takes, as its initial metadata names them (MUX_OPS_METADATA_KEY)."""
MAX_MUX_PENDING = 100_000
"""Operations pending on one AdmitMux stream (held admissions included); more are refused RESOURCE_EXHAUSTED."""


_NOT_RECORDED = contextlib.nullcontext(trace.INVALID_SPAN)
"""An AdmitMux operation's span when the tracer records nothing (reusable: it holds no state)."""


class StreamEnded(Exception):
    """The AdmitMux stream broke before a decision's write returned: the admission is rolled back."""


def _trace_parent(traceparent: str, tracestate: str):
    """The caller's trace context an AdmitMux operation carries (None: none given, a new trace)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return propagate.extract(carrier)


def _mux_error(code: grpc.StatusCode, message: str, leader_address: str = "") -> pb.MuxResult:
    return pb.MuxResult(error=pb.MuxError(code=code.value[0], message=message, leader_address=leader_address))


def _domain_error(exc: Exception) -> pb.MuxResult:
    """An operation's error as the status its unary call would have ended with (DOMAIN_ERRORS; UNKNOWN for
    any other exception, as gRPC reports one that escapes a handler)."""
    if not DOMAIN_ERRORS.handles(exc):
        return _mux_error(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
    leader = exc.leader_address if isinstance(exc, NotLeader) else ""
    return _mux_error(DOMAIN_ERRORS.status(exc), DOMAIN_ERRORS.message(exc), leader)
