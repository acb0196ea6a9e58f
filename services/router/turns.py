"""One agent turn, whatever API it came in on: admit -> pick -> bind -> stream -> complete.

    turn = await runner.open(spec)          # Admit (may wait while the program is paused), pick, Bind,
                                            # send upstream and wait for the first chunk; one retry on
                                            # another worker if that fails before the first token
    async for block in turn.sse(usage):     # HTTP: the worker's SSE bytes, whole lines, as they arrive
        ...                                 # (gRPC: `async for line, kind in turn.lines()`)
    await turn.close(outcome)               # in `finally`: abort upstream if still open, free the load,
                                            # Complete in the background

The token path does no JSON work except on the chunk that carries usage (or, for /generate, the
last chunk), and no logging. `SseRelay` forwards each read from the worker as one block when C-level
byte tests show it holds only plain data and blank lines; only a block with a line that needs
attention (usage, an error event, a suppressed blank, anything else) is taken apart line by line.
Bookkeeping (Bind, Complete) runs in background tasks off the stream.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import aiohttp
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from services.common.tokenizer import ChatTemplateError
from services.router.config import KvOverrides
from services.router.control import Admission, Outcome, SchedulerClient
from services.router.core.events import EventOutcome, KvEvent
from services.router.core.kv_router import KvRouterCore
from services.router.core.params import KvRouterParams
from services.router.core.prompt_text import CHARS_PER_TOKEN
from services.router.core.select import Candidate, NoWorkerAvailable
from services.router.core.types import Prompt, Replica, WorkerView
from services.router.circuits import WorkerCircuits
from services.router.core.limits import ClientLimits
from services.router.errors import (ModelNotFound, NoHealthyWorker, RouterError, TooManyRequests, WorkerFailed,
                                    WorkerRejected, WorkerTimeout)
from services.router.metrics import RouterMetrics
from services.router.prompts import PromptMode, PromptTokenizer
from services.router.redaction import redact
from services.router.session import SessionIdentity
from services.router.upstream import Upstream, dumps, loads

log = logging.getLogger(__name__)

_LIMIT_MESSAGES = {
    "too_many_programs": "this client holds too many open programs; end some (X-Dynamo-Session-Final: true) "
                         "or retry later",
    "new_program_rate": "this client starts new programs too fast; retry later",
}


class Api(enum.Enum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    GENERATE = "/generate"


class LineKind(enum.Enum):
    DATA = 0        # a data line to forward
    USAGE = 1       # OpenAI usage-only chunk (choices: [])
    DONE = 2        # data: [DONE]
    BLANK = 3       # event separator
    ERROR = 4       # data: {"error": ...}: the worker failed mid-stream (never forwarded)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class TurnSpec:
    api: Api
    body: dict                      # forwarded to the worker; `priority`/`stream_options` are set here
    identity: SessionIdentity
    model: str | None
    stream: bool
    prompt_text: str = ""           # rendered prompt, when the request is text
    prompt_token_ids: list[int] | None = None   # given by the client, or from the model tokenizer
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    client: str = ""                # who sent it (edge.client_identity), for the per-client limits
    traffic: str = "online"         # "batch" when marked X-Bandmaster-Traffic: batch (session.traffic)


def resolve_params(overrides: KvOverrides, scheduler_config, page_size: int | None) -> KvRouterParams:
    """Flags win; then the scheduler's GetRouterConfig; then the core's defaults. The block size
    follows the flag, else the workers' page size (the index must use the engine's pages), else
    the scheduler's router_block_size."""
    defaults = KvRouterParams()
    sc = scheduler_config

    def pick(flag, from_scheduler, default):
        if flag is not None:
            return flag
        return from_scheduler if sc is not None else default

    block_size = overrides.block_size or page_size or (sc.router_block_size if sc is not None and
                                                       sc.router_block_size > 1 else None) or defaults.block_size
    return KvRouterParams(
        router_temperature=pick(overrides.router_temperature, sc and sc.router_temperature, defaults.router_temperature),
        kv_overlap_score_weight=pick(overrides.kv_overlap_score_weight, sc and sc.kv_overlap_score_weight,
                                     defaults.kv_overlap_score_weight),
        use_kv_events=pick(overrides.use_kv_events, sc and sc.use_kv_events, defaults.use_kv_events),
        router_track_output_blocks=pick(overrides.router_track_output_blocks, sc and sc.router_track_output_blocks,
                                        defaults.router_track_output_blocks),
        block_size=block_size,
        router_ttl_s=pick(overrides.router_ttl_secs,
                          sc.router_ttl_secs if sc is not None and sc.router_ttl_secs > 0 else defaults.router_ttl_s,
                          defaults.router_ttl_s),
    )


