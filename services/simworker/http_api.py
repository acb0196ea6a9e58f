"""SGLang's HTTP API over the simulated engine (reference/kvrouter_sglang.md §C).

Handlers are thin: parse and validate the request, submit one `EngineRequest` through the
driver, turn the stream of `RequestOutput`s into SGLang's (`/generate`) or OpenAI's
(`/v1/*`) wire shapes. `Generation` is the one place that owns a request's text, stop
strings, stream interval, latency metrics and its release: whatever way a handler exits
(finish, client disconnect, cancellation), `Generation.close()` aborts the engine request if it
is still in flight, as SGLang does on disconnect. With tracing, it also records where the request's
time went (queue, prefill, decode) as events on the request's SERVER span (docs/tracing.md).

Errors use OpenAI's body `{"object": "error", "message", "type", "code"}` with a 4xx status,
mapped in one place (`_error`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

from aiohttp import web
from opentelemetry import trace
from orjson import dumps

from services.common.auth.security import bearer_of
from services.common.observe.telemetry import http_server_middleware
from services.common.web.http_errors import json_errors
from services.simworker.chat import ChatTemplateError
from services.simworker.config import SimWorkerConfig
from services.simworker.core.api import EngineRequest, RequestOutput
from services.simworker.driver import DriverStopped, EngineDriver
from services.simworker.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from services.simworker.metrics import SimWorkerMetrics

log = logging.getLogger(__name__)

SIMWORKER_VERSION = "0.1.0"
WEIGHT_VERSION = "default"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_DONE = b"data: [DONE]\n\n"
# /generate's default when sampling_params.max_new_tokens is absent (SGLang's default).
DEFAULT_GENERATE_MAX_NEW_TOKENS = 128
# The routes that run the engine: each request to one gets a SERVER span (probes and polls do not).
TRACED_PATHS = ("/generate", "/v1/chat/completions", "/v1/completions")


class Tokenizer(Protocol):
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat_ids(self, body: dict) -> list[int]:
        """Prompt ids of an OpenAI chat request; raises ChatTemplateError (HTTP 400) for bad messages."""


class ApiError(Exception):
    """An error answered with an OpenAI-style body and `status`."""

    _TYPES = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError", 500: "InternalServerError"}

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict:
        return {
            "object": "error",
            "message": self.message,
            "type": self._TYPES.get(self.status, "Error"),
            "param": None,
            "code": self.status,
        }


def _error(exc: ApiError) -> web.Response:
    return web.Response(status=exc.status, body=dumps(exc.body()), content_type="application/json")


def api_key_middleware(api_key: str):
    """SGLang's `--api-key` (`add_api_key_middleware`): OPTIONS and every path starting with /health or
    /metrics are open (probes, Prometheus); every other request, known path or not, needs
    `Authorization: Bearer <key>` (scheme in any case), else 401 `{"error": "Unauthorized"}`.
    Compared in constant time."""
    expected = api_key.encode("utf-8")

    @web.middleware
    async def check_api_key(request: web.Request, handler) -> web.StreamResponse:
        if request.method == "OPTIONS" or request.path.startswith(("/health", "/metrics")):
            return await handler(request)
        presented = bearer_of(request.headers.get("Authorization"))
        if presented is None or not hmac.compare_digest(presented, expected):
            return web.Response(status=401, body=b'{"error":"Unauthorized"}', content_type="application/json")
        return await handler(request)

    return check_api_key


def _json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=dumps(obj), content_type="application/json")


# --------------------------------------------------------------------------------------------
# One request's life
# --------------------------------------------------------------------------------------------


class Generation:
    """Drives one engine request and accumulates what SGLang reports about it."""

    __slots__ = (
        "rid",
        "prompt_tokens",
        "output_ids",
        "text",
        "finish_reason",
        "completion_tokens",
        "cached_tokens",
        "num_retractions",
        "e2e_latency_s",
        "_driver",
        "_tokenizer",
        "_metrics",
        "_queue",
        "_stop",
        "_stop_scan_from",
        "_interval",
        "_arrival_v",
        "_last_v",
        "_done",
        "_span",
        "_submitted_v",
        "_admitted_v",
        "_first_v",
        "_end_v",
        "_lag_submit_s",
        "_lag_end_s",
    )

    def __init__(
        self,
        driver: EngineDriver,
        tokenizer: Tokenizer,
        metrics: SimWorkerMetrics | None,
        request: EngineRequest,
        stop: Sequence[str],
        stream_interval: int,
        arrival_v: float | None = None,
    ) -> None:
        self.rid = request.rid
        self.prompt_tokens = len(request.input_ids)
        self.output_ids: list[int] = []
        self.text = ""
        self.finish_reason: dict | None = None
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.num_retractions = 0
        self.e2e_latency_s: float | None = None
        self._driver = driver
        self._tokenizer = tokenizer
        self._metrics = metrics
        self._stop = tuple(s for s in stop if s)
        self._stop_scan_from = 0
        self._interval = stream_interval
        self._arrival_v = driver.engine_now() if arrival_v is None else arrival_v
        self._last_v: float | None = None
        self._done = False
        # Phases in engine (virtual) time, for the span events written at close.
        self._span: trace.Span | None = trace.get_current_span()
        self._submitted_v = driver.engine_now()
        # How far (wall seconds) the engine's clock was behind the wall clock when the request was
        # submitted and when its last output was read: its span events are stamped in engine time.
        self._lag_submit_s = max(0.0, (driver.now() - self._submitted_v) / driver.speedup)
        self._lag_end_s: float | None = None
        self._admitted_v: float | None = None
        self._first_v: float | None = None
        self._end_v: float | None = None
        try:
            self._queue = driver.submit(request)
        except KeyError:
            raise ApiError(400, f"request id {request.rid!r} is already in flight") from None
        except DriverStopped as exc:
            raise ApiError(503, f"engine is not running: {exc}") from None
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    @property
    def finished(self) -> bool:
        return self._done

    async def chunks(self) -> AsyncIterator[str]:
        """Yield the text delta of every chunk to stream (the last one has `finish_reason` set)."""
        queue = self._queue
        pending_tokens = 0
        pending_text: list[str] = []
        while not self._done:
            output, t_v = await queue.get()
            delta = self._absorb(output, t_v)
            if delta:
                pending_text.append(delta)
            pending_tokens += len(output.new_token_ids)
            first = len(self.output_ids) == len(output.new_token_ids) and pending_tokens > 0
            if self._done or first or pending_tokens >= self._interval:
                pending_tokens = 0
                text = "".join(pending_text)
                pending_text.clear()
                yield text

    def _absorb(self, output: RequestOutput, t_v: float) -> str:
        new_ids = output.new_token_ids
        self.completion_tokens = max(self.completion_tokens, output.completion_tokens)
        if output.prompt_tokens:
            self.cached_tokens = output.cached_tokens
        self.num_retractions = max(self.num_retractions, output.num_retractions)
        if self._admitted_v is None and output.admitted_at is not None:
            self._admitted_v = output.admitted_at
        delta = ""
        if new_ids:
            if self._first_v is None:
                self._first_v = t_v
            if self._metrics is not None:
                if self._last_v is None:
                    self._metrics.observe_ttft(t_v - self._arrival_v)
                else:
                    self._metrics.observe_itl(t_v - self._last_v, len(new_ids))
            self._last_v = t_v
            self.output_ids.extend(new_ids)
            delta = self._tokenizer.decode(new_ids)
            self.text += delta
            if self._stop:
                matched = self._match_stop()
                if matched is not None:
                    cut, stop = matched
                    delta = delta[: max(0, len(delta) - (len(self.text) - cut))]
                    self.text = self.text[:cut]
                    self._finish({"type": "stop", "matched": stop}, t_v)
                    if not output.finished:
                        # The engine would go on generating: release it (an engine-side abort).
                        self._driver.release(self.rid)
                    return delta
        if output.finished:
            self._finish(output.finish_reason or {"type": "abort", "message": "finished without a reason"}, t_v)
        return delta

    def _match_stop(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stop:
            at = self.text.find(stop, max(0, self._stop_scan_from - len(stop) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        self._stop_scan_from = len(self.text)
        return best

    def _finish(self, reason: dict, t_v: float) -> None:
        self._done = True
        self.finish_reason = reason
        self._end_v = t_v
        self._lag_end_s = max(0.0, (self._driver.now() - t_v) / self._driver.speedup)
        self.e2e_latency_s = t_v - self._arrival_v
        if self._metrics is not None:
            self._metrics.observe_e2e(self.e2e_latency_s)

    def close(self) -> None:
        """Release the engine request unless it finished (client gone, error, cancellation)."""
        if not self._done:
            self._done = True
            self._driver.release(self.rid)
        span, self._span = self._span, None
        if span is not None and span.is_recording():
            self._trace_phases(span)

    def _trace_phases(self, span: trace.Span) -> None:
        """Events at the start and end of each phase, in engine time mapped to wall time:

            queue    submitted to the engine -> first admitted (prefill begins)
            prefill  admitted -> first token (the step that finished the prefill samples it)
            decode   first token -> last token, or the abort

        and the phases' lengths in engine seconds as attributes. A phase the request never reached has
        no events (a request aborted while queued has `queue.start` only)."""
        end_v = self._end_v if self._end_v is not None else self._driver.now()
        admitted, first = self._admitted_v, self._first_v
        marks = [("queue.start", self._submitted_v)]
        if admitted is not None:
            marks += [("queue.end", admitted), ("prefill.start", admitted)]
            if first is not None:
                marks += [("prefill.end", first), ("decode.start", first), ("decode.end", end_v)]
        for (name, at_v), at_ns in zip(marks, self._driver.epoch_ns_at([v for _, v in marks])):
            span.add_event(name, {"simworker.engine_time_s": at_v}, timestamp=at_ns)
        attributes = {
            "simworker.frontend_s": self._submitted_v - self._arrival_v,
            "simworker.queue_s": (admitted if admitted is not None else end_v) - self._submitted_v,
            "simworker.prompt_tokens": self.prompt_tokens,
            "simworker.cached_tokens": self.cached_tokens,
            "simworker.completion_tokens": self.completion_tokens,
            "simworker.retractions": self.num_retractions,
            "simworker.finish_reason": (self.finish_reason or {}).get("type") or "abort",
            "simworker.speedup": self._driver.speedup,
            "simworker.lag_submit_s": self._lag_submit_s,
        }
        if self._lag_end_s is not None:
            attributes["simworker.lag_end_s"] = self._lag_end_s
        if admitted is not None:
            attributes["simworker.prefill_s"] = (first if first is not None else end_v) - admitted
        if first is not None:
            attributes["simworker.decode_s"] = end_v - first
        span.set_attributes(attributes)

    def meta_info(self) -> dict:
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "weight_version": WEIGHT_VERSION,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "num_retractions": self.num_retractions,
        }
        if self.finish_reason is not None:
            meta["e2e_latency"] = self.e2e_latency_s
        return meta


# --------------------------------------------------------------------------------------------
# Request parsing
# --------------------------------------------------------------------------------------------


async def _read_json(request: web.Request, *, require_json_type: bool) -> dict:
    if require_json_type and request.content_type != "application/json":
        raise ApiError(400, "Content-Type must be application/json")
    try:
        body = json.loads(await request.read() or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _opt_int(body: dict, key: str, *, minimum: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} must be an integer")
    if minimum is not None and value < minimum:
        raise ApiError(400, f"{key} must be >= {minimum}, got {value}")
    return value


def _stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise ApiError(400, "stop must be a string or a list of strings")


def _token_ids(value: Any, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        return tuple(value)
    raise ApiError(400, f"{key} must be a list of non-negative integers")


def _rid(value: Any) -> str:
    if value is None:
        return uuid.uuid4().hex
    if not isinstance(value, str) or not value:
        raise ApiError(400, "rid must be a non-empty string")
    return value


class SimWorkerApi:
    """The aiohttp application: routes, handlers, and the server's lifecycle state."""

    def __init__(
        self,
        config: SimWorkerConfig,
        driver: EngineDriver,
        tokenizer: Tokenizer,
        metrics: SimWorkerMetrics,
        *,
        kv_bytes_per_token: float,
        host_total_tokens: int,
        frontend_s: Callable[[int], float] | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.config = config
        self.tracer = tracer
        self.driver = driver
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.kv_bytes_per_token = kv_bytes_per_token
        self.host_total_tokens = host_total_tokens
        self.state = "starting"  # starting | ready | shutting_down
        self._frontend_s = frontend_s
        # The publisher's bound endpoint: with `tcp://*:0` only the bound port tells subscribers where to go.
        self.kv_events_bound_endpoint: str | None = None
        self._model_names = {config.served_model_name, config.model_path}
        self._created = int(time.time())

    def _kv_events_config_json(self) -> str | None:
        if self.config.kv_events is None:
            return None
        reported = json.loads(self.config.kv_events.to_json())
        if self.kv_events_bound_endpoint:
            reported["endpoint"] = self.kv_events_bound_endpoint
        return json.dumps(reported)

    def build_app(self) -> web.Application:
        middlewares = [http_server_middleware(self.tracer, TRACED_PATHS)] if self.tracer is not None else []
        if self.config.api_key:  # before the routes resolve: an unknown path without the key is a 401, as in SGLang
            middlewares.append(api_key_middleware(self.config.api_key))
        # Unknown paths and wrong methods: JSON errors like every other Bandmaster port, not aiohttp's text.
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[*middlewares, json_errors])
        r = app.router
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.+}", self.model_card)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/health", self.health)
        r.add_get("/ping", self.ping)
        r.add_get("/health_generate", self.health_generate)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_post("/abort_request", self.abort_request)
        r.add_get("/get_load", self.get_load)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/metrics", self.metrics_page)
        return app

    # -- shared pieces ----------------------------------------------------------------
    def _check_context(self, prompt_tokens: int, max_new_tokens: int | None) -> int:
        """Refuse prompts that do not fit; returns the max_new_tokens to use."""
        ctx = self.config.context_length
        if prompt_tokens == 0:
            raise ApiError(400, "the prompt is empty")
        if prompt_tokens >= ctx:
            raise ApiError(
                400, f"The input ({prompt_tokens} tokens) is longer than the model's context length ({ctx} tokens)."
            )
        room = ctx - prompt_tokens
        if max_new_tokens is None:
            return room
        if max_new_tokens > room:
            raise ApiError(
                400,
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {prompt_tokens + max_new_tokens} tokens: "
                f"{prompt_tokens} tokens from the input messages and {max_new_tokens} tokens "
                f"for the completion. Please reduce the number of tokens in the input "
                f"messages or the completion to fit within the limit.",
            )
        return max_new_tokens

    async def _start(
        self,
        *,
        rid: str,
        input_ids: Sequence[int],
        max_new_tokens: int,
        priority: int | None,
        ignore_eos: bool,
        stop: Sequence[str],
        stop_token_ids: Sequence[int],
    ) -> Generation:
        request = EngineRequest(
            rid=rid,
            input_ids=tuple(input_ids),
            max_new_tokens=max_new_tokens,
            priority=priority,
            ignore_eos=ignore_eos,
            stop_token_ids=tuple(stop_token_ids),
        )
        arrival_v = self.driver.engine_now()
        if self._frontend_s is not None:
            # The off-GPU part of a real server's TTFT (HTTP, tokenization), in virtual time.
            delay_s = self._frontend_s(len(request.input_ids)) / self.config.speedup
            if delay_s > 0:
                await asyncio.sleep(delay_s)
        return Generation(
            self.driver, self.tokenizer, self.metrics, request, stop, self.config.stream_interval, arrival_v
        )

    def _check_model(self, body: dict) -> str:
        model = body.get("model")
        if model is None:
            return self.config.served_model_name
        if model not in self._model_names:
            raise ApiError(404, f"The model `{model}` does not exist.")
        return model

    @staticmethod
    async def _sse(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        return response

    # -- /generate --------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _read_json(request, require_json_type=False)
            has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
            if has_text == has_ids:
                raise ApiError(400, "give exactly one of text or input_ids")
            params = body.get("sampling_params") or {}
            if (
                isinstance(params, list)
                or isinstance(body.get("text"), list)
                or (has_ids and body["input_ids"] and isinstance(body["input_ids"][0], list))
            ):
                raise ApiError(
                    400, "batched /generate requests are not supported by simworker; send one request per prompt"
                )
            if not isinstance(params, dict):
                raise ApiError(400, "sampling_params must be an object")
            if has_text:
                if not isinstance(body["text"], str):
                    raise ApiError(400, "text must be a string")
                input_ids = self.tokenizer.encode(body["text"])
            else:
                input_ids = list(_token_ids(body["input_ids"], "input_ids"))
            if (params.get("n") or 1) != 1:
                raise ApiError(400, "n > 1 is not supported by simworker")
            max_new = _opt_int(params, "max_new_tokens", minimum=0)
            max_new = DEFAULT_GENERATE_MAX_NEW_TOKENS if max_new is None else max_new
            if max_new == 0:
                raise ApiError(400, "max_new_tokens must be positive")
            max_new = self._check_context(len(input_ids), max_new)
            gen = await self._start(
                rid=_rid(body.get("rid")),
                input_ids=input_ids,
                max_new_tokens=max_new,
                priority=_opt_int(body, "priority"),
                ignore_eos=bool(params.get("ignore_eos", False)),
                stop=_stop_strings(params.get("stop")),
                stop_token_ids=_token_ids(params.get("stop_token_ids"), "stop_token_ids"),
            )
        except ApiError as exc:
            return _error(exc)
        try:
            if not body.get("stream"):
                async for _ in gen.chunks():
                    pass
                return _json_response({"text": gen.text, "output_ids": gen.output_ids, "meta_info": gen.meta_info()})
            response = await self._sse(request)
            try:
                async for _ in gen.chunks():
                    await response.write(
                        b"data: "
                        + dumps({"text": gen.text, "output_ids": gen.output_ids, "meta_info": gen.meta_info()})
                        + b"\n\n"
                    )
                await response.write(_DONE)
            except ConnectionResetError:
                pass
            return response
        finally:
            gen.close()

    # -- OpenAI routes ----------------------------------------------------------------
    async def _openai_common(self, body: dict, prompt_ids: list[int]) -> Generation:
        if (body.get("n") or 1) != 1:
            raise ApiError(400, "n > 1 is not supported by simworker")
        max_tokens = _opt_int(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens")
        if max_tokens is not None and max_tokens <= 0:
            raise ApiError(400, f"max_tokens must be positive, got {max_tokens}")
        max_new = self._check_context(len(prompt_ids), max_tokens)
        return await self._start(
            rid=_rid(body.get("rid")),
            input_ids=prompt_ids,
            max_new_tokens=max_new,
            priority=_opt_int(body, "priority"),
            ignore_eos=bool(body.get("ignore_eos", False)),
            stop=_stop_strings(body.get("stop")),
            stop_token_ids=_token_ids(body.get("stop_token_ids"), "stop_token_ids"),
        )

    def _usage(self, gen: Generation) -> dict:
        details = None
        if self.config.enable_cache_report and gen.cached_tokens > 0:
            details = {"cached_tokens": gen.cached_tokens}
        return {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
            "prompt_tokens_details": details,
            "reasoning_tokens": 0,
        }

    @staticmethod
    def _finish_fields(gen: Generation) -> tuple[str | None, Any]:
        reason = gen.finish_reason
        if reason is None:
            return None, None
        return reason.get("type"), reason.get("matched")

    @staticmethod
    def _stream_options(body: dict) -> tuple[bool, bool]:
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise ApiError(400, "stream_options must be an object")
        return bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _read_json(request, require_json_type=True)
            model = self._check_model(body)
            if body.get("messages") is None:
                raise ApiError(400, "messages is required")
            try:
                prompt_ids = self.tokenizer.chat_ids(body)
            except ChatTemplateError as exc:
                raise ApiError(400, str(exc)) from None
            include_usage, continuous = self._stream_options(body)
            gen = await self._openai_common(body, prompt_ids)
        except ApiError as exc:
            return _error(exc)
        created = int(time.time())
        try:
            if not body.get("stream"):
                async for _ in gen.chunks():
                    pass
                reason, matched = self._finish_fields(gen)
                return _json_response(
                    {
                        "id": gen.rid,
                        "object": "chat.completion",
                        "created": created,
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {
                                    "role": "assistant",
                                    "content": gen.text,
                                    "reasoning_content": None,
                                    "tool_calls": None,
                                },
                                "logprobs": None,
                                "finish_reason": reason,
                                "matched_stop": matched,
                            }
                        ],
                        "usage": self._usage(gen),
                        "metadata": {"weight_version": WEIGHT_VERSION},
                    }
                )
            response = await self._sse(request)
            head = {"id": gen.rid, "object": "chat.completion.chunk", "created": created, "model": model}
            try:
                first = True
                async for delta in gen.chunks():
                    if first:
                        first = False
                        await response.write(
                            self._chat_chunk(
                                head, {"role": "assistant", "content": ""}, None, None, gen if continuous else None
                            )
                        )
                    if delta:
                        await response.write(
                            self._chat_chunk(head, {"content": delta}, None, None, gen if continuous else None)
                        )
                reason, matched = self._finish_fields(gen)
                await response.write(self._chat_chunk(head, {}, reason, matched, gen if continuous else None))
                await self._end_stream(response, head, gen, include_usage)
            except ConnectionResetError:
                pass
            return response
        finally:
            gen.close()

    async def _end_stream(self, response: web.StreamResponse, head: dict, gen: Generation, include_usage: bool) -> None:
        """The OpenAI stream's tail: the usage-only chunk when asked for, then [DONE]."""
        if include_usage:
            await response.write(b"data: " + dumps({**head, "choices": [], "usage": self._usage(gen)}) + b"\n\n")
        await response.write(_DONE)

    def _chat_chunk(
        self, head: dict, delta: dict, reason: str | None, matched: Any, usage_of: Generation | None
    ) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        if reason is not None:
            choice["matched_stop"] = matched
        chunk = {**head, "choices": [choice]}
        if usage_of is not None:
            chunk["usage"] = self._usage(usage_of)
        return b"data: " + dumps(chunk) + b"\n\n"

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _read_json(request, require_json_type=True)
            model = self._check_model(body)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            if prompt is None or prompt == "" or prompt == []:
                raise ApiError(400, "prompt is required")
            if isinstance(prompt, str):
                prompt_ids = self.tokenizer.encode(prompt)
            elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                prompt_ids = list(_token_ids(prompt, "prompt"))
            else:
                raise ApiError(400, "prompt must be a string or a list of token ids (batches are not supported)")
            include_usage, continuous = self._stream_options(body)
            gen = await self._openai_common(body, prompt_ids)
        except ApiError as exc:
            return _error(exc)
        created = int(time.time())
        head = {"id": gen.rid, "object": "text_completion", "created": created, "model": model}
        try:
            if not body.get("stream"):
                async for _ in gen.chunks():
                    pass
                reason, matched = self._finish_fields(gen)
                return _json_response(
                    {
                        **head,
                        "choices": [
                            {
                                "index": 0,
                                "text": gen.text,
                                "logprobs": None,
                                "finish_reason": reason,
                                "matched_stop": matched,
                            }
                        ],
                        "usage": self._usage(gen),
                        "metadata": {"weight_version": WEIGHT_VERSION},
                    }
                )
            response = await self._sse(request)
            try:
                async for delta in gen.chunks():
                    reason, matched = self._finish_fields(gen)
                    if not delta and reason is None:
                        continue
                    choice = {
                        "index": 0,
                        "text": delta,
                        "logprobs": None,
                        "finish_reason": reason,
                        "matched_stop": matched,
                    }
                    chunk = {**head, "choices": [choice], "usage": self._usage(gen) if continuous else None}
                    await response.write(b"data: " + dumps(chunk) + b"\n\n")
                await self._end_stream(response, head, gen, include_usage)
            except ConnectionResetError:
                pass
            return response
        finally:
            gen.close()

    def _model_card(self, name: str) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": "sglang",
            "root": self.config.model_path,
            "max_model_len": self.config.context_length,
        }

    async def models(self, request: web.Request) -> web.Response:
        return _json_response({"object": "list", "data": [self._model_card(self.config.served_model_name)]})

    async def model_card(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in self._model_names:
            return _error(ApiError(404, f"The model `{name}` does not exist."))
        return _json_response(self._model_card(name))

    # -- metadata ---------------------------------------------------------------------
    def server_args(self) -> dict:
        c = self.config
        return {
            "model_path": c.model_path,
            "tokenizer_path": c.tokenizer_path or c.model_path,
            "served_model_name": c.served_model_name,
            "host": c.host,
            "port": c.port,
            "tp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            "page_size": c.page_size,
            "max_running_requests": c.max_running_requests,
            "max_total_tokens": c.max_total_tokens,
            "chunked_prefill_size": c.chunked_prefill_size,
            "max_prefill_tokens": c.chunked_prefill_size,
            "context_length": c.context_length,
            "schedule_policy": "fcfs",
            "enable_hierarchical_cache": c.enable_hierarchical_cache,
            "hicache_ratio": c.hicache_ratio,
            "hicache_size": c.hicache_size,
            "hicache_write_policy": c.hicache_write_policy,
            "hicache_storage_backend": c.hicache_storage_backend or None,
            "enable_priority_scheduling": c.enable_priority_scheduling,
            "schedule_low_priority_values_first": c.schedule_low_priority_values_first,
            "disable_priority_preemption": c.disable_priority_preemption,
            "priority_scheduling_preemption_threshold": c.priority_scheduling_preemption_threshold,
            "enable_metrics": c.enable_metrics,
            "enable_cache_report": c.enable_cache_report,
            "kv_events_config": self._kv_events_config_json(),
            "stream_interval": c.stream_interval,
            "disaggregation_mode": "null",
            "skip_tokenizer_init": False,
            "random_seed": c.seed,
            # simworker's own arguments, under their flag names
            "timing_profile": c.timing_profile,
            "timing_overrides": dict(c.timing_overrides),
            "speedup": c.speedup,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        stats = self.driver.engine.stats()
        args = self.server_args()
        kvcache_gb = self.config.max_total_tokens * self.kv_bytes_per_token / 1e9
        internal = {
            **args,
            "last_gen_throughput": stats.gen_throughput,
            "memory_usage": {
                "weight": 0.0,
                "kvcache": round(kvcache_gb, 3),
                "token_capacity": self.config.max_total_tokens,
                "graph": 0.0,
            },
            "waiting_queue_size": stats.num_queue_reqs,
            "running_batch_size": stats.num_running_reqs,
            "engine_paused": False,
            "simworker_steps": self.driver.steps,
            "simworker_late_s_total": self.driver.late_s_total,
        }
        info = {
            **args,
            "status": "ready",
            "max_total_num_tokens": self.config.max_total_tokens,
            "max_req_input_len": self.config.max_req_input_len,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "internal_states": [internal],
            "version": f"simworker-{SIMWORKER_VERSION}",
        }
        if self.config.enable_hierarchical_cache:
            info["hicache_host_total_tokens"] = self.host_total_tokens
        return _json_response(info)

    async def model_info(self, request: web.Request) -> web.Response:
        return _json_response(
            {
                "model_path": self.config.model_path,
                "tokenizer_path": self.config.tokenizer_path or self.config.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": WEIGHT_VERSION,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "simworker",
                "architectures": ["SimWorkerForCausalLM"],
            }
        )

    def _load(self) -> dict:
        stats = self.driver.engine.stats()
        return {
            "dp_rank": 0,
            "num_reqs": stats.num_running_reqs + stats.num_queue_reqs,
            "num_waiting_reqs": stats.num_queue_reqs,
            "num_tokens": stats.num_used_tokens,
            "num_pending_tokens": 0,
            "ts_tic": time.time(),
            "num_running_reqs": stats.num_running_reqs,
            "num_used_tokens": stats.num_used_tokens,
            "num_total_tokens": self.config.max_total_tokens,
            "max_total_num_tokens": self.config.max_total_tokens,
            "token_usage": stats.token_usage,
            "gen_throughput": stats.gen_throughput,
            "cache_hit_rate": stats.cache_hit_rate,
            "max_running_requests": self.config.max_running_requests,
        }

    async def get_load(self, request: web.Request) -> web.Response:
        return _json_response([self._load()])

    async def loads(self, request: web.Request) -> web.Response:
        return _json_response({"timestamp": time.time(), "loads": [self._load()]})

    # -- health, flush, abort, metrics ---------------------------------------------------
    def _serving(self) -> bool:
        return self.state == "ready" and self.driver.running

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._serving() else 503)

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        if not self._serving():
            return web.Response(status=503)
        rid = f"HEALTH_CHECK_{time.time()}_{uuid.uuid4().hex[:8]}"
        try:
            gen = Generation(
                self.driver,
                self.tokenizer,
                None,
                EngineRequest(rid=rid, input_ids=(0,), max_new_tokens=1, ignore_eos=True),
                (),
                1,
            )
        except ApiError:
            return web.Response(status=503)
        try:
            async with asyncio.timeout(self.config.health_generate_timeout_s):
                async for _ in gen.chunks():
                    break
        except TimeoutError:
            return web.Response(status=503)
        finally:
            gen.close()
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.driver.engine.has_work() or not self.driver.flush_cache():
            return web.Response(
                status=400,
                text="Cache not flushed. Please check backend logs for more details. "
                "(When there are running or waiting requests, the operation will "
                "not be performed.)\n",
            )
        log.info("simworker: cache flushed")
        return web.Response(
            status=200,
            text="Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not "
            "be performed.)\n",
        )

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await _read_json(request, require_json_type=False)
        except ApiError as exc:
            return _error(exc)
        if body.get("abort_all"):
            for rid in self.driver.in_flight():
                self.driver.abort(rid)
        elif isinstance(body.get("rid"), str):
            self.driver.abort(body["rid"])
        else:
            return _error(ApiError(400, "give rid or abort_all"))
        return web.Response(status=200)

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})
