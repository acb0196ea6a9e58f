"""The router's public HTTP API: OpenAI `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/v1/models/{model}`,
SGLang `/generate`, `/health`, and `/metrics` only with `--http-metrics` (the metrics port serves it);
the Batch API (`/v1/files*`, `/v1/batches*`) is the batch service's, passed through (adapters/batch_api.py).

Served by `http_server.GuardedServer` (connection cap, header deadline, JSON errors for malformed
HTTP). Validation happens before anything is forwarded: session headers (session.py), body size and
time (`--http-body-timeout-seconds`, 408), encoding (identity, gzip or deflate, else 415), JSON shape,
types and ranges (validation.py). An error quotes a client's value only cut short (`errors.quoted`).
Domain errors become OpenAI-style bodies in `http_server.error_response` only; an unexpected exception
is a counted, logged 500 with a generic body. A streamed turn is answered only once the worker produced
its first chunk (so a failure before it can be retried invisibly); after that a failure ends the stream
with `data: {"error": ...}` and `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from opentelemetry import propagate, trace
from orjson import dumps, loads
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from services.router.adapters.batch_api import BatchApiProxy, is_batch_path
from services.router.core.outcome import Outcome
from services.router.core.prompt_text import chat_routing_text
from services.router.errors import (
    BadRequest,
    BatchServiceMissing,
    BodyTooLarge,
    Internal,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    RequestTimeout,
    RouterError,
    WorkerFailed,
    WorkerTimeout,
    quoted,
)
from services.router.ingress import validation
from services.router.ingress.http_server import HttpLimits, check_content_encoding, error_response
from services.router.observe.metrics import RouterMetrics
from services.router.turn import session
from services.router.turn.turn_types import Api, TurnSpec, request_attributes
from services.router.turn.turns import TurnRunner

log = logging.getLogger(__name__)

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
ADMISSION_HEADER = "X-Bandmaster-Admission"
"""On every answer a worker gave: how the scheduler admitted the turn (`admitted`, `cached` for the admission
fast path, whose Admit reaches the scheduler in the background, `fail-open`, or `off` without a scheduler)."""
_DONE = b"data: [DONE]\n\n"
MODELS_PREFIX = "/v1/models/"
_ROUTE_NAMES = {Api.CHAT: "chat", Api.COMPLETIONS: "completions", Api.GENERATE: "generate"}


class _SseResponse(web.StreamResponse):
    """A streamed answer whose headers leave with its first chunk, in one write (aiohttp's StreamResponse
    sends them at `prepare` on their own; `web.Response` buffers them likewise)."""

    _send_headers_immediately = False


def _sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


# -- body validation --------------------------------------------------------------------------------


def _positive_int(body: dict, key: str) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadRequest(f"{key} must be a positive integer", param=key)


def _common(body: dict) -> tuple[str | None, bool]:
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise BadRequest("model must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    for key in ("max_tokens", "max_completion_tokens"):
        _positive_int(body, key)
    validation.sampling(body)
    stop = body.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise BadRequest("stop must be a string or a list of strings", param="stop")
    return model, stream


def build_spec(api: Api, body: dict, identity: session.SessionIdentity) -> TurnSpec:
    """Validate `body` for `api` and describe the turn. Raises BadRequest."""
    if api is Api.CHAT:
        model, stream = _common(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string role", param="messages")
            content = m.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise BadRequest(f"messages[{i}].content must be a string, a list of parts or null", param="messages")
        return TurnSpec(api, body, identity, model, stream, prompt_text=chat_routing_text(messages))
    if api is Api.COMPLETIONS:
        model, stream = _common(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return TurnSpec(api, body, identity, model, stream, prompt_text=prompt)
        if validation.is_token_list(prompt) and prompt:
            return TurnSpec(api, body, identity, model, stream, prompt_token_ids=prompt)
        raise BadRequest(
            f"prompt must be a non-empty string or list of token ids (0..{validation.MAX_TOKEN_ID})", param="prompt"
        )
    # /generate: SGLang's native shape
    model = None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    params = body.get("sampling_params")
    if params is not None and not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object (batches are not routed)", param="sampling_params")
    if params:
        value = params.get("max_new_tokens")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise BadRequest("sampling_params.max_new_tokens must be a non-negative integer", param="sampling_params")
        validation.sampling(params, validation.GENERATE_RANGES, prefix="sampling_params.")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("give exactly one of text or input_ids", param="text")
    if text is not None:
        if not isinstance(text, str) or not text:
            raise BadRequest("text must be a non-empty string", param="text")
        return TurnSpec(api, body, identity, model, stream, prompt_text=text)
    if not validation.is_token_list(ids) or not ids:
        raise BadRequest(
            f"input_ids must be a non-empty list of token ids (0..{validation.MAX_TOKEN_ID})", param="input_ids"
        )
    return TurnSpec(api, body, identity, model, stream, prompt_token_ids=ids)


_CONTENT_FIELDS = {Api.CHAT: ("messages",), Api.COMPLETIONS: ("prompt",), Api.GENERATE: ("text", "input_ids")}


def has_content(api: Api, body: dict) -> bool:
    """Whether a request carries something to generate from: chat `messages`, a completion `prompt`,
    /generate `text` or `input_ids`, present and not empty."""
    return any(body.get(name) not in (None, "", [], [""]) for name in _CONTENT_FIELDS[api])


def release_only_shape(api: Api, body: dict) -> tuple[str | None, bool]:
    """(model, stream) of a final request without content, validated like any request's. Raises BadRequest."""
    if api is Api.GENERATE:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("stream must be a boolean", param="stream")
        return None, stream
    return _common(body)