class Fleet:
    """The routable workers and the selection core over them."""

    def __init__(self, params_for: Callable[[int | None], KvRouterParams], seed: int) -> None:
        self._params_for = params_for
        self._rng = random.Random(None if seed < 0 else seed)
        self.core: KvRouterCore | None = None
        self.workers: dict[str, WorkerView] = {}
        self.on_workers: list[Callable[[dict[str, WorkerView]], None]] = []

    def update(self, workers: dict[str, WorkerView]) -> None:
        if self.core is None and workers:
            page = next(iter(sorted(workers.items())))[1].page_size or None
            self.core = KvRouterCore(self._params_for(page), self._rng)
            p = self.core.params
            log.info("selection: block_size=%d temperature=%g overlap_weight=%g kv_events=%s output_blocks=%s "
                     "ttl=%gs", p.block_size, p.router_temperature, p.kv_overlap_score_weight, p.use_kv_events,
                     p.router_track_output_blocks, p.router_ttl_s)
        if self.core is not None:
            for view in workers.values():
                if view.page_size and view.page_size != self.core.params.block_size:
                    log.warning("worker %s has page_size %d but the router's block size is %d: its KV events "
                                "are dropped", view.worker_id, view.page_size, self.core.params.block_size)
            for worker_id, old in self.workers.items():
                new = workers.get(worker_id)
                for replica in old.replicas:
                    if new is None or replica not in new.replicas:
                        self.core.remove_worker(replica)
        self.workers = workers
        for listener in self.on_workers:
            listener(workers)

    @property
    def model_names(self) -> list[str]:
        return sorted({w.model_name for w in self.workers.values() if w.model_name})

    def serving(self, model: str | None) -> list[WorkerView]:
        """Workers that serve `model` (None = any). Raises NoHealthyWorker / ModelNotFound."""
        if not self.workers:
            raise NoHealthyWorker("no healthy worker")
        if model is None:
            return list(self.workers.values())
        views = [w for w in self.workers.values() if w.model_name == model or not w.model_name]
        if not views:
            raise ModelNotFound(model)
        return views

    @property
    def subscribes_to_kv_events(self) -> bool:
        return self.core is not None and self.core.params.subscribes_to_kv_events

    def apply_kv_event(self, replica: Replica, event: KvEvent) -> EventOutcome | None:
        if self.core is None or not self.core.params.use_kv_events:
            return None
        return self.core.apply_kv_event(replica, event)


@dataclass
class _Bookkeeping:
    """What Complete needs, filled while the turn runs."""

    replica: Replica | None = None
    usage: Usage = field(default_factory=Usage)
    bind_task: asyncio.Task | None = None
    ttft_s: float = 0.0  # dispatch to the first data line of the answer that was used (0 = unknown)
    trace_context: otel_context.Context | None = None  # the turn's (its request span's), for Complete
    upstream_span: trace.Span | None = None  # CLIENT span of the worker request in use, ended at close


