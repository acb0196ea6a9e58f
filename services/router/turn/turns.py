"""One agent turn, whatever API it came in on: admit -> pick -> bind -> stream -> complete.

    turn = await runner.open(spec)          # refuse a prompt longer than the context; Admit (may wait
                                            # while the program is paused), pick, Bind, send upstream and
                                            # wait for the first chunk (non-streamed: the whole answer);
                                            # one failover to another worker if that fails first
    async for block in turn.sse(usage):     # HTTP: the worker's SSE bytes, whole lines, as they arrive
        ...                                 # (gRPC: `async for line, kind in turn.lines()`)
    await turn.close(outcome)               # in `finally`: abort upstream if still open, free the load,
                                            # Complete in the background

The runner is here; the turn types in turn_types.py, the workers it picks among in fleet.py, the
turn it returns in open_turn.py and the SSE relay that streams it in relay.py. Bookkeeping (Bind,
Complete) runs in background tasks off the stream. A turn that ends before its request was sent to a
worker (its client left, even while being admitted; no worker could take it) is completed `NOT_STARTED`:
the scheduler rolls its admission back, so a turn that never ran is never counted.

Bounded waits (issue 21). Until a turn has sent something to its client (streamed: the first token;
non-streamed: the whole answer, read here before the turn is opened) it fails over, once, to another
worker when its worker
  * refuses, resets, answers 5xx, or sends nothing within the hard bound (first-token timeout, response
    timeout);
  * sends nothing by the turn's answer deadline (core/deadline.py: a floor plus the uncached prompt over
    the worker's observed prefill rate) and then does not answer a health probe (health.WorkerProbes);
  * leaves the fleet (capacity marked it unhealthy, or removed it): the turn is aborted at once (its
    upstream connection closed) and re-sent, when another worker can take it.
A failover is decided before anything reached the client, so the client never sees a turn twice; the
turn's Complete names the worker that answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Mapping

import aiohttp
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from orjson import loads

from services.common.sglang.tokenizer import ChatTemplateError
from services.router.adapters.scheduler import Admission, FailOpen, SchedulerClient
from services.router.adapters.upstream import Upstream
from services.router.core.admission_cache import CachedAdmission
from services.router.core.context_fit import chat_content_chars, context_limit, overflow
from services.router.core.deadline import DeadlineParams, PrefillRates
from services.router.core.kv_router import KvRouterCore
from services.router.core.limits import ClientLimits
from services.router.core.outcome import Outcome
from services.router.core.prompt_text import CHARS_PER_TOKEN
from services.router.core.select import Candidate, NoWorkerAvailable
from services.router.core.types import Prompt, Replica, WorkerView
from services.router.errors import (
    ContextLengthExceeded,
    NoHealthyWorker,
    RouterError,
    TooManyRequests,
    WorkerEvacuated,
    WorkerFailed,
    WorkerRejected,
    WorkerTimeout,
    WorkerUnresponsive,
)
from services.router.observe.metrics import RouterMetrics
from services.router.turn.open_turn import Bookkeeping, OpenTurn
from services.router.turn.prompts import PromptMode, PromptTokenizer
from services.router.turn.relay import stream_error
from services.router.turn.turn_types import Api, TurnSpec
from services.router.workers.circuits import WorkerCircuits
from services.router.workers.fleet import Fleet
from services.router.workers.health import WorkerProbes

log = logging.getLogger(__name__)

_LIMIT_MESSAGES = {
    "too_many_programs": "this client holds too many open programs; end some (X-Dynamo-Session-Final: true) "
    "or retry later",
    "new_program_rate": "this client starts new programs too fast; retry later",
}


_PROMPT_PARAM = {Api.CHAT: "messages", Api.COMPLETIONS: "prompt", Api.GENERATE: "text"}


@dataclass(eq=False)
class Attempt:
    """A turn's request at one worker while the turn has sent nothing to its client: it may still move."""

    spec: TurnSpec
    worker_id: str
    may_fail_over: bool  # the turn's first attempt (one failover per turn)
    excluded: set[str]  # workers it may not move to (this one, and any that failed it)
    interrupted: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """Resolves to the error that ends the attempt early (its worker left the fleet, or missed its probe)."""

    def interrupt(self, error: RouterError) -> bool:
        if self.interrupted.done():
            return False
        self.interrupted.set_result(error)
        return True


