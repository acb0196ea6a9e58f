"""The router's client of the scheduler: Admit, Bind, Complete, Release, GetRouterConfig.

A turn's outcome comes in as the domain `Outcome` (core/outcome.py); `complete` sends it as the
protobuf `TurnOutcome`.

Failing open is decided here and only here. `admit` returns None when the scheduler cannot decide,
and the turn is then routed by KV cost alone (`bandmaster_router_scheduler_fail_open_total{reason}`,
one WARN per outage, an INFO when the scheduler answers again):

* `AdmitStream` must send its first message (the decision, or `held`) within the decision deadline
  (`admit_decision_timeout_seconds`, ~2 s). No first message = the scheduler is frozen or cut off:
  `no_answer`. UNAVAILABLE and friends: `unreachable`. The deadline counts only the time this
  process's event loop ran on time (wall time minus its measured lag, services/common/loop_lag.py):
  a router too busy to read the answer does not blame the scheduler for it
  (`bandmaster_router_admit_deadline_extended_total` counts the turns whose window lag lengthened).
* A held call waits for the decision as long as the scheduler said it may hold it
  (`held.max_hold_seconds`, its resume timeout) plus the decision deadline, and never longer than
  `admit_hold_timeout_seconds`: past that, `hold_overrun`.
* Either failure opens a circuit breaker (threshold 1): later turns fail open at once (`outage`)
  without waiting, except one probe Admit per `scheduler_retry_seconds`; a probe that gets an answer
  closes it.

Bind/Complete/Release are short, bounded calls whose failure never fails a turn. Tracing: unary calls get
their CLIENT span and `traceparent` from the gRPC instrumentation on the channel when spans are exported
(when not, the instrumentation's spans would cost CPU on every turn for nothing: the calls carry the
caller's `traceparent` by hand instead); AdmitStream is a stream
the instrumentation does not fit (services/common/telemetry.py), so `admit` opens its own CLIENT span
(`router.admit`) and injects its context by hand.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

import grpc
from opentelemetry import trace

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.common.loop_lag import LoopLag
from services.common.telemetry import inject_metadata
from services.router.core.breaker import BreakerParams, CircuitBreaker, CircuitState
from services.router.core.outcome import Outcome
from services.router.core.params import SchedulerKvSettings
from services.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

# Codes that mean "the scheduler cannot decide now": fail open. Anything else from Admit is a bug
# on one side or the other; we fail open too (the data plane must not stop), but log it as an error.
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN}
RENEW_BATCH = 10_000  # the scheduler's limit of ids per RenewLeases call


_OUTCOME_TO_PROTO = {
    Outcome.OK: pb.TURN_OUTCOME_OK,
    Outcome.CANCELLED: pb.TURN_OUTCOME_CANCELLED,
    Outcome.FAILED: pb.TURN_OUTCOME_FAILED,
    Outcome.NOT_STARTED: pb.TURN_OUTCOME_NOT_STARTED,
}


@dataclass(frozen=True)
class Admission:
    worker_id: str  # "" = any
    dp_rank: int
    pinned: bool
    priority: int
    held_seconds: float
    was_paused: bool


class FailOpen:
    """Why a turn went without admission (the `reason` label of the fail-open counter)."""

    UNREACHABLE = "unreachable"  # UNAVAILABLE / DEADLINE_EXCEEDED / UNKNOWN
    NO_ANSWER = "no_answer"  # no first message within the decision deadline
    HOLD_OVERRUN = "hold_overrun"  # held longer than the scheduler's own bound
    OUTAGE = "outage"  # the scheduler is known down: not asked
    ERROR = "error"  # any other status (a bug on one side): logged at ERROR


class SchedulerClient:
    def __init__(
        self,
        address: str,
        metrics: RouterMetrics,
        *,
        call_timeout_s: float,
        decision_timeout_s: float,
        hold_timeout_s: float,
        breaker: BreakerParams,
        channel: grpc.aio.Channel | None = None,
        tracer: trace.Tracer | None = None,
        loop_lag: LoopLag | None = None,
        inject_context: bool = False,
    ) -> None:
        """`inject_context`: the channel has no tracing interceptor (spans are not exported), so the unary
        calls carry the caller's trace context in their metadata by hand, without a CLIENT span."""
        self.address = address
        self._inject_context = inject_context
        self._loop_lag = loop_lag
        self._metrics = metrics
        self._timeout_s = call_timeout_s
        self._decision_s = decision_timeout_s
        self._hold_cap_s = hold_timeout_s
        self._breaker = CircuitBreaker(breaker)
        self._channel = channel or grpc.aio.insecure_channel(address)
        self._stub = pb_grpc.SchedulerStub(self._channel)
        self._tracer = tracer or trace.get_tracer(__name__)
        self._outage_since: float | None = None
        # Ticket leases: the request ids of admitted turns still running, renewed together.
        self._leases: dict[str, None] = {}
        self._lease_ttl_s = 0.0
        self._renewer: asyncio.Task | None = None

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        await self._channel.close()

    # -- ticket leases ---------------------------------------------------------------------------
    # The scheduler ends an admitted turn whose lease lapses (as if it was cancelled), so that a
    # router that dies mid-turn cannot leave its programs REASONING. While a turn runs, it is renewed
    # with every other running turn in one RenewLeases call per third of the lease.

    def _hold_lease(self, request_id: str, lease_ttl_s: float) -> None:
        if lease_ttl_s <= 0:
            return  # leases off at the scheduler
        self._leases[request_id] = None
        self._lease_ttl_s = lease_ttl_s
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_leases(), name="scheduler-lease-renewal")

    async def _renew_leases(self) -> None:
        while self._leases:
            await asyncio.sleep(self._lease_ttl_s / 3)
            ids = list(self._leases)
            for start in range(0, len(ids), RENEW_BATCH):
                answer = await self._short(
                    "RenewLeases",
                    self._stub.RenewLeases,
                    pb.RenewLeasesRequest(request_ids=ids[start : start + RENEW_BATCH]),
                )
                if answer is None:
                    continue  # logged; the next period tries again, well within the lease
                for request_id in answer.unknown_request_ids:  # completed or expired there
                    self._leases.pop(request_id, None)
                if answer.lease_ttl_seconds > 0:
                    self._lease_ttl_s = answer.lease_ttl_seconds

    @property
    def in_outage(self) -> bool:
        return self._outage_since is not None

    def _ok(self) -> None:
        self._breaker.on_success(time.monotonic())
        # A Complete that succeeds while the breaker is open ends nothing: the next probe Admit does.
        if self._outage_since is not None and self._breaker.state is CircuitState.CLOSED:
            log.info(
                "scheduler %s reachable again after %.1fs; admission resumes",
                self.address,
                time.monotonic() - self._outage_since,
            )
            self._outage_since = None
            self._metrics.scheduler_reachable.set(1)

    def _down(self, method: str, why: str) -> None:
        self._metrics.scheduler_errors.labels(method).inc()
        now = time.monotonic()
        self._breaker.on_failure(now)
        if self._outage_since is None:
            self._outage_since = now
            self._metrics.scheduler_reachable.set(0)
            log.warning("scheduler %s unreachable (%s); failing open to KV-aware routing", self.address, why)

    def _unreachable(self, method: str, exc: grpc.aio.AioRpcError) -> None:
        self._down(method, f"{exc.code().name}: {exc.details()}")

    def _on_time_clock(self, loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
        """Wall time on `loop` minus this process's measured event-loop lag (wall time alone without a
        sampler): the clock the decision windows are kept on."""
        lag = self._loop_lag
        if lag is None:
            return loop.time
        return lambda: loop.time() - lag.lag_clock()

    def _fail_open(self, reason: str) -> None:
        self._metrics.fail_open.labels(reason).inc()

    async def admit(
        self, session_id: str, parent_session_id: str, request_id: str, estimated_prompt_tokens: int
    ) -> Admission | None:
        """Admission, or None to fail open. Raises CancelledError when the caller is cancelled
        (gRPC then cancels the call and the scheduler rolls the admission back).

        Under a CLIENT span, current only while this coroutine runs (no generator, no yield), whose context
        goes to the scheduler in the AdmitStream metadata."""
        with self._tracer.start_as_current_span(
            "router.admit",
            kind=trace.SpanKind.CLIENT,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": "bandmaster.scheduler.v1.Scheduler",
                "rpc.method": "AdmitStream",
            },
        ) as span:
            admission = await self._admit(session_id, parent_session_id, request_id, estimated_prompt_tokens)
            span.set_attribute("router.fail_open", admission is None)
            if admission is not None:
                span.set_attribute("router.held_seconds", admission.held_seconds)
                span.set_attribute("router.pinned", admission.pinned)
            return admission

    async def _admit(
        self, session_id: str, parent_session_id: str, request_id: str, estimated_prompt_tokens: int
    ) -> Admission | None:
        now = time.monotonic()
        if not self._breaker.available(now):
            self._fail_open(FailOpen.OUTAGE)
            return None
        self._breaker.on_dispatch(now)  # the probe, when one is due
        request = pb.AdmitRequest(
            session_id=session_id,
            parent_session_id=parent_session_id,
            estimated_prompt_tokens=estimated_prompt_tokens,
            request_id=request_id,
        )
        loop = asyncio.get_running_loop()
        cap_at = loop.time() + self._hold_cap_s
        call = self._stub.AdmitStream(request, timeout=self._hold_cap_s, metadata=inject_metadata())
        # The windows are kept on this loop's on-time clock (wall time minus its measured lag): a window
        # that passed only because our own loop ran late is not the scheduler's silence. The hold cap
        # (wall time) bounds every wait.
        on_time = self._on_time_clock(loop)
        window_end = on_time() + self._decision_s
        held = decided = excused = False
        # One read outlives a timeout that lag excuses (a cancelled read cancels the call), so that the
        # answer on its way is still taken.
        reading: asyncio.Future | None = None
        try:
            while True:
                if reading is None:
                    reading = asyncio.ensure_future(call.read())
                wait_s = min(cap_at - loop.time(), window_end - on_time())
                done, _ = await asyncio.wait((reading,), timeout=max(0.0, wait_s))
                if not done and not reading.done():
                    if on_time() < window_end and loop.time() < cap_at:
                        # Our own loop ran late in the window: the scheduler's answer may be here already.
                        if not excused:
                            excused = True
                            self._metrics.admit_deadline_extended.inc()
                        continue
                    if held:
                        log.warning("scheduler held turn %s past its own bound; failing open", request_id)
                        self._down("Admit", "a held turn was not answered within the scheduler's bound")
                        self._fail_open(FailOpen.HOLD_OVERRUN)
                    else:
                        self._down("Admit", f"no answer to Admit within {self._decision_s:g}s")
                        self._fail_open(FailOpen.NO_ANSWER)
                    return None
                update, reading = reading.result(), None
                if update is grpc.aio.EOF:
                    raise grpc.aio.AioRpcError(
                        grpc.StatusCode.INTERNAL,
                        grpc.aio.Metadata(),
                        grpc.aio.Metadata(),
                        "AdmitStream ended without a decision",
                    )
                if update.HasField("decision"):
                    answer = update.decision
                    decided = True
                    break
                # Held: the scheduler is alive and says wait. It answers again within its bound.
                if not held:
                    held = True
                    self._ok()
                bound_s = update.held.max_hold_seconds
                window_end = float("inf") if bound_s <= 0 else on_time() + bound_s + self._decision_s
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                raise
            if exc.code() in _UNREACHABLE:
                self._unreachable("Admit", exc)
                self._fail_open(FailOpen.UNREACHABLE)
            else:
                # The scheduler answered: it is up, but refused (a bug on one side). The turn fails open.
                self._ok()
                self._metrics.scheduler_errors.labels("Admit").inc()
                log.error("scheduler Admit failed with %s: %s; failing open", exc.code().name, exc.details())
                self._fail_open(FailOpen.ERROR)
            return None
        finally:
            if reading is not None:
                reading.cancel()
            if not decided:
                call.cancel()  # the scheduler rolls the admission back
        self._ok()
        self._metrics.admit_wait.observe(answer.held_seconds)
        self._hold_lease(request_id, answer.lease_ttl_seconds)
        return Admission(
            answer.worker_id,
            answer.dp_rank,
            answer.pinned and bool(answer.worker_id),
            answer.priority,
            answer.held_seconds,
            answer.was_paused,
        )

    async def _short(self, method: str, call, request):
        on_time = self._on_time_clock(asyncio.get_running_loop())
        started = on_time()
        try:
            metadata = inject_metadata() if self._inject_context else None
            answer = await call(request, timeout=self._timeout_s, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and on_time() - started < self._timeout_s:
                # The deadline (wall time) passed while our own loop ran late: not the scheduler's
                # silence, so the scheduler is not taken for down (turns would fail open for it).
                self._metrics.scheduler_errors.labels(method).inc()
                log.debug("scheduler %s exceeded its deadline while this router's loop lagged", method)
                return None
            if exc.code() in _UNREACHABLE:
                self._unreachable(method, exc)
            else:
                self._metrics.scheduler_errors.labels(method).inc()
                log.error("scheduler %s failed with %s: %s", method, exc.code().name, exc.details())
            return None
        self._ok()
        return answer

    async def bind(self, request_id: str, worker_id: str, dp_rank: int) -> None:
        await self._short(
            "Bind", self._stub.Bind, pb.BindRequest(request_id=request_id, worker_id=worker_id, dp_rank=dp_rank)
        )

    async def complete(
        self,
        session_id: str,
        request_id: str,
        worker_id: str,
        dp_rank: int,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        outcome: Outcome,
        *,
        ttft_s: float = 0.0,
    ) -> None:
        try:
            await self._short(
                "Complete",
                self._stub.Complete,
                pb.CompleteRequest(
                    session_id=session_id,
                    request_id=request_id,
                    worker_id=worker_id,
                    dp_rank=dp_rank,
                    prompt_tokens=max(0, prompt_tokens),
                    completion_tokens=max(0, completion_tokens),
                    cached_tokens=max(0, cached_tokens),
                    outcome=_OUTCOME_TO_PROTO[outcome],
                    ttft_seconds=max(0.0, ttft_s),
                ),
            )
        finally:
            self._leases.pop(request_id, None)  # the turn is over (if Complete failed, its lease lapses)

    async def release(self, session_id: str) -> bool:
        answer = await self._short("Release", self._stub.Release, pb.ReleaseRequest(session_id=session_id))
        return bool(answer and answer.released)

    async def router_config(self) -> SchedulerKvSettings | None:
        """The scheduler's KvRouter settings, None when it does not answer."""
        rc = await self._short("GetRouterConfig", self._stub.GetRouterConfig, pb.GetRouterConfigRequest())
        if rc is None:
            return None
        return SchedulerKvSettings(
            router_temperature=rc.router_temperature,
            kv_overlap_score_weight=rc.kv_overlap_score_weight,
            use_kv_events=rc.use_kv_events,
            router_track_output_blocks=rc.router_track_output_blocks,
            router_ttl_secs=rc.router_ttl_secs,
            router_block_size=rc.router_block_size,
        )