class OpenTurn:
    """A turn whose worker answered. Iterate `lines()` (streaming) or await `json()`, then `close()`."""

    def __init__(self, runner: "TurnRunner", spec: TurnSpec, admission: Admission | None,
                 response: aiohttp.ClientResponse, worker: WorkerView, replica: Replica,
                 first_line: bytes | None, book: _Bookkeeping) -> None:
        self._runner = runner
        self.spec = spec
        self.admission = admission
        self.response = response
        self.worker = worker
        self.replica = replica
        self._first_line = first_line
        self.book = book
        self.usage = book.usage
        self.finish_reason: str | None = None
        self._closed = False
        # A streamed turn told the worker's breaker "alive" at its first token; a non-streamed one
        # tells it once the whole answer arrived (or not: see close).
        self._verdict_pending = not spec.stream

    async def _blocks(self, *, merge_first: bool) -> AsyncIterator[bytes]:
        """Raw upstream bytes as they arrive, starting with the already-read first line; read
        failures become WorkerTimeout / WorkerFailed (the caller has already sent the first token)."""
        content = self.response.content
        data = self._first_line or b""
        self._first_line = None
        try:
            if data and merge_first:
                # Whatever arrived with the first token goes out in the same write.
                try:
                    data += content.read_nowait()
                except (asyncio.TimeoutError, aiohttp.ClientError):
                    pass  # readany raises it again, after the first line went out
            while True:
                if data:
                    yield data
                data = await content.readany()
                if not data:
                    return
        except asyncio.TimeoutError:
            raise WorkerTimeout(f"worker {self.worker.worker_id} went silent mid-stream") from None
        except aiohttp.ClientError as exc:
            raise WorkerFailed(f"worker {self.worker.worker_id} broke the stream: {exc.__class__.__name__}") from None

    def _report_output(self, relay: "SseRelay", reported: int) -> int:
        """Tell the selection core about output progress every 8 chunks; returns what was reported."""
        core = self._runner.fleet.core
        if core is not None and core.params.router_track_output_blocks and relay.chunks - reported >= 8:
            reported = relay.chunks - relay.chunks % 8
            core.output_progress(self.spec.request_id, reported)
        return reported

    def _absorb_last_generate_line(self, relay: "SseRelay") -> None:
        last = relay.last_data_line()
        if last is not None:
            self._absorb_generate(loads(memoryview(last)[5:]))

    async def sse(self, include_usage: bool) -> AsyncIterator[bytes]:
        """The worker's SSE stream for an HTTP client, as blocks of whole lines: the usage-only chunk
        carries `prompt_tokens_details` and is dropped (with its blank line) unless `include_usage`.
        Raises WorkerFailed / WorkerTimeout if the stream breaks, after yielding what preceded the break
        (the caller has already sent the first token by then)."""
        relay = SseRelay(self.spec.api, include_usage, self._absorb_openai)
        reported = 0
        async for data in self._blocks(merge_first=True):
            out = relay.feed(data)
            reported = self._report_output(relay, reported)
            if out:
                yield out
            if relay.error is not None:
                raise WorkerFailed(relay.error)
        out = relay.end()
        self._report_output(relay, reported)
        if out:
            yield out
        if relay.error is not None:
            raise WorkerFailed(relay.error)
        self._absorb_last_generate_line(relay)

    async def lines(self) -> AsyncIterator[tuple[bytes, LineKind]]:
        """The worker's SSE lines that are forwarded (data, usage, [DONE], blank), one by one, for
        callers that look at every chunk. Raises WorkerFailed / WorkerTimeout if the stream breaks."""
        relay = SseRelay(self.spec.api, True, self._absorb_openai)
        reported = 0
        async for data in self._blocks(merge_first=False):
            for line in split_lines(relay.complete_lines(data)):
                line, kind = relay.classify(line)
                if kind is LineKind.ERROR:
                    raise WorkerFailed(_stream_error(line))
                reported = self._report_output(relay, reported)
                if kind is not None:
                    yield line, kind
        tail = relay.take_partial()
        if tail:
            line, kind = relay.classify(tail)
            if kind is LineKind.ERROR:
                raise WorkerFailed(_stream_error(line))
            if kind is not None:
                yield line, kind
        self._absorb_last_generate_line(relay)

    async def json(self) -> dict:
        try:
            body = await self.response.json(loads=loads, content_type=None)
        except asyncio.TimeoutError:
            raise WorkerTimeout(f"worker {self.worker.worker_id} did not finish in time") from None
        except (aiohttp.ClientError, ValueError) as exc:
            raise WorkerFailed(f"worker {self.worker.worker_id} failed: {exc.__class__.__name__}") from None
        if self.spec.api is Api.GENERATE:
            self._absorb_generate(body)
        else:
            self._absorb_openai(body)
            ensure_cached_details(body)
        self._verdict_pending = False
        self._runner.circuits.succeeded(self.worker.worker_id)
        return body

    def _absorb_openai(self, chunk: dict) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.usage.completion_tokens = int(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                self.usage.cached_tokens = int(details.get("cached_tokens") or 0)
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _absorb_generate(self, body: dict) -> None:
        meta = body.get("meta_info") if isinstance(body, dict) else None
        if isinstance(meta, dict):
            self.usage.prompt_tokens = int(meta.get("prompt_tokens") or 0)
            self.usage.completion_tokens = int(meta.get("completion_tokens") or 0)
            self.usage.cached_tokens = int(meta.get("cached_tokens") or 0)
            reason = meta.get("finish_reason")
            if isinstance(reason, dict):
                self.finish_reason = reason.get("type")

    async def close(self, outcome: int) -> None:
        """Idempotent. Closing an unfinished response aborts the request at the worker."""
        if self._closed:
            return
        self._closed = True
        self.response.close()
        circuits = self._runner.circuits
        if outcome == Outcome.FAILED:   # the worker broke the stream, went silent, or failed the answer
            circuits.failed(self.worker.worker_id, "failed after the first token")
        elif self._verdict_pending:
            circuits.abandoned(self.worker.worker_id)
        span = self.book.upstream_span
        if span is not None:
            span.set_attribute("http.response.status_code", self.response.status)
            span.set_attribute("router.outcome", _OUTCOME_NAMES.get(outcome, "unknown"))
            if outcome == Outcome.FAILED:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "failed after the first token"))
            span.end()
        self._runner._finish(self.spec, self.admission, self.book, outcome)