class TurnRunner:
    def __init__(
        self,
        fleet: Fleet,
        upstream: Upstream,
        scheduler: SchedulerClient | None,
        metrics: RouterMetrics,
        tracer: trace.Tracer,
        *,
        circuits: WorkerCircuits,
        limits: ClientLimits | None = None,
        prompts: PromptTokenizer | None = None,
        batch_priority: int = -10,
        deadlines: DeadlineParams | None = None,
        probe_timeout_s: float = 3.0,
        probes: WorkerProbes | None = None,
        context_check: bool = True,
        fast_path: bool = False,
    ) -> None:
        self.fleet = fleet
        self.fast_path = fast_path
        """The admission fast path (issue 20 item 4): a turn of a program whose last admission is cached (the
        scheduler's event stream live) starts at once; its Admit (`dispatched`) follows in the background."""
        self.batch_priority = batch_priority
        self.upstream = upstream
        self.scheduler = scheduler
        self.metrics = metrics
        self.tracer = tracer
        self.prompts = prompts
        self.circuits = circuits
        self.limits = limits
        self._background: set[asyncio.Task] = set()
        self.deadlines = deadlines or DeadlineParams()
        self.rates = PrefillRates(self.deadlines)
        self.probe_timeout_s = probe_timeout_s
        self.probes = probes or WorkerProbes(lambda url: upstream.alive(url, probe_timeout_s))
        self.context_check = context_check
        self._pending: dict[str, set[Attempt]] = {}  # worker id -> its turns that have sent nothing yet
        self._dispatching: dict[str, asyncio.Task] = {}  # program -> its fast-path Admit not answered yet
        self._completing: dict[str, asyncio.Task] = {}  # program -> its last turn's Complete not done yet
        if fleet is not None:  # (unit tests build runners without a fleet)
            fleet.on_workers.append(self._on_workers)

    # -- bookkeeping off the stream -----------------------------------------------------------

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def drain(self) -> None:
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def finish(self, spec: TurnSpec, admission: Admission | None, book: Bookkeeping, outcome: Outcome) -> None:
        """The turn is over (`OpenTurn.close`, or `open` failed): free its load, then Complete (and Release
        a final request's program) in the background."""
        core = self.fleet.core
        if core is not None:
            core.finish(spec.request_id)
        self.metrics.flight(spec.traffic).dec()
        if outcome == Outcome.OK and book.ttft_s > 0 and book.replica is not None:
            usage = book.usage
            self.rates.observe(book.replica.worker_id, usage.prompt_tokens - usage.cached_tokens, book.ttft_s)
        # A final request (X-Dynamo-Session-Final with content) is served like any turn; its program is
        # released once the turn is over, whatever the outcome: its client slot now, at the scheduler
        # after its Complete.
        final = spec.identity.final and spec.identity.is_program
        if final and self.limits is not None:
            self.limits.release(spec.client, spec.identity.session_id)
        # A final turn's Release goes after the program's earlier turns reached the scheduler (a fast-path
        # Admit still on its way, a Complete): else the program ends there without them.
        sid = spec.identity.session_id
        earlier = self._earlier_turns(sid) if final else []
        if admission is None or self.scheduler is None or (book.fast and book.admit_task is None):
            # (A fast-path turn that failed before its pick never sent its Admit: the scheduler never knew it.)
            if final and self.scheduler is not None:
                self._spawn(self._release_after(self.scheduler, sid, earlier))
            return
        scheduler, replica, usage, bind_task = self.scheduler, book.replica, book.usage, book.bind_task
        admit_task = book.admit_task

        async def complete() -> None:
            # In the turn's trace even when the turn is closed outside its request span (a stream).
            token = otel_context.attach(book.trace_context) if book.trace_context is not None else None
            try:
                if admit_task is not None:
                    # Never before its Admit: a fast-path turn's Complete follows the Admit's answer.
                    answered = (await asyncio.gather(admit_task, return_exceptions=True))[0]
                    if not isinstance(answered, Admission):
                        # Failed open: the scheduler has no ticket for it (a Complete would be ignored).
                        if final:
                            await self._release_after(scheduler, sid, earlier)
                        return
                if bind_task is not None:
                    await asyncio.gather(bind_task, return_exceptions=True)
                try:
                    await scheduler.complete(
                        spec.identity.session_id,
                        spec.request_id,
                        replica.worker_id if replica else "",
                        replica.dp_rank if replica else 0,
                        usage.prompt_tokens,
                        usage.completion_tokens,
                        usage.cached_tokens,
                        outcome,
                        ttft_s=book.ttft_s,
                    )
                finally:
                    if final:
                        await self._release_after(scheduler, sid, earlier)
            finally:
                if token is not None:
                    otel_context.detach(token)

        task = self._spawn(complete())
        if spec.identity.is_program:
            # A fast-path Admit of the program's next turn is sent after this (`_admit_dispatched`).
            sid = spec.identity.session_id
            self._completing[sid] = task
            task.add_done_callback(
                lambda done: self._completing.pop(sid) if self._completing.get(sid) is done else None
            )

    def _earlier_turns(self, session_id: str) -> list[asyncio.Task]:
        """The program's turns still on their way to the scheduler: a fast-path Admit, a Complete."""
        return [t for t in (self._dispatching.get(session_id), self._completing.get(session_id)) if t is not None]

    @staticmethod
    async def _release_after(scheduler: SchedulerClient, session_id: str, earlier: list[asyncio.Task]) -> bool:
        pending = [t for t in earlier if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=max(scheduler.failover_bound_s, 1.0))
        return await scheduler.release(session_id)

    def delivered(self, spec: TurnSpec, admission: Admission | None, book: Bookkeeping) -> None:
        """The turn's client has received something: the scheduler confirms its admission (a turn that lapses
        unconfirmed, its router dead before its client's first byte, is rolled back there: the client
        retries it). A fast-path turn whose Admit has not answered yet reports it once it has."""
        book.delivered = True
        if admission is not None and self.scheduler is not None:
            if book.admit_task is None or book.admit_task.done():
                self.scheduler.delivered(spec.request_id)

    # -- the admission fast path ----------------------------------------------------------------

    def _cached_admission(self, spec: TurnSpec) -> CachedAdmission | None:
        """The cached admission a turn may start on without waiting for its Admit, or None (the normal path):
        only a turn of a known program whose last admission was not held, while the scheduler's event
        stream is live and the scheduler is not in an outage."""
        scheduler = self.scheduler
        if not self.fast_path or scheduler is None or not spec.identity.is_program:
            return None
        cache = scheduler.cache
        if cache is None or scheduler.in_outage or spec.identity.session_id in self._dispatching:
            # (One Admit in flight per program, as on the normal path: a program whose turns end before their
            # Admits answer would otherwise queue Admits at the scheduler without bound.)
            return None
        return cache.get(time.monotonic(), spec.identity.session_id)

    async def _admit_dispatched(self, spec: TurnSpec, replica: Replica, book: Bookkeeping) -> Admission | None:
        """The Admit of a turn already under way (`dispatched`: the scheduler never holds it). Its answer
        starts the ticket's lease; a delivery seen meanwhile is reported then; Complete waits for it.

        The scheduler must still learn the turn: this runs in its own task (never cancelled with the
        client's turn, bounded by the adapter's own deadline, which tries again after a transient failure),
        is sent after the program's previous Complete (so that it is counted and ordered after it there),
        and a failure that remains is a fail-open, counted with its reason."""
        scheduler = self.scheduler
        assert scheduler is not None
        sid = spec.identity.session_id
        previous = self._completing.get(sid)
        if previous is not None and not previous.done():
            # The previous turn's Complete is still on its way (the client started this turn at once): it
            # goes first, within the failover bound (a Complete is itself bounded).
            await asyncio.wait((previous,), timeout=max(scheduler.failover_bound_s, 1.0))
        cache = scheduler.cache
        token = cache.begin() if cache is not None else None
        try:
            admission = await scheduler.admit(
                sid,
                spec.identity.parent_session_id,
                spec.request_id,
                self.estimated_tokens(spec),
                dispatched=(replica.worker_id, replica.dp_rank),
            )
        except asyncio.CancelledError:
            # Only the router's own shutdown cancels this task: the turn goes uncounted, and says so.
            scheduler.count_fail_open(FailOpen.CANCELLED, spec.request_id)
            raise
        except Exception as exc:  # noqa: BLE001 - the turn runs on regardless; the failure is counted
            log.warning("dispatched Admit of %s failed: %r; the turn goes uncounted", spec.request_id, exc)
            scheduler.count_fail_open(FailOpen.ERROR, spec.request_id)
            admission = None
        if admission is None:
            if cache is not None:
                cache.drop(spec.identity.session_id)
            return None
        if cache is not None and token is not None:
            # What the scheduler says now (it placed the program where the turn runs).
            cache.put(
                time.monotonic(),
                spec.identity.session_id,
                token,
                CachedAdmission(
                    admission.worker_id if admission.pinned else "",
                    admission.dp_rank,
                    admission.pinned,
                    admission.priority,
                ),
                was_paused=admission.was_paused,
            )
        if book.delivered:
            scheduler.delivered(spec.request_id)
        return admission

    # -- the turn --------------------------------------------------------------------------------

    def _prompt(self, spec: TurnSpec, core: KvRouterCore) -> Prompt:
        session = spec.identity.session_id
        if spec.identity.final and session:  # the program's last turn: nothing will extend its prompt
            core.chains.forget(session)
            session = ""
        if spec.prompt_token_ids is not None:
            return core.prompt_from_tokens(spec.prompt_token_ids, session)
        return core.prompt_from_text(spec.prompt_text, self.estimated_tokens(spec), session)

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
                spec.prompt_text, chat_request=spec.body if spec.api is Api.CHAT else None
            )
        except ChatTemplateError as exc:
            log.debug("turn %s: prompt not tokenized, routing on its text: %s", spec.request_id, exc)
            return PromptMode.TEXT_FALLBACK
        return PromptMode.TOKENS

    def program_ended(self, session_id: str) -> None:
        """The scheduler ended the program (released or expired), perhaps through another router: it no longer
        counts against its client here, and its prompt chain is dropped."""
        if self.limits is not None:
            self.limits.forget(session_id)
        core = self.fleet.core
        if core is not None:
            core.chains.forget(session_id)

    async def release(self, session_id: str, client: str = "") -> bool:
        """A final request without content (HTTP) or `Router.Release`: the program's client slot now, and at
        the scheduler after its earlier turns, as a final turn's (a client sends it the moment its last turn's
        answer ended, when that turn's fast-path Admit may not have left yet: released first, the program
        would be re-created there by that Admit and kept until its idle TTL)."""
        if self.limits is not None:
            self.limits.release(client, session_id)
        if self.scheduler is None:
            return False
        return await self._release_after(self.scheduler, session_id, self._earlier_turns(session_id))

    def _check_client_limits(self, spec: TurnSpec) -> None:
        """A new program over its client's cap or rate: TooManyRequests (429) before anything else."""
        if self.limits is None or not spec.identity.is_program:
            return
        verdict = self.limits.admit(spec.client, spec.identity.session_id, time.monotonic())
        if not verdict.allowed:
            reason = verdict.reason.value if verdict.reason else "limited"
            self.metrics.client_limited.labels(reason).inc()
            raise TooManyRequests(
                _LIMIT_MESSAGES.get(reason, "too many requests"), code=reason, retry_after_s=verdict.retry_after_s
            )

    def _check_context(self, spec: TurnSpec, views: list[WorkerView]) -> None:
        """A prompt that cannot fit the workers' context: ContextLengthExceeded (core/context_fit.py)."""
        if not self.context_check:
            return
        limit = context_limit(v.context_length for v in views)
        if not limit:
            return
        if spec.prompt_token_ids is not None:
            verdict = overflow(limit, token_count=len(spec.prompt_token_ids), text_chars=0)
        else:
            messages = spec.body.get("messages") if spec.api is Api.CHAT else None
            chars = chat_content_chars(messages) if isinstance(messages, list) else len(spec.prompt_text)
            verdict = overflow(limit, token_count=None, text_chars=chars)
        if verdict is None:
            return
        with self.tracer.start_as_current_span("router.context_check") as span:
            span.set_attributes(
                {
                    "router.prompt_tokens": verdict.prompt_tokens,
                    "router.prompt_tokens_exact": verdict.exact,
                    "router.context_length": verdict.context_length,
                }
            )
        log.debug("turn %s refused: %s", spec.request_id, verdict.message())
        param = "input_ids" if spec.api is Api.GENERATE and "input_ids" in spec.body else _PROMPT_PARAM[spec.api]
        raise ContextLengthExceeded(verdict.message(), param=param)

    async def open(self, spec: TurnSpec) -> OpenTurn:
        """Admit, pick and connect. On failure the turn is completed here and a RouterError raised."""
        views = self.fleet.serving(spec.model)  # 503/404 before the scheduler is bothered
        self._check_client_limits(spec)
        mode = await self.tokenize(spec)
        self.metrics.prompt(mode.value).inc()
        self._check_context(spec, views)  # 400 before the scheduler holds or counts a turn no worker takes
        admission: Admission | None = None
        fast = self._cached_admission(spec)
        if fast is not None:
            admission = Admission(fast.worker_id, fast.dp_rank, fast.pinned, fast.priority, 0.0, False)
            self.metrics.admission_fast_path.inc()
            trace.get_current_span().set_attribute("router.admission_fast_path", True)
        elif self.scheduler is not None:
            pending = self._dispatching.get(spec.identity.session_id) if spec.identity.is_program else None
            if pending is not None and not pending.done():
                # The program's previous turn's Admit (fast path) is still on its way: this one goes after it.
                await asyncio.wait((pending,), timeout=max(self.scheduler.failover_bound_s, 1.0))
            cache = self.scheduler.cache
            token = cache.begin() if cache is not None and self.fast_path else None
            try:
                admission = await self.scheduler.admit(
                    spec.identity.session_id,
                    spec.identity.parent_session_id,
                    spec.request_id,
                    self.estimated_tokens(spec),
                )
                if admission is not None and token is not None and cache is not None and spec.identity.is_program:
                    cache.put(
                        time.monotonic(),
                        spec.identity.session_id,
                        token,
                        CachedAdmission(admission.worker_id, admission.dp_rank, admission.pinned, admission.priority),
                        was_paused=admission.was_paused,
                    )
            except asyncio.CancelledError:
                # The client left while its turn was being admitted. The scheduler may have answered as it
                # left (an answer it delivered counts there, read here or not): it never started. The
                # scheduler rolls such an admission back, and ignores the word for one it never made.
                self._spawn(
                    self.scheduler.complete(
                        spec.identity.session_id, spec.request_id, "", 0, 0, 0, 0, Outcome.NOT_STARTED
                    )
                )
                raise
        if spec.traffic == "batch":
            # Batch work yields to every online turn in the worker's queue, whatever the scheduler said.
            spec.body["priority"] = self.batch_priority
        elif admission is not None:
            spec.body["priority"] = admission.priority
        book = Bookkeeping(trace_context=otel_context.get_current(), fast=fast is not None)
        if fast is not None:
            book.admission_mode = "cached"
        elif self.scheduler is not None:
            book.admission_mode = "admitted" if admission is not None else "fail-open"
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
                if not book.dispatched:
                    outcome = Outcome.NOT_STARTED  # no worker saw it: the admission is rolled back
                self.finish(spec, admission, book, outcome)

    async def _connect(
        self, spec: TurnSpec, admission: Admission | None, book: Bookkeeping, views: list[WorkerView]
    ) -> OpenTurn:
        """Pick among the workers in rotation and send; a failure before the turn sent anything to its
        client fails over once, to another worker. Every attempt gives the worker's breaker a verdict (or
        abandons it)."""
        excluded: set[str] = set()
        last_error: RouterError | None = None
        for attempt in range(2):
            if attempt:
                views = self.fleet.serving(spec.model)  # the view may have changed meanwhile
            candidates_views = self.circuits.routable([v for v in views if v.worker_id not in excluded])
            if not candidates_views:
                if last_error is None:
                    retry_s = self.circuits.retry_after(views)
                    raise NoHealthyWorker(
                        "every worker is out of rotation after repeated failures", retry_after_s=retry_s
                    )
                break
            if attempt:
                self.metrics.retries.inc()
            worker, replica = self._pick(spec, admission if attempt == 0 else None, candidates_views, book)
            self.circuits.dispatched(worker.worker_id)
            excluded.add(worker.worker_id)
            try:
                return await self._send(
                    spec, admission, worker, replica, book, Attempt(spec, worker.worker_id, attempt == 0, excluded)
                )
            except (WorkerFailed, WorkerTimeout) as exc:
                phase = "connect" if attempt == 0 else "retry"
                self.metrics.upstream_errors.labels(exc.__class__.__name__, phase).inc()
                log.debug(
                    "turn %s: worker %s failed before the turn sent anything: %s",
                    spec.request_id,
                    worker.worker_id,
                    exc,
                )
                if isinstance(exc, WorkerEvacuated):
                    self.circuits.abandoned(worker.worker_id)  # capacity's verdict, not this turn's
                else:
                    self.circuits.failed(worker.worker_id, exc.message)
                last_error = exc
                core = self.fleet.core
                if core is not None:
                    core.finish(spec.request_id)
                if attempt == 0:
                    with self.tracer.start_as_current_span("router.failover") as span:
                        span.set_attributes(
                            {
                                "router.worker_id": worker.worker_id,
                                "router.failover.reason": exc.__class__.__name__,
                                "router.stream": spec.stream,
                            }
                        )
            except WorkerRejected:
                self.circuits.succeeded(worker.worker_id)  # it answered: alive, the request was bad
                raise
            except BaseException:
                self.circuits.abandoned(worker.worker_id)
                raise
        raise last_error or NoHealthyWorker("no healthy worker left to retry on")

    # -- moving turns that have sent nothing -----------------------------------------------------

    def _on_workers(self, workers: Mapping[str, WorkerView]) -> None:
        """Each fleet update: a worker that left (capacity marked it unhealthy, or removed it) gives up its
        turns that have sent nothing to their clients, when another worker can take them (with none, the
        turn stays: its deadline and the hard bounds still apply)."""
        self.rates.forget(workers)
        self.probes.forget(workers)
        for worker_id in [w for w in self._pending if w not in workers]:
            moved = 0
            for attempt in self._pending[worker_id]:
                if attempt.may_fail_over and self._has_alternative(attempt, workers):
                    moved += attempt.interrupt(
                        WorkerEvacuated(
                            f"worker {worker_id} left the fleet (marked unhealthy) before the turn sent anything"
                        )
                    )
            if moved:
                log.info(
                    "worker %s left the fleet: %d turns that had sent nothing move to another worker", worker_id, moved
                )

    def _has_alternative(self, attempt: Attempt, workers: Mapping[str, WorkerView]) -> bool:
        model = attempt.spec.model
        views = [
            v
            for v in workers.values()
            if v.worker_id not in attempt.excluded and (model is None or v.model_name == model or not v.model_name)
        ]
        return bool(self.circuits.routable(views))

    async def _watch(self, worker: WorkerView, attempt: Attempt, deadline_s: float) -> None:
        """Started at the attempt's deadline: interrupts it with WorkerUnresponsive once the worker misses a
        health probe. A worker that answers is only slow: it is asked again every deadline floor."""
        while not attempt.interrupted.done():
            if not await self.probes.alive(worker.worker_id, worker.url):
                attempt.interrupt(
                    WorkerUnresponsive(
                        f"worker {worker.worker_id} sent nothing within {deadline_s:.1f}s and did not answer a "
                        f"health probe within {self.probe_timeout_s:g}s"
                    )
                )
                return
            await asyncio.sleep(self.deadlines.floor_s)

    async def _bounded(
        self, worker: WorkerView, attempt: Attempt, deadline_s: float, cap_s: float | None, work: Awaitable[Any]
    ) -> Any:
        """`work`'s result (an open response and what was read of it), unless first: the worker leaves the
        fleet (WorkerEvacuated), misses its probe past the deadline (WorkerUnresponsive), or `cap_s` passes
        (WorkerTimeout). The loser is cancelled; `work` closes its response when cancelled. The common case
        costs one task and one timer: the probe starts only when the deadline passes."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(work)
        watchdog: asyncio.Task | None = None

        def deadline_passed() -> None:
            nonlocal watchdog
            watchdog = loop.create_task(self._watch(worker, attempt, deadline_s))

        timer = loop.call_later(deadline_s, deadline_passed) if cap_s is None or deadline_s < cap_s else None
        pending = self._pending.setdefault(worker.worker_id, set())
        pending.add(attempt)
        delivered = False
        try:
            done, _ = await asyncio.wait(
                (task, attempt.interrupted), timeout=cap_s, return_when=asyncio.FIRST_COMPLETED
            )
            if task in done:
                result = task.result()
                delivered = True
                return result
            if attempt.interrupted.done():
                raise attempt.interrupted.result()
            raise WorkerTimeout(f"worker {worker.worker_id} sent no first token within {cap_s:g}s")
        finally:
            pending.discard(attempt)
            if not pending and self._pending.get(worker.worker_id) is pending:
                del self._pending[worker.worker_id]
            if timer is not None:
                timer.cancel()
            losers = [t for t in (task, watchdog) if t is not None and not t.done()]
            for t in losers:
                t.cancel()
            if losers:
                await asyncio.wait(losers)
            if not delivered and not task.cancelled() and task.exception() is None:
                task.result()[0].close()  # it finished as it lost: abort it at the worker

    def _pick(
        self, spec: TurnSpec, admission: Admission | None, views: list[WorkerView], book: Bookkeeping
    ) -> tuple[WorkerView, Replica]:
        core = self.fleet.core
        if core is None:
            raise NoHealthyWorker("no healthy worker")
        pinned = Replica(admission.worker_id, admission.dp_rank) if admission is not None and admission.pinned else None
        now = time.monotonic()
        with self.tracer.start_as_current_span("router.pick") as span:
            try:
                decision = core.pick(
                    self._prompt(spec, core), [Candidate(r) for v in views for r in v.replicas], now, pinned=pinned
                )
            except NoWorkerAvailable as exc:
                raise NoHealthyWorker(str(exc)) from None
            span.set_attributes(decision.span_attributes())
            span.set_attribute("router.session", "program" if spec.identity.is_program else "passthrough")
        core.commit(spec.request_id, decision, now)
        self.metrics.pick(decision.reason.value).inc()
        self.metrics.predicted_cached_tokens.inc(decision.chosen.cached_tokens)
        log.debug(
            "turn %s -> %s/%d (%s, overlap %d blocks)",
            spec.request_id,
            decision.replica.worker_id,
            decision.replica.dp_rank,
            decision.reason.value,
            decision.overlap_blocks,
        )
        book.replica = decision.replica
        book.uncached_tokens = max(0, decision.prompt.isl_tokens - decision.cached_tokens)
        if book.fast and book.admit_task is None:
            # The fast path's Admit, sent as the worker is known (it names it: no Bind), before the request.
            book.admit_task = self._spawn(self._admit_dispatched(spec, decision.replica, book))
            sid = spec.identity.session_id
            self._dispatching[sid] = book.admit_task
            book.admit_task.add_done_callback(
                lambda task: self._dispatching.pop(sid) if self._dispatching.get(sid) is task else None
            )
        elif (
            admission is not None
            and self.scheduler is not None
            and not (admission.pinned and pinned == decision.replica)
        ):
            prior = book.bind_task
            scheduler = self.scheduler

            async def bind() -> None:
                if prior is not None:
                    await asyncio.gather(prior, return_exceptions=True)
                await scheduler.bind(spec.request_id, decision.replica.worker_id, decision.replica.dp_rank)

            book.bind_task = self._spawn(bind())
        worker = next(v for v in views if v.worker_id == decision.replica.worker_id)
        return worker, decision.replica

    async def _send(
        self,
        spec: TurnSpec,
        admission: Admission | None,
        worker: WorkerView,
        replica: Replica,
        book: Bookkeeping,
        attempt: Attempt,
    ) -> OpenTurn:
        """Dispatch under a CLIENT span whose context the worker gets in `traceparent`. The span ends with
        the worker's answer (at `OpenTurn.close`), or here when the attempt fails. Propagated by hand: the
        aiohttp client instrumentation cannot be installed beside this opentelemetry-sdk (docs/tracing.md),
        and its span would end at the response headers, not with the streamed answer."""
        deadline_s = self.rates.deadline_s(worker.worker_id, book.uncached_tokens, self.upstream.first_token_timeout_s)
        span = self.tracer.start_span(
            "router.upstream",
            kind=trace.SpanKind.CLIENT,
            attributes={
                "http.request.method": "POST",
                "url.path": spec.api.value,
                "router.worker_id": worker.worker_id,
                "router.dp_rank": replica.dp_rank,
                "router.stream": spec.stream,
                "router.answer_deadline_s": round(deadline_s, 3),
            },
        )
        headers: dict[str, str] = {}
        propagate.inject(headers, context=trace.set_span_in_context(span))
        try:
            turn = await self._dispatch(spec, admission, worker, replica, book, headers, attempt, deadline_s)
        except BaseException as exc:
            span.set_status(trace.Status(trace.StatusCode.ERROR, exc.__class__.__name__))
            span.end()
            raise
        book.upstream_span = span
        return turn

    async def _dispatch(
        self,
        spec: TurnSpec,
        admission: Admission | None,
        worker: WorkerView,
        replica: Replica,
        book: Bookkeeping,
        headers: dict[str, str],
        attempt: Attempt,
        deadline_s: float,
    ) -> OpenTurn:
        dispatched_at = time.monotonic()
        book.dispatched = True  # from here on the worker may have the request: never NOT_STARTED
        url = worker.url + spec.api.value
        if not spec.stream:
            # The whole answer is read before the turn opens: until it is written to the client the turn
            # has sent nothing and may still fail over. Its hard bound is the response timeout (aiohttp's).
            response, answer = await self._bounded(
                worker, attempt, deadline_s, None, self._whole_answer(worker, url, spec.body, headers)
            )
            return OpenTurn(self, spec, admission, response, worker, replica, None, book, answer=answer)
        # Streamed: the first data line within the first-token timeout (wall time from dispatch).
        response, first_line = await self._bounded(
            worker,
            attempt,
            deadline_s,
            self.upstream.first_token_timeout_s,
            self._first_line(worker, url, spec.body, headers),
        )
        self.upstream.streaming_started(response)
        self.circuits.succeeded(worker.worker_id)
        book.ttft_s = time.monotonic() - dispatched_at
        self.metrics.time_to_first_token(spec.traffic).observe(book.ttft_s)
        core = self.fleet.core
        if core is not None:
            core.first_token(spec.request_id)
        return OpenTurn(self, spec, admission, response, worker, replica, first_line, book)

    async def _first_line(
        self, worker: WorkerView, url: str, body: dict, headers: dict[str, str]
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        response = await self.upstream.post(worker.worker_id, url, body, headers, stream=True)
        try:
            while True:
                line = await response.content.readline()
                if not line:
                    raise WorkerFailed(f"worker {worker.worker_id} closed the stream before the first token")
                if line.startswith(b'data: {"error"'):
                    raise WorkerFailed(stream_error(line))
                if line.startswith(b"data:"):
                    # What came with it, taken now: once the connection breaks, the reader raises instead
                    # of handing out what it buffered, and the turn reaches its client a few loop hops on.
                    try:
                        line += response.content.read_nowait()
                    except (asyncio.TimeoutError, aiohttp.ClientError):
                        pass
                    return response, line
        except BaseException as exc:
            response.close()
            if isinstance(exc, TimeoutError):  # the socket's read timeout (the first-token timeout)
                raise WorkerTimeout(
                    f"worker {worker.worker_id} sent no first token within {self.upstream.first_token_timeout_s:g}s"
                ) from None
            if isinstance(exc, aiohttp.ClientError):
                raise WorkerFailed(f"worker {worker.worker_id} failed: {exc.__class__.__name__}") from None
            raise

    async def _whole_answer(
        self, worker: WorkerView, url: str, body: dict, headers: dict[str, str]
    ) -> tuple[aiohttp.ClientResponse, Any]:
        response = await self.upstream.post(worker.worker_id, url, body, headers, stream=False)
        try:
            return response, loads(await response.read())
        except BaseException as exc:
            response.close()
            if isinstance(exc, TimeoutError):
                raise WorkerTimeout(f"worker {worker.worker_id} did not finish in time") from None
            if isinstance(exc, (aiohttp.ClientError, ValueError)):
                raise WorkerFailed(f"worker {worker.worker_id} failed: {exc.__class__.__name__}") from None
            raise