def empty_completion(api: Api, model: str, stream: bool, include_usage: bool) -> web.Response | list[bytes]:
    """What a final request without content returns: a valid, empty completion (no worker is touched)."""
    rid = "final-" + uuid.uuid4().hex
    created = int(time.time())
    usage = {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    if api is Api.GENERATE:
        meta = {
            "id": rid,
            "finish_reason": {"type": "stop", "matched": None},
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "cached_tokens": 0,
        }
        obj = {"text": "", "output_ids": [], "meta_info": meta}
        return [_sse(obj), _DONE] if stream else web.json_response(obj, dumps=lambda o: dumps(o).decode())
    if api is Api.CHAT:
        head = {"id": rid, "created": created, "model": model}
        if not stream:
            return web.json_response(
                {
                    **head,
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                },
                dumps=lambda o: dumps(o).decode(),
            )
        head["object"] = "chat.completion.chunk"
        out = [
            _sse(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            ),
            _sse({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}),
        ]
    else:
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}
        if not stream:
            return web.json_response(
                {
                    **head,
                    "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}],
                    "usage": usage,
                },
                dumps=lambda o: dumps(o).decode(),
            )
        out = [_sse({**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}]})]
    if include_usage:
        out.append(_sse({**head, "choices": [], "usage": usage}))
    out.append(_DONE)
    return out