_OUTCOME_NAMES = {Outcome.OK: "ok", Outcome.CANCELLED: "cancelled", Outcome.FAILED: "failed"}


class SseRelay:
    """What of a worker's SSE bytes reaches the client, one read at a time. No I/O.

    `feed(data)` takes the bytes of one read and returns the bytes to forward: the whole lines so far
    (a trailing partial line waits for the next read; `end()` flushes it). A block of only data lines
    and blank lines, none of them an error event or (OpenAI APIs) a usage chunk, is returned as it is,
    after a handful of `bytes.count` calls. Any other block goes through `classify` line by line, which
    is the one statement of the rules:

    * `data: [DONE]` is forwarded; `data: {"error"...` stops the stream (`error` is set and what came
      before it in the block is returned);
    * every other data line is an output chunk (`chunks`); for /generate the last one carries the usage;
    * an OpenAI chunk with `"usage":{` is parsed (`absorb_usage`); a usage-only chunk (no choices)
      gets `prompt_tokens_details` and is forwarded only with `include_usage`, else it and the next
      blank line are dropped;
    * blank lines (event separators) are forwarded; other lines (comments, `event:`) are not.
    """

    def __init__(self, api: Api, include_usage: bool, absorb_usage: Callable[[dict], None]) -> None:
        self._generate = api is Api.GENERATE
        self._include_usage = include_usage
        self._absorb_usage = absorb_usage
        self._partial = b""
        self._skip_blank = False
        self._last_data = b""   # /generate: a block whose last data line is the latest chunk
        self.chunks = 0         # data lines seen, [DONE] and errors excluded
        self.error: str | None = None

    def complete_lines(self, data: bytes) -> bytes:
        """`data` after the partial line kept from before, up to its last newline (the rest is kept)."""
        if self._partial:
            data = self._partial + data
        cut = data.rfind(b"\n") + 1
        if cut == len(data):
            self._partial = b""
            return data
        self._partial = data[cut:]
        return data[:cut]

    def take_partial(self) -> bytes:
        tail, self._partial = self._partial, b""
        return tail

    def feed(self, data: bytes) -> bytes:
        block = self.complete_lines(data)
        if not block:
            return b""
        if not self._skip_blank and b'data: {"error"' not in block and (
                self._generate or b'"usage":{' not in block):
            # Every line must be a data line or a blank line. The counts find distinct lines, so they
            # add up to the number of lines only if that holds (a miscount sends the block line by line).
            data_lines = block.count(b"\ndata:") + block.startswith(b"data:")
            if data_lines + block.count(b"\n\n") + block.startswith(b"\n") == block.count(b"\n"):
                done = block.count(b"\ndata: [DONE]") + block.startswith(b"data: [DONE]")
                if data_lines > done:
                    self.chunks += data_lines - done
                    if self._generate:
                        self._last_data = block
                return block
        return self._by_line(block)

    def end(self) -> bytes:
        """The worker closed the stream: a last line without a newline is still a line."""
        tail = self.take_partial()
        return self._by_line(tail) if tail else b""

    def last_data_line(self) -> bytes | None:
        """/generate: the last data chunk of the stream (None if there was none)."""
        lines = [line for line in split_lines(self._last_data)
                 if line.startswith(b"data:") and not line.startswith(b"data: [DONE]")]
        return lines[-1] if lines else None

    def _by_line(self, block: bytes) -> bytes:
        out: list[bytes] = []
        for line in split_lines(block):
            line, kind = self.classify(line)
            if kind is LineKind.DATA or kind is LineKind.DONE:
                out.append(line)
            elif kind is LineKind.BLANK:
                if self._skip_blank:
                    self._skip_blank = False
                else:
                    out.append(line)
            elif kind is LineKind.USAGE:
                if self._include_usage:
                    out.append(line)
                else:
                    self._skip_blank = True
            elif kind is LineKind.ERROR:
                self.error = _stream_error(line)
                break
        return b"".join(out)

    def classify(self, line: bytes) -> tuple[bytes, LineKind | None]:
        """One line: (the line to forward, possibly rewritten; its kind, None = not forwarded)."""
        if line.startswith(b"data:"):
            if line.startswith(b"data: [DONE]"):
                return line, LineKind.DONE
            if line.startswith(b'data: {"error"'):
                return line, LineKind.ERROR
            self.chunks += 1
            if self._generate:
                self._last_data = line
            elif b'"usage":{' in line:
                chunk = loads(memoryview(line)[5:])
                self._absorb_usage(chunk)
                if not chunk.get("choices"):
                    # Once per turn: make prompt_tokens_details.cached_tokens always present.
                    if ensure_cached_details(chunk):
                        line = b"data: " + dumps(chunk) + b"\n"
                    return line, LineKind.USAGE
            return line, LineKind.DATA
        if line == b"\n" or line == b"\r\n":
            return line, LineKind.BLANK
        return line, None


