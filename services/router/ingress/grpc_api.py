"""gRPC `bandmaster.router.v1.Router`: Generate (server stream of GenerateChunk) and Release.

Same semantics as the HTTP API (turns.py does the work): a chat or a prompt becomes one OpenAI request
to the worker, streamed with per-chunk usage so each GenerateChunk can say how many tokens it carries.
Domain errors map to status codes in `_abort` only.
"""

from __future__ import annotations

import asyncio
from typing import AsyncGenerator, AsyncIterator, TypedDict, TypeVar

import grpc
from opentelemetry import trace
from orjson import loads

from bandmaster.router.v1 import router_pb2 as pb
from bandmaster.router.v1 import router_pb2_grpc as pb_grpc
from services.common.observe.telemetry import grpc_parent
from services.router.core.outcome import Outcome
from services.router.core.prompt_text import chat_routing_text
from services.router.errors import BadRequest, RouterError, WorkerFailed, WorkerTimeout
from services.router.ingress import validation
from services.router.observe.metrics import RouterMetrics
from services.router.turn import session
from services.router.turn.relay import LineKind
from services.router.turn.turn_types import Api, TurnSpec, request_attributes
from services.router.turn.turns import TurnRunner

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Router"].full_name


async def _abort(context: grpc.aio.ServicerContext, err: RouterError) -> None:
    """The one mapping of domain errors to gRPC status codes (a wait, when there is one, as `retry-after`)."""
    trailers = () if err.retry_after_s is None else (("retry-after", str(max(1, int(-(-err.retry_after_s // 1))))),)
    await context.abort(err.grpc_code, err.message, trailing_metadata=trailers)


_T = TypeVar("_T")


async def _within(span: trace.Span, lines: AsyncGenerator[_T, None]) -> AsyncIterator[_T]:
    """Iterate `lines` with `span` current while each item is awaited (a failover's pick is its child)."""
    iterator = lines
    try:
        while True:
            with trace.use_span(span):
                try:
                    item = await anext(iterator)
                except StopAsyncIteration:
                    return
            yield item
    finally:
        await iterator.aclose()


def client_of(context: grpc.aio.ServicerContext) -> str:
    """The client the per-client limits count against: its bearer token's hash, else its address."""
    metadata = dict(context.invocation_metadata() or ())
    peer = context.peer() or ""
    address = peer.split(":", 1)[1].rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer
    return session.client_identity(metadata.get("authorization"), address)


class _RequestId(TypedDict, total=False):
    request_id: str  # absent: TurnSpec makes one up


def spec_from_request(request: pb.GenerateRequest) -> TurnSpec:
    identity = session.identity(request.session_id, request.parent_session_id)
    body: dict = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if request.model:
        body["model"] = request.model
    s = request.sampling
    if s.max_tokens < 0:
        raise BadRequest("sampling.max_tokens must be >= 0", param="sampling.max_tokens")
    if s.max_tokens:
        body["max_tokens"] = s.max_tokens
    if s.HasField("temperature"):
        body["temperature"] = s.temperature
    if s.HasField("top_p"):
        body["top_p"] = s.top_p
    validation.sampling(body, prefix="sampling.")
    if s.stop:
        body["stop"] = list(s.stop)
    which = request.WhichOneof("input")
    kwargs: _RequestId = {"request_id": validation.request_id(request.request_id)} if request.request_id else {}
    if which == "chat":
        if not request.chat.messages:
            raise BadRequest("chat.messages must not be empty", param="chat")
        messages = [{"role": m.role, "content": m.content} for m in request.chat.messages]
        if any(not m["role"] for m in messages):
            raise BadRequest("every chat message needs a role", param="chat")
        body["messages"] = messages
        return TurnSpec(
            Api.CHAT, body, identity, request.model or None, True, prompt_text=chat_routing_text(messages), **kwargs
        )
    if which == "prompt" and request.prompt:
        body["prompt"] = request.prompt
        return TurnSpec(
            Api.COMPLETIONS, body, identity, request.model or None, True, prompt_text=request.prompt, **kwargs
        )
    raise BadRequest("give chat messages or a non-empty prompt", param="input")


class RouterServicer(pb_grpc.RouterServicer):
    def __init__(self, runner: TurnRunner, metrics: RouterMetrics, tracer: trace.Tracer) -> None:
        self.runner = runner
        self.metrics = metrics
        self.tracer = tracer

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateChunk]:
        ctx, kind = grpc_parent(context)  # a streaming handler: not instrumented (GrpcServerTracing says why)
        path = "program" if request.session_id.strip() else "passthrough"
        # The span is current only around awaits, never across a `yield`: grpc.aio may close this generator
        # from another task, where detaching a context attached here fails (and logs at ERROR).
        span = self.tracer.start_span("router.request", context=ctx, kind=kind)
        span.set_attribute("router.route", "grpc")
        try:
            try:
                with trace.use_span(span):
                    spec = spec_from_request(request)
                    if span.is_recording():
                        span.set_attributes(request_attributes(spec))
                    spec.client = client_of(context)
                    turn = await self.runner.open(spec)
            except RouterError as err:
                self.metrics.request("grpc", path, f"error_{err.http_status}").inc()
                await _abort(context, err)
                return
            outcome = Outcome.CANCELLED
            worker_id = turn.replica.worker_id
            try:
                completion_tokens = 0
                try:
                    async for line, line_kind in _within(span, turn.lines()):
                        if line_kind is not LineKind.DATA:
                            continue
                        chunk = loads(memoryview(line)[5:])
                        usage = chunk.get("usage") or {}
                        total = int(usage.get("completion_tokens") or completion_tokens)
                        choices = chunk.get("choices") or ()
                        if not choices:
                            continue
                        choice = choices[0]
                        text = (
                            (choice.get("delta") or {}).get("content") if spec.api is Api.CHAT else choice.get("text")
                        )
                        if text or total > completion_tokens:
                            yield pb.GenerateChunk(
                                text=text or "",
                                tokens=total - completion_tokens,
                                worker_id=worker_id,
                                request_id=spec.request_id,
                            )
                            turn.delivered()  # its first message is out: the turn counts at the scheduler
                        completion_tokens = total
                    outcome = Outcome.OK
                    u = turn.usage
                    yield pb.GenerateChunk(
                        finish_reason=turn.finish_reason or "stop",
                        worker_id=worker_id,
                        request_id=spec.request_id,
                        usage=pb.Usage(
                            prompt_tokens=u.prompt_tokens,
                            completion_tokens=u.completion_tokens,
                            cached_tokens=u.cached_tokens,
                        ),
                    )
                    turn.delivered()
                except (WorkerFailed, WorkerTimeout) as err:
                    outcome = Outcome.FAILED
                    self.metrics.upstream_errors.labels(err.__class__.__name__, "stream").inc()
                    u = turn.usage
                    yield pb.GenerateChunk(
                        finish_reason="error",
                        error=err.message,
                        worker_id=worker_id,
                        request_id=spec.request_id,
                        usage=pb.Usage(
                            prompt_tokens=u.prompt_tokens,
                            completion_tokens=u.completion_tokens,
                            cached_tokens=u.cached_tokens,
                        ),
                    )
                self.metrics.request("grpc", path, "ok" if outcome == Outcome.OK else "failed").inc()
            except asyncio.CancelledError:
                self.metrics.request("grpc", path, "cancelled").inc()
                raise
            finally:
                await turn.close(outcome)
        finally:
            span.end()

    async def Release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        try:
            sid = session.normalize_session_id(request.session_id, "session_id")
            if not sid:
                raise BadRequest("session_id is required", param="session_id")
        except RouterError as err:
            await _abort(context, err)
            raise AssertionError("unreachable") from None  # abort raised
        ctx, kind = grpc_parent(context)  # unary: a child of the instrumentation's SERVER span
        with self.tracer.start_as_current_span("router.release", context=ctx, kind=kind):
            released = await self.runner.release(sid, client_of(context))
        self.metrics.request("grpc", "final", "ok").inc()
        return pb.ReleaseResponse(released=released)


def add_to_server(servicer: RouterServicer, server: grpc.aio.Server) -> None:
    pb_grpc.add_RouterServicer_to_server(servicer, server)