class HttpApi:
    def __init__(
        self,
        runner: TurnRunner,
        metrics: RouterMetrics,
        tracer: trace.Tracer,
        *,
        limits: HttpLimits,
        body_timeout_s: float,
        serve_metrics: bool,
        has_scheduler: bool,
        batch_proxy: BatchApiProxy | None = None,
    ) -> None:
        self.runner = runner
        self.batch_proxy = batch_proxy
        self.metrics = metrics
        self.tracer = tracer
        self.limits = limits
        self.max_body_bytes = limits.max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.has_scheduler = has_scheduler
        self._created = int(time.time())
        self._headers = limits.server_header
        self._sse_headers = {**_SSE_HEADERS, **self._headers}
        self.routes: dict[str, dict[str, Any]] = {
            "/v1/chat/completions": {"POST": self.chat},
            "/v1/completions": {"POST": self.completions},
            "/generate": {"POST": self.generate},
            "/v1/models": {"GET": self.models},
            "/health": {"GET": self.health},
        }
        if serve_metrics:
            self.routes["/metrics"] = {"GET": self.metrics_page}

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """The dispatch: path, then method. Anything unknown is an OpenAI-style 404 / 405. The Batch API's
        routes go to the batch service whatever the method (it answers 404/405 itself)."""
        if is_batch_path(request.path):
            return await self.batch_api(request)
        if request.path.startswith(MODELS_PREFIX) and len(request.path) > len(MODELS_PREFIX):
            # `/v1/models/{id}`: the id may hold '/' (`org/model`), so it is the whole rest of the path.
            if request.method != "GET":
                response = self._error(
                    MethodNotAllowed(
                        f"{request.method} is not allowed on /v1/models/{{model}}", code="method_not_allowed"
                    )
                )
                response.headers["Allow"] = "GET"
                return response
            return await self.model(request)
        methods = self.routes.get(request.path)
        if methods is None:
            return self._error(NotFound(f"no route {quoted(request.path)}", code="not_found"))
        handler = methods.get(request.method)
        if handler is None:
            # Quoted as is: the path is one of the routes, the method one the HTTP parser knows.
            response = self._error(
                MethodNotAllowed(f"{request.method} is not allowed on {request.path}", code="method_not_allowed")
            )
            response.headers["Allow"] = ", ".join(methods)
            return response
        return await handler(request)

    async def batch_api(self, request: web.BaseRequest) -> web.StreamResponse:
        response: web.StreamResponse
        if self.batch_proxy is None:
            response = self._error(
                BatchServiceMissing(
                    f"{quoted(request.path)} is the Batch API, served by the batch service: this router was started "
                    "without --batch-url (bandmaster up starts one unless --no-planner)",
                    code="batch_not_configured",
                )
            )
        else:
            try:
                check_content_encoding(request.headers)
            except RouterError as err:
                response = self._error(err)
            else:
                response = await self.batch_proxy.forward(request, self._headers, self._error)
        self.metrics.batch_api.labels(str(response.status)).inc()
        return response

    def _error(self, err: RouterError) -> web.Response:
        return error_response(err, self._headers)

    def _json(self, obj: Any, status: int = 200) -> web.Response:
        return web.Response(status=status, body=dumps(obj), content_type="application/json", headers=self._headers)

    async def chat(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._turn(request, Api.CHAT)

    async def completions(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._turn(request, Api.COMPLETIONS)

    async def generate(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._turn(request, Api.GENERATE)

    def _model(self, name: str) -> dict:
        # `created`: when this router started (the fleet does not say when a worker's model was made).
        return {"id": name, "object": "model", "created": self._created, "owned_by": "bandmaster"}

    async def models(self, request: web.BaseRequest) -> web.Response:
        """OpenAI's `GET /v1/models`: the models the healthy workers serve now."""
        return self._json({"object": "list", "data": [self._model(name) for name in self.runner.fleet.model_names]})

    async def model(self, request: web.BaseRequest) -> web.Response:
        """OpenAI's `GET /v1/models/{model}`: one of them, or a 404 `model_not_found` in OpenAI's error body."""
        name = request.path[len(MODELS_PREFIX) :]
        if name not in self.runner.fleet.model_names:
            return self._error(ModelNotFound(name))
        return self._json(self._model(name))

    async def health(self, request: web.BaseRequest) -> web.Response:
        workers = len(self.runner.fleet.workers)
        return self._json(
            {"status": "ok" if workers else "no_healthy_worker", "workers": workers}, status=200 if workers else 503
        )

    async def metrics_page(self, request: web.BaseRequest) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST, **self._headers}
        )

    async def _read_body(self, request: web.BaseRequest) -> dict:
        check_content_encoding(request.headers)
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise BodyTooLarge(f"request body exceeds {self.max_body_bytes} bytes")
        try:
            if request.content.is_eof():  # the whole body came with the head (most do): no timer to arm
                raw = await request.read()
            else:
                async with asyncio.timeout(self.body_timeout_s):
                    raw = await request.read()
        except TimeoutError:
            self.metrics.http_timeouts.labels("body").inc()
            raise RequestTimeout(
                f"request body not received within {self.body_timeout_s:g}s", code="body_timeout"
            ) from None
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(f"request body exceeds {self.max_body_bytes} bytes") from None
        except (web.RequestPayloadError, HttpProcessingError):
            # A body that does not decode (e.g. gzip Content-Encoding over garbage) or breaks its framing.
            raise BadRequest("the body does not match its Content-Encoding or framing", code="malformed_body") from None
        try:
            body = loads(raw) if raw else None
        except ValueError as exc:
            raise BadRequest(f"malformed JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        validation.encodable(body, raw)
        return body

    async def _turn(self, request: web.BaseRequest, api: Api) -> web.StreamResponse:
        route = _ROUTE_NAMES[api]
        ctx = propagate.extract(request.headers)
        with self.tracer.start_as_current_span("router.request", context=ctx, kind=trace.SpanKind.SERVER) as span:
            span.set_attribute("router.route", route)
            path = session.path_label(request.headers)
            traffic = session.traffic(request.headers)
            try:
                try:
                    identity = session.from_headers(request.headers)
                    body = await self._read_body(request)
                    client = session.client_identity(request.headers.get("Authorization"), request.remote)
                    if identity.final and identity.is_program:
                        # The program's last request: served like any turn, then released (turns.py); one
                        # without content only releases it and gets an empty completion.
                        path = "final"
                        if not has_content(api, body):
                            return await self._final(request, api, body, identity.session_id, client)
                    spec = build_spec(api, body, identity)
                    span.set_attribute("router.path", path)
                    if span.is_recording():
                        span.set_attributes(request_attributes(spec))
                    spec.client = client
                    spec.traffic = traffic
                    client_usage = True
                    if spec.stream and api is not Api.GENERATE:
                        options = dict(body.get("stream_options") or {})
                        client_usage = bool(options.get("include_usage"))
                        options["include_usage"] = True
                        body["stream_options"] = options
                    turn = await self.runner.open(spec)
                except RouterError as err:
                    self.metrics.request(route, path, f"error_{err.http_status}", traffic).inc()
                    span.set_attribute("router.error", err.__class__.__name__)
                    return self._error(err)
                if not spec.stream:
                    return await self._answer(turn, route, path, traffic)
            except Exception:  # a bug: counted, logged with its traceback, a generic 500 to the client
                log.exception("unhandled error in %s", route)
                self.metrics.request(route, path, "error_500", traffic).inc()
                span.set_attribute("router.error", "Internal")
                return self._error(Internal("internal error"))
            return await self._stream(request, turn, route, path, client_usage, traffic)

    async def _answer(self, turn, route: str, path: str, traffic: str) -> web.Response:
        outcome = Outcome.FAILED
        try:
            answer = await turn.json()
            outcome = Outcome.OK
        except RouterError as err:
            self.metrics.request(route, path, f"error_{err.http_status}", traffic).inc()
            return self._error(err)
        except asyncio.CancelledError:
            outcome = Outcome.CANCELLED
            self.metrics.request(route, path, "cancelled", traffic).inc()
            raise
        finally:
            await turn.close(outcome)
        self.metrics.request(route, path, "ok", traffic).inc()
        turn.delivered()  # the whole answer is in hand and goes out as this handler returns
        headers = {**self._headers, ADMISSION_HEADER: turn.book.admission_mode}
        return web.Response(body=dumps(answer), content_type="application/json", headers=headers)

    async def _stream(
        self, request: web.BaseRequest, turn, route: str, path: str, client_usage: bool, traffic: str
    ) -> web.StreamResponse:
        response = _SseResponse(headers={**self._sse_headers, ADMISSION_HEADER: turn.book.admission_mode})
        outcome = Outcome.CANCELLED
        try:
            await response.prepare(request)
            try:
                # One write per read from the worker, not per line: see SseRelay. (Holding writes back to
                # coalesce them saved no CPU at the bench's token rates, and a worker that breaks its stream
                # meanwhile makes aiohttp's reader drop what it had buffered: docs/benchmarks/router.md.)
                async for block in turn.sse(client_usage):
                    await response.write(block)
                    turn.delivered()  # headers and the first chunk are out: the turn counts
                outcome = Outcome.OK
            except (WorkerFailed, WorkerTimeout) as err:
                outcome = Outcome.FAILED
                self.metrics.upstream_errors.labels(err.__class__.__name__, "stream").inc()
                await response.write(b"\n" + _sse(err.body()) + _DONE)
            self.metrics.request(route, path, "ok" if outcome == Outcome.OK else "failed", traffic).inc()
            await response.write_eof()
        except ConnectionResetError:
            outcome = Outcome.CANCELLED
            self.metrics.request(route, path, "cancelled", traffic).inc()
        except asyncio.CancelledError:
            outcome = Outcome.CANCELLED
            self.metrics.request(route, path, "cancelled", traffic).inc()
            raise
        finally:
            await turn.close(outcome)
        return response

    async def _final(
        self, request: web.BaseRequest, api: Api, body: dict, session_id: str, client: str
    ) -> web.StreamResponse:
        """A final request without content: release the program, answer an empty completion (no worker)."""
        model, stream = release_only_shape(api, body)
        released = await self.runner.release(session_id, client)
        log.debug("final request without content for %s: released=%s", session_id, released)
        self.metrics.request(_ROUTE_NAMES[api], "final", "ok").inc()
        model = model or next(iter(self.runner.fleet.model_names), "bandmaster")
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        answer = empty_completion(api, model, stream, include_usage)
        if isinstance(answer, web.Response):
            answer.headers.update(self._headers)
            return answer
        response = web.StreamResponse(headers=self._sse_headers)
        await response.prepare(request)
        for chunk in answer:
            await response.write(chunk)
        await response.write_eof()
        return response