def split_lines(block: bytes) -> list[bytes]:
    """`block` cut after every newline (the last piece may have none); no other separator counts."""
    lines = block.split(b"\n")
    last = lines.pop()
    lines = [line + b"\n" for line in lines]
    if last:
        lines.append(last)
    return lines


def ensure_cached_details(chunk: dict) -> bool:
    """SGLang omits `prompt_tokens_details` unless it runs with --enable-cache-report and hit the cache;
    clients get it always (0 when the worker reported nothing). True when `chunk` was changed."""
    usage = chunk.get("usage")
    if not isinstance(usage, dict) or isinstance(usage.get("prompt_tokens_details"), dict):
        return False
    usage["prompt_tokens_details"] = {"cached_tokens": 0}
    return True


def _stream_error(line: bytes) -> str:
    try:
        err = loads(memoryview(line)[5:]).get("error")
        return redact(str(err.get("message") if isinstance(err, dict) else err))
    except Exception:
        return "worker reported an error mid-stream"


class TurnRunner:
    def __init__(self, fleet: Fleet, upstream: Upstream, scheduler: SchedulerClient | None, metrics: RouterMetrics,
                 tracer: trace.Tracer, *, circuits: WorkerCircuits, limits: ClientLimits | None = None,
                 prompts: PromptTokenizer | None = None, batch_priority: int = -10) -> None:
        self.fleet = fleet
        self.batch_priority = batch_priority
        self.upstream = upstream
        self.scheduler = scheduler
        self.metrics = metrics
        self.tracer = tracer
        self.prompts = prompts
        self.circuits = circuits
        self.limits = limits
        self._background: set[asyncio.Task] = set()

    # -- bookkeeping off the stream -----------------------------------------------------------

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def drain(self) -> None:
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def _finish(self, spec: TurnSpec, admission: Admission | None, book: _Bookkeeping, outcome: int) -> None:
        core = self.fleet.core
        if core is not None:
            core.finish(spec.request_id)
        self.metrics.flight(spec.traffic).dec()
        # A final request (X-Dynamo-Session-Final with content) is served like any turn; its program is
        # released once the turn is over, whatever the outcome: its client slot now, at the scheduler
        # after its Complete.
        final = spec.identity.final and spec.identity.is_program
        if final and self.limits is not None:
            self.limits.release(spec.client, spec.identity.session_id)
        if admission is None or self.scheduler is None:
            if final and self.scheduler is not None:
                self._spawn(self.scheduler.release(spec.identity.session_id))
            return
        scheduler, replica, usage, bind_task = self.scheduler, book.replica, book.usage, book.bind_task

        async def complete() -> None:
            # In the turn's trace even when the turn is closed outside its request span (a stream).
            token = otel_context.attach(book.trace_context) if book.trace_context is not None else None
            try:
                if bind_task is not None:
                    await asyncio.gather(bind_task, return_exceptions=True)
                try:
                    await scheduler.complete(spec.identity.session_id, spec.request_id,
                                             replica.worker_id if replica else "", replica.dp_rank if replica else 0,
                                             usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens,
                                             outcome, ttft_s=book.ttft_s)
                finally:
                    if final:
                        await scheduler.release(spec.identity.session_id)
            finally:
                if token is not None:
                    otel_context.detach(token)

        self._spawn(complete())

    # -- the turn --------------------------------------------------------------------------------

    def _prompt(self, spec: TurnSpec, core: KvRouterCore) -> Prompt:
        if spec.prompt_token_ids is not None:
            return core.prompt_from_tokens(spec.prompt_token_ids)
        return core.prompt_from_text(spec.prompt_text, self.estimated_tokens(spec))

    @staticmethod
    def estimated_tokens(spec: TurnSpec) -> int:
        if spec.prompt_token_ids is not None:
            return len(spec.prompt_token_ids)
        return max(1, len(spec.prompt_text) // CHARS_PER_TOKEN)

    async def tokenize(self, spec: TurnSpec) -> PromptMode:
        """With a model tokenizer, give a text prompt its exact token ids (the chat template renders a
        chat request). A request the template cannot render keeps the text approximation: the worker,
        not the router, decides whether it is bad input."""
        if spec.prompt_token_ids is not None:
            return PromptMode.TOKENS
        if self.prompts is None:
            return PromptMode.TEXT
        try:
            spec.prompt_token_ids = await self.prompts.token_ids(
                spec.prompt_text, chat_request=spec.body if spec.api is Api.CHAT else None)
        except ChatTemplateError as exc:
            log.debug("turn %s: prompt not tokenized, routing on its text: %s", spec.request_id, exc)
            return PromptMode.TEXT_FALLBACK
        return PromptMode.TOKENS

    async def release(self, session_id: str, client: str = "") -> bool:
        if self.limits is not None:
            self.limits.release(client, session_id)
        if self.scheduler is None:
            return False
        return await self.scheduler.release(session_id)

    def _check_client_limits(self, spec: TurnSpec) -> None:
        """A new program over its client's cap or rate: TooManyRequests (429) before anything else."""
        if self.limits is None or not spec.identity.is_program:
            return
        verdict = self.limits.admit(spec.client, spec.identity.session_id, time.monotonic())
        if not verdict.allowed:
            reason = verdict.reason.value if verdict.reason else "limited"
            self.metrics.client_limited.labels(reason).inc()
            raise TooManyRequests(_LIMIT_MESSAGES.get(reason, "too many requests"), code=reason,
                                  retry_after_s=verdict.retry_after_s)

    async def open(self, spec: TurnSpec) -> OpenTurn:
        """Admit, pick and connect. On failure the turn is completed here and a RouterError raised."""
        views = self.fleet.serving(spec.model)  # 503/404 before the scheduler is bothered
        self._check_client_limits(spec)
        mode = await self.tokenize(spec)
        self.metrics.prompt(mode.value).inc()
        admission: Admission | None = None
        if self.scheduler is not None:
            admission = await self.scheduler.admit(spec.identity.session_id, spec.identity.parent_session_id,
                                                   spec.request_id, self.estimated_tokens(spec))
        if spec.traffic == "batch":
            # Batch work yields to every online turn in the worker's queue, whatever the scheduler said.
            spec.body["priority"] = self.batch_priority
        elif admission is not None:
            spec.body["priority"] = admission.priority
        book = _Bookkeeping(trace_context=otel_context.get_current())
        self.metrics.flight(spec.traffic).inc()
        outcome = Outcome.FAILED
        try:
            turn = await self._connect(spec, admission, book, views)
            outcome = Outcome.OK
            return turn
        except asyncio.CancelledError:
            outcome = Outcome.CANCELLED
            raise
        finally:
            if outcome != Outcome.OK:
                self._finish(spec, admission, book, outcome)

    async def _connect(self, spec: TurnSpec, admission: Admission | None, book: _Bookkeeping,
                       views: list[WorkerView]) -> OpenTurn:
        """Pick among the workers in rotation and send; a failure before the first token is retried once
        on another worker. Every attempt gives the worker's breaker a verdict (or abandons it)."""
        excluded: set[str] = set()
        last_error: RouterError | None = None
        for attempt in range(2):
            if attempt:
                views = self.fleet.serving(spec.model)  # the view may have changed meanwhile
            candidates_views = self.circuits.routable([v for v in views if v.worker_id not in excluded])
            if not candidates_views:
                if last_error is None:
                    retry_s = self.circuits.retry_after(views)
                    raise NoHealthyWorker("every worker is out of rotation after repeated failures",
                                          retry_after_s=retry_s)
                break
            if attempt:
                self.metrics.retries.inc()
            worker, replica = self._pick(spec, admission if attempt == 0 else None, candidates_views, book)
            self.circuits.dispatched(worker.worker_id)
            try:
                return await self._send(spec, admission, worker, replica, book)
            except (WorkerFailed, WorkerTimeout) as exc:
                phase = "connect" if attempt == 0 else "retry"
                self.metrics.upstream_errors.labels(exc.__class__.__name__, phase).inc()
                log.debug("turn %s: worker %s failed before the first token: %s", spec.request_id,
                          worker.worker_id, exc)
                self.circuits.failed(worker.worker_id, exc.message)
                excluded.add(worker.worker_id)
                last_error = exc
                core = self.fleet.core
                if core is not None:
                    core.finish(spec.request_id)
            except WorkerRejected:
                self.circuits.succeeded(worker.worker_id)  # it answered: alive, the request was bad
                raise
            except BaseException:
                self.circuits.abandoned(worker.worker_id)
                raise
        raise last_error or NoHealthyWorker("no healthy worker left to retry on")

    def _pick(self, spec: TurnSpec, admission: Admission | None, views: list[WorkerView],
              book: _Bookkeeping) -> tuple[WorkerView, Replica]:
        core = self.fleet.core
        if core is None:
            raise NoHealthyWorker("no healthy worker")
        pinned = Replica(admission.worker_id, admission.dp_rank) if admission is not None and admission.pinned else None
        now = time.monotonic()
        with self.tracer.start_as_current_span("router.pick") as span:
            try:
                decision = core.pick(self._prompt(spec, core), [Candidate(r) for v in views for r in v.replicas],
                                     now, pinned=pinned)
            except NoWorkerAvailable as exc:
                raise NoHealthyWorker(str(exc)) from None
            span.set_attributes(decision.span_attributes())
            span.set_attribute("router.session", "program" if spec.identity.is_program else "passthrough")
        core.commit(spec.request_id, decision, now)
        self.metrics.pick(decision.reason.value).inc()
        self.metrics.predicted_cached_tokens.inc(decision.chosen.cached_tokens)
        log.debug("turn %s -> %s/%d (%s, overlap %d blocks)", spec.request_id, decision.replica.worker_id,
                  decision.replica.dp_rank, decision.reason.value, decision.overlap_blocks)
        book.replica = decision.replica
        if admission is not None and self.scheduler is not None and not (
                admission.pinned and pinned == decision.replica):
            prior = book.bind_task
            scheduler = self.scheduler

            async def bind() -> None:
                if prior is not None:
                    await asyncio.gather(prior, return_exceptions=True)
                await scheduler.bind(spec.request_id, decision.replica.worker_id, decision.replica.dp_rank)

            book.bind_task = self._spawn(bind())
        worker = next(v for v in views if v.worker_id == decision.replica.worker_id)
        return worker, decision.replica

    async def _send(self, spec: TurnSpec, admission: Admission | None, worker: WorkerView, replica: Replica,
                    book: _Bookkeeping) -> OpenTurn:
        """Dispatch under a CLIENT span whose context the worker gets in `traceparent`. The span ends with
        the worker's answer (at `OpenTurn.close`), or here when the attempt fails. Propagated by hand: the
        aiohttp client instrumentation cannot be installed beside this opentelemetry-sdk (docs/tracing.md),
        and its span would end at the response headers, not with the streamed answer."""
        span = self.tracer.start_span("router.upstream", kind=trace.SpanKind.CLIENT, attributes={
            "http.request.method": "POST", "url.path": spec.api.value, "router.worker_id": worker.worker_id,
            "router.dp_rank": replica.dp_rank, "router.stream": spec.stream})
        headers: dict[str, str] = {}
        propagate.inject(headers, context=trace.set_span_in_context(span))
        try:
            turn = await self._dispatch(spec, admission, worker, replica, book, headers)
        except BaseException as exc:
            span.set_status(trace.Status(trace.StatusCode.ERROR, exc.__class__.__name__))
            span.end()
            raise
        book.upstream_span = span
        return turn

    async def _dispatch(self, spec: TurnSpec, admission: Admission | None, worker: WorkerView, replica: Replica,
                        book: _Bookkeeping, headers: dict[str, str]) -> OpenTurn:
        dispatched_at = time.monotonic()
        if not spec.stream:
            response = await self.upstream.post(worker.worker_id, worker.url + spec.api.value, spec.body, headers,
                                                stream=False)
            return OpenTurn(self, spec, admission, response, worker, replica, None, book)
        # Streamed: the first data line must come within the first-token timeout (wall time from
        # dispatch); a failure before it is retried elsewhere, invisibly to the client.
        response: aiohttp.ClientResponse | None = None
        first_line: bytes | None = None
        try:
            async with asyncio.timeout(self.upstream.first_token_timeout_s):
                response = await self.upstream.post(worker.worker_id, worker.url + spec.api.value, spec.body,
                                                    headers, stream=True)
                while True:
                    line = await response.content.readline()
                    if not line:
                        raise WorkerFailed(f"worker {worker.worker_id} closed the stream before the first token")
                    if line.startswith(b'data: {"error"'):
                        raise WorkerFailed(_stream_error(line))
                    if line.startswith(b"data:"):
                        first_line = line
                        break
        except TimeoutError:
            if response is not None:
                response.close()
            raise WorkerTimeout(f"worker {worker.worker_id} sent no first token within "
                                f"{self.upstream.first_token_timeout_s:g}s") from None
        except aiohttp.ClientError as exc:
            response.close()  # type: ignore[union-attr]  (post maps its own ClientErrors)
            raise WorkerFailed(f"worker {worker.worker_id} failed: {exc.__class__.__name__}") from None
        except BaseException:
            if response is not None:
                response.close()
            raise
        self.upstream.streaming_started(response)
        self.circuits.succeeded(worker.worker_id)
        book.ttft_s = time.monotonic() - dispatched_at
        self.metrics.time_to_first_token(spec.traffic).observe(book.ttft_s)
        core = self.fleet.core
        if core is not None:
            core.first_token(spec.request_id)
        return OpenTurn(self, spec, admission, response, worker, replica, first_line, book)


__all__ = ["Api", "Fleet", "LineKind", "OpenTurn", "SseRelay", "TurnRunner", "TurnSpec", "Usage", "WorkerRejected",
           "resolve_params", "split_lines"]
