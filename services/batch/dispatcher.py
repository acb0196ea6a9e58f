"""The batch dispatcher: drains queued batch requests to an OpenAI-compatible endpoint at no more
than the leased rate, and writes each result to its batch's output or error file.

* Rate: at most one send every 1/rate seconds, where rate is the planner's current drain lease's
  `max_admission_rps` (followed over gRPC, adapters/planner.py) judged on the monotonic clock (an
  expired or missing lease is 0). No burst
  accumulates while paused.
* Requests go without a session header (the scheduler counts them as passthrough load) and carry
  `X-Bandmaster-Batch-Id` / `X-Bandmaster-Traffic: batch`; `priority` is added to the body only
  when configured (`--dispatch-priority`), as SGLang needs priority scheduling enabled for it.
* Restart safety lives in the registry (claim -> sending -> one result). A transport error, a
  timeout, 408, 429 or 5xx is retried up to `max_attempts` sends, after the wait of the one retry
  policy (services/common/outbound/retry.py: exponential from `retry_first_delay_s`, capped, jittered; the
  request holds its in-flight slot meanwhile, so a failing upstream is not hammered); then, like any
  4xx, it becomes an error line. The attempt count lives in the registry row (it survives a restart),
  so the loop is the policy's `may_try_again`/`delay_s` over that count rather than `retrying`.
* Feedback for the planner's tick (sent with ReportDispatch): queued, in flight, actual send rate
  over `window_s`, the applied cap.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import secrets
from typing import Callable

import aiohttp

from services.batch.adapters.registry import Claimed, Registry
from services.batch.core.lease import DispatchFeedback, DrainLease
from services.common.clock import Clock
from services.common.outbound.retry import RetryPolicy

log = logging.getLogger("services.batch.dispatcher")
RETRYABLE = {408, 429, 500, 502, 503, 504}
ADVANCE_INTERVAL_S = 0.25


class Dispatcher:
    def __init__(
        self,
        registry: Registry,
        lease: Callable[[], DrainLease | None],
        clock: Clock,
        *,
        base_url: str,
        max_inflight: int = 16,
        timeout_s: float = 600.0,
        max_attempts: int = 3,
        priority: int | None = None,
        window_s: float = 10.0,
        metrics=None,
        token: str = "",
        ssl_context=None,
        on_transition: Callable[[list], None] = lambda moved: None,
        retry_first_delay_s: float = 0.25,
        retry_max_delay_s: float = 8.0,
    ) -> None:
        self.registry = registry
        self.lease = lease
        self.clock = clock
        self.base_url = base_url.rstrip("/")
        self.max_inflight = max_inflight
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.retry = RetryPolicy(
            first_delay_s=retry_first_delay_s,
            max_delay_s=max(retry_first_delay_s, retry_max_delay_s),
            multiplier=2.0,
            jitter=0.2,
            max_attempts=max_attempts,
        )
        self.priority = priority
        self.window_s = window_s
        self.metrics = metrics
        self.token = token
        self.ssl_context = ssl_context
        self.on_transition = on_transition
        self.inflight: dict[tuple[str, int], asyncio.Task] = {}
        self.sent_total = 0
        self.finished_total = 0
        self._sends: collections.deque[float] = collections.deque()
        self._last_send = -1e18
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self.applied_rate: float | None = None
        self._closing = False
        self._advanced_at = -1e18

    def wake(self) -> None:
        """A new lease or a batch created/cancelled: look again now (and move batches along)."""
        self._advanced_at = -1e18
        self._wake.set()

    async def start(self) -> None:
        recovered = self.registry.recover()
        if recovered:
            log.info("dispatcher: %d requests interrupted by the last shutdown go back to the queue", recovered)
        connector = aiohttp.TCPConnector(ssl=self.ssl_context) if self.ssl_context is not None else None
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=5.0), connector=connector
        )
        self._task = asyncio.create_task(self._run(), name="batch-dispatcher")

    async def stop(self) -> None:
        # A flag as well as the cancel: on 3.11 `wait_for` can swallow a cancel that races a wake.
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        tasks = list(self.inflight.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def current_rate(self) -> float:
        lease = self.lease()
        return 0.0 if lease is None else lease.rate_at(self.clock.monotonic())

    def feedback(self) -> DispatchFeedback:
        now = self.clock.monotonic()
        while self._sends and self._sends[0] < now - self.window_s:
            self._sends.popleft()
        queued, _sending = self.registry.queue_counts()
        lease = self.lease()
        # None = no valid lease (missing or expired); 0.0 = an explicit pause.
        applied = None if lease is None or not lease.valid_at(now) else lease.max_admission_rps
        return DispatchFeedback(queued, len(self.inflight), len(self._sends) / self.window_s, applied)

    async def _run(self) -> None:
        while not self._closing:
            try:
                # The batch lifecycle needs no faster cadence than this; sending can be far faster.
                now = self.clock.monotonic()
                if now - self._advanced_at >= ADVANCE_INTERVAL_S:
                    self._advanced_at = now
                    moved = self.registry.advance(int(self.clock.wall()))
                    if moved:
                        self.on_transition(moved)
                delay = self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatcher step failed")
                delay = 1.0
            self._wake.clear()
            if self._closing:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            except TimeoutError:
                pass

    def _step(self) -> float:
        """Send what the lease allows now; return how long to wait before looking again."""
        rate = self.current_rate()
        self.applied_rate = rate
        if self.metrics is not None:
            self.metrics.dispatch_rate_cap.set(rate)
        if rate <= 0:
            return 0.2
        if len(self.inflight) >= self.max_inflight:
            return 0.2
        now = self.clock.monotonic()
        interval = 1.0 / rate
        wait = self._last_send + interval - now
        if wait > 0:
            return min(wait, 0.2)
        claimed = self.registry.claim(1)
        if not claimed:
            return 0.2
        item = claimed[0]
        self._last_send = now
        self._sends.append(now)
        self.sent_total += 1
        if self.metrics is not None:
            self.metrics.dispatch_sent.inc()
        task = asyncio.create_task(self._send(item), name=f"batch-{item.batch_id}-{item.idx}")
        key = (item.batch_id, item.idx)
        self.inflight[key] = task
        task.add_done_callback(lambda t: self._done(key, t))
        return min(interval, 0.2)

    def _done(self, key: tuple[str, int], task: asyncio.Task) -> None:
        self.inflight.pop(key, None)
        self.finished_total += 1
        if not task.cancelled() and task.exception() is not None:
            log.error("batch request %s crashed", key, exc_info=task.exception())
        self._wake.set()

    async def _send(self, item: Claimed) -> None:
        assert self._session is not None
        body = dict(item.body)
        if self.priority is not None:
            body["priority"] = self.priority
        headers = {
            "X-Bandmaster-Batch-Id": item.batch_id,
            "X-Bandmaster-Traffic": "batch",
            "X-Request-Id": f"{item.batch_id}-{item.idx}-{item.attempts}",
        }
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        status: int | None = None
        payload: object = None
        request_id = ""
        error = ""
        try:
            async with self._session.post(self.base_url + item.url, json=body, headers=headers) as resp:
                status = resp.status
                request_id = resp.headers.get("X-Request-Id", "") or resp.headers.get("x-request-id", "")
                text = await resp.text()
                try:
                    payload = json.loads(text)
                except ValueError:
                    payload = {"text": text}
        except asyncio.CancelledError:
            raise  # shutdown: the row stays `sending` and goes back to the queue at the next start
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        retryable = status is None or status in RETRYABLE
        if retryable and self.retry.may_try_again(item.attempts):
            delay_s = self.retry.delay_s(item.attempts)
            log.debug(
                "batch request %s/%s: %s; requeued in %.2fs", item.batch_id, item.custom_id, error or status, delay_s
            )
            # Cancelled meanwhile (shutdown): the row stays `sending` and is recovered at the next start.
            await asyncio.sleep(delay_s)
            self.registry.requeue(item.batch_id, item.idx)
            return
        if isinstance(payload, dict) and not request_id:
            request_id = str(payload.get("id", ""))
        line_id = f"batch_req_{secrets.token_hex(12)}"
        if status is not None:
            kind = "output" if 200 <= status < 300 else "error"
            line = {
                "id": line_id,
                "custom_id": item.custom_id,
                "response": {"status_code": status, "request_id": request_id, "body": payload},
                "error": None,
            }
        else:
            kind = "error"
            line = {
                "id": line_id,
                "custom_id": item.custom_id,
                "response": None,
                "error": {"code": "upstream_unreachable", "message": error},
            }
        if self.registry.record_result(item.batch_id, item.idx, kind, line) and self.metrics is not None:
            self.metrics.dispatch_results.labels(kind).inc()
