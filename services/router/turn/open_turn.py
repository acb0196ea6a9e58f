"""The open turn: a turn whose worker answered, from its first chunk to `close`.

It reads the worker's answer (streamed through the SSE relay, relay.py, or whole), takes the usage and
the finish reason from it, gives the worker's breaker its verdict, ends the upstream span and hands the
turn back to the runner (turns.py) to be completed off the stream.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncGenerator, AsyncIterator, Protocol

import aiohttp
from opentelemetry import context as otel_context
from opentelemetry import trace
from orjson import loads

from services.router.adapters.scheduler import Admission
from services.router.core.outcome import Outcome
from services.router.core.types import Replica, WorkerView
from services.router.errors import WorkerFailed, WorkerTimeout
from services.router.turn.relay import LineKind, SseRelay, ensure_cached_details, split_lines, stream_error
from services.router.turn.turn_types import Api, TurnSpec, Usage
from services.router.workers.circuits import WorkerCircuits
from services.router.workers.fleet import Fleet


@dataclass
class Bookkeeping:
    """What Complete needs, filled while the turn runs."""

    replica: Replica | None = None
    dispatched: bool = False  # a request went to a worker (set as it is sent: it may have got there)
    usage: Usage = field(default_factory=Usage)
    bind_task: asyncio.Task | None = None
    # The admission fast path: the turn started on a cached admission, its Admit (`dispatched`) sent in the
    # background; Bind, the delivery report and Complete follow that task's answer.
    fast: bool = False
    # How the turn was admitted, for the client's X-Bandmaster-Admission header: "admitted" (the scheduler
    # answered before the turn started), "cached" (the fast path: its Admit goes in the background),
    # "fail-open" (the scheduler did not answer: the turn runs uncounted), "off" (no scheduler).
    admission_mode: str = "off"
    admit_task: asyncio.Task | None = None
    delivered: bool = False
    ttft_s: float = 0.0  # dispatch to the first data line of the answer that was used (0 = unknown)
    uncached_tokens: int = 0  # prompt tokens the chosen worker must prefill (the pick's prediction)
    trace_context: otel_context.Context | None = None  # the turn's (its request span's), for Complete
    upstream_span: trace.Span | None = None  # CLIENT span of the worker request in use, ended at close


class TurnOwner(Protocol):
    """What an open turn uses of the runner that opened it (turns.TurnRunner)."""

    fleet: Fleet
    circuits: WorkerCircuits

    def finish(self, spec: TurnSpec, admission: Admission | None, book: Bookkeeping, outcome: Outcome) -> None: ...

    def delivered(self, spec: TurnSpec, admission: Admission | None, book: Bookkeeping) -> None: ...


class OpenTurn:
    """A turn whose worker answered. Iterate `lines()` (streaming) or await `json()`, then `close()`."""

    def __init__(
        self,
        runner: TurnOwner,
        spec: TurnSpec,
        admission: Admission | None,
        response: aiohttp.ClientResponse,
        worker: WorkerView,
        replica: Replica,
        first_line: bytes | None,
        book: Bookkeeping,
        answer: dict | None = None,
    ) -> None:
        self._runner = runner
        self.spec = spec
        self.admission = admission
        self.response = response
        self.worker = worker
        self.replica = replica
        self._first_line = first_line
        self._answer = answer  # a non-streamed turn's whole answer, read before the turn was opened
        self.book = book
        self.usage = book.usage
        self.finish_reason: str | None = None
        self._closed = False
        self._delivered = False
        # A streamed turn told the worker's breaker "alive" at its first token; a non-streamed one
        # tells it once the whole answer arrived (or not: see close).
        self._verdict_pending = not spec.stream

    def delivered(self) -> None:
        """The client has received something (headers with the first chunk, or the whole answer): from now
        on the turn counts at the scheduler even if this router dies (turns.TurnRunner.delivered). Call it
        after the first write to the client. Idempotent."""
        if not self._delivered:
            self._delivered = True
            self._runner.delivered(self.spec, self.admission, self.book)

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

    def _report_output(self, relay: SseRelay, reported: int) -> int:
        """Tell the selection core about output progress every 8 chunks; returns what was reported."""
        core = self._runner.fleet.core
        if core is not None and core.params.router_track_output_blocks and relay.chunks - reported >= 8:
            reported = relay.chunks - relay.chunks % 8
            core.output_progress(self.spec.request_id, reported)
        return reported

    def _absorb_last_generate_line(self, relay: SseRelay) -> None:
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

    async def lines(self) -> AsyncGenerator[tuple[bytes, LineKind], None]:
        """The worker's SSE lines that are forwarded (data, usage, [DONE], blank), one by one, for
        callers that look at every chunk. Raises WorkerFailed / WorkerTimeout if the stream breaks."""
        relay = SseRelay(self.spec.api, True, self._absorb_openai)
        reported = 0
        async for data in self._blocks(merge_first=False):
            for line in split_lines(relay.complete_lines(data)):
                line, kind = relay.classify(line)
                if kind is LineKind.ERROR:
                    raise WorkerFailed(stream_error(line))
                reported = self._report_output(relay, reported)
                if kind is not None:
                    yield line, kind
        tail = relay.take_partial()
        if tail:
            line, kind = relay.classify(tail)
            if kind is LineKind.ERROR:
                raise WorkerFailed(stream_error(line))
            if kind is not None:
                yield line, kind
        self._absorb_last_generate_line(relay)

    async def json(self) -> dict:
        """The non-streamed answer. The runner reads it before it opens the turn (until then the turn may
        still fail over: it has sent nothing to its client), so this only takes the usage from it."""
        body = self._answer
        if body is None:
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

    async def close(self, outcome: Outcome) -> None:
        """Idempotent. Closing an unfinished response aborts the request at the worker."""
        if self._closed:
            return
        self._closed = True
        self.response.close()
        circuits = self._runner.circuits
        if outcome == Outcome.FAILED:  # the worker broke the stream, went silent, or failed the answer
            circuits.failed(self.worker.worker_id, "failed after the first token")
        elif self._verdict_pending:
            circuits.abandoned(self.worker.worker_id)
        span = self.book.upstream_span
        if span is not None:
            span.set_attribute("http.response.status_code", self.response.status)
            span.set_attribute("router.outcome", outcome.value)
            if outcome == Outcome.FAILED:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "failed after the first token"))
            span.end()
        self._runner.finish(self.spec, self.admission, self.book, outcome)
