"""The router's client of the scheduler: Admit, Bind, Complete, Release, GetRouterConfig.

Admit and Complete go as operations on one AdmitMux stream per replica (scheduler_mux.py; `mux=False`, or
a scheduler answering UNIMPLEMENTED: an AdmitStream and a Complete call of their own). An operation reads
as the call it replaces, so everything below holds for both ("the call" of an admission is either).

A turn's outcome comes in as the domain `Outcome` (core/outcome.py); `complete` sends it as the
protobuf `TurnOutcome`.

Failing open is decided here and only here. `admit` returns None when the scheduler cannot decide,
and the turn is then routed by KV cost alone (`bandmaster_router_scheduler_fail_open_total{reason}`,
one WARN per outage, an INFO when the scheduler answers again):

* `AdmitStream` must send its first message (the decision, or `held`) within the decision deadline
  (`admit_decision_timeout_seconds`, ~2 s). No first message = the scheduler is frozen or cut off:
  `no_answer`. UNAVAILABLE and friends: `unreachable`. The deadline counts only the time this
  process's event loop ran on time (wall time minus its measured lag, services/common/observe/loop_lag.py):
  a router too busy to read the answer does not blame the scheduler for it
  (`bandmaster_router_admit_deadline_extended_total` counts the turns whose window lag lengthened).
* A held call waits for the decision as long as the scheduler said it may hold it
  (`held.max_hold_seconds`, its resume timeout) plus the decision deadline, and never longer than
  `admit_hold_timeout_seconds`: past that, `hold_overrun`.
* Either failure opens a circuit breaker (threshold 1): later turns fail open at once (`outage`)
  without waiting, except one probe Admit per `scheduler_retry_seconds`; a probe that gets an answer
  closes it.

Active/standby schedulers (a comma-separated `--scheduler-addr`): every call goes to the replica
believed to lead. A standby's FAILED_PRECONDITION names the leader (`bandmaster-scheduler-leader`
trailing metadata) and the call is sent there at once; UNAVAILABLE (a dead or deposed leader), no first
answer within the decision deadline (a frozen one) or no `held` heartbeat within heartbeat + deadline
(a held call on a frozen leader) moves the call to the next address. Admit, Complete and Release keep
trying for `failover_s` (about twice a failover), Bind/RenewLeases/GetRouterConfig for one pass
over the addresses; past that the turn fails open as above, so an outage stays bounded.

Bind/Complete/Release are short, bounded calls whose failure never fails a turn. A turn counts at the
scheduler once its client has received something (`delivered`, sent with RenewLeases within ~50 ms) or once
it completes: Bind, sent as the worker is picked, confirms nothing (a router killed before its client's
first byte leaves a turn the client retries; its lease lapses and the scheduler rolls it back). Tracing: unary calls get
their CLIENT span and `traceparent` from the gRPC instrumentation on the channel when spans are exported
(when not, the instrumentation's spans would cost CPU on every turn for nothing: the calls carry the
caller's `traceparent` by hand instead); AdmitStream is a stream
the instrumentation does not fit (services/common/observe/telemetry.py), so `admit` opens its own CLIENT span
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
from services.common.observe.loop_lag import LoopLag
from services.common.observe.telemetry import inject_metadata, w3c_fields
from services.common.outbound.leader_follow import FOLLOW, leader_hint
from services.common.outbound.retry import RetryPolicy
from services.router.adapters.scheduler_mux import MuxUnsupported, SchedulerMux
from services.router.core.admission_cache import IGNORED_EVENTS, AdmissionCache
from services.router.core.breaker import BreakerParams, CircuitBreaker, CircuitState
from services.router.core.outcome import Outcome
from services.router.core.params import SchedulerKvSettings
from services.router.observe.metrics import RouterMetrics

log = logging.getLogger(__name__)

# Codes that mean "the scheduler cannot decide now": fail open. Anything else from Admit is a bug
# on one side or the other; we fail open too (the data plane must not stop), but log it as an error.
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN}
# Codes after which, with several scheduler addresses, a call goes to another replica.
_MOVE_ON = _UNREACHABLE | FOLLOW
RETRY_PAUSE_S = 0.1  # between two passes over the addresses while no replica leads
PASS_PAUSE = RetryPolicy(first_delay_s=RETRY_PAUSE_S, multiplier=1.0)
"""Between two passes over the addresses while no replica leads: a fixed pause, never past the caller's bound."""
WATCH_RETRY = RetryPolicy(first_delay_s=1.0, multiplier=1.0)
"""Reopening the event stream after it failed (a leader change or an outage reopens it after PASS_PAUSE)."""
MAX_LEARNT = 4  # replicas remembered from redirects beyond the given addresses
_EVENT_NAMES = {value: name.removeprefix("EVENT_KIND_").lower() for name, value in pb.EventKind.items()}
"""Each event kind as the admission cache names it ("paused")."""
_UNWATCHED_KINDS = sorted(value for value, name in _EVENT_NAMES.items() if name in IGNORED_EVENTS)
ENDED_EVENTS = frozenset({"released", "expired"})  # a program's end at the scheduler (its event kinds)
RENEW_BATCH = 10_000  # the scheduler's limit of ids per RenewLeases call
DELIVERED_FLUSH_S = 0.05  # a delivered turn is confirmed at the scheduler within about this


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
    CANCELLED = "cancelled"  # a dispatched Admit (fast path) cut short by the router's own shutdown


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
        channel_factory: Callable[[str], grpc.aio.Channel] | None = None,
        failover_s: float = 5.0,
        tracer: trace.Tracer | None = None,
        loop_lag: LoopLag | None = None,
        inject_context: bool = False,
        mux: bool = True,
    ) -> None:
        """`address`: one scheduler, or every replica of an active/standby pair, comma-separated.
        `channel_factory(address)` opens a channel (`channel`: the first address's, given). `failover_s`:
        with several addresses, how long Admit/Complete/Release look for a leader before failing open.
        `inject_context`: the channel has no tracing interceptor (spans are not exported), so the unary
        calls carry the caller's trace context in their metadata by hand, without a CLIENT span. `mux`: admit
        and complete on one AdmitMux stream per replica (scheduler_mux.py), the calls of their own with a
        scheduler that has none; False = always the calls of their own."""
        self.addresses = [a.strip() for a in address.split(",") if a.strip()] or [address]
        self.address = self.addresses[0]
        """The replica believed to lead (the only one without failover)."""
        self._factory = channel_factory or grpc.aio.insecure_channel
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.SchedulerStub] = {}
        self._mux_on = mux
        self._muxes: dict[str, SchedulerMux] = {}
        if channel is not None:
            self._channels[self.address] = channel
        self._configured = len(self.addresses)
        self._failover_cfg_s = failover_s
        self._suspect_until: dict[str, float] = {}
        """Replicas that just failed to answer: a standby's redirect to one of them is not followed until
        then (it names the leader it last saw, which may be the one that died or froze)."""
        self._inject_context = inject_context
        self._loop_lag = loop_lag
        self._metrics = metrics
        self._timeout_s = call_timeout_s
        self._decision_s = decision_timeout_s
        self._hold_cap_s = hold_timeout_s
        self._breaker = CircuitBreaker(breaker)
        self._tracer = tracer or trace.get_tracer(__name__)
        self._outage_since: float | None = None
        # When a call last reached the scheduler (monotonic): a call that began before it and failed says
        # nothing of the scheduler now (it went to a replica that froze or lost the lead since).
        self._ok_at = float("-inf")
        # Set while an outage lasts: a dispatched Admit with no other replica to try stops waiting then.
        self._outage_began = asyncio.Event()
        # Ticket leases: the request ids of admitted turns still running, renewed together.
        self._leases: dict[str, None] = {}
        self._lease_ttl_s = 0.0
        self._renewer: asyncio.Task | None = None
        # Turns whose client received something since the last flush: confirmed in one RenewLeases call.
        self._delivered: dict[str, None] = {}
        self._confirmer: asyncio.Task | None = None
        # The admission fast path's cache, live while `watch_events` holds the leader's event stream.
        self.cache: AdmissionCache | None = None
        self._watcher: asyncio.Task | None = None
        # Told of each program the scheduler released or expired (the event stream), whichever router saw its
        # last request: this router's per-client program counts and prompt chains forget it.
        self.on_program_ended: Callable[[str], None] | None = None
        self._restart_watch = asyncio.Event()

    async def close(self) -> None:
        for task in (self._renewer, self._confirmer, self._watcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for mux in self._muxes.values():
            await mux.close()
        for channel in self._channels.values():
            await channel.close()

    # -- which replica -----------------------------------------------------------------------------

    def _stub(self, address: str) -> pb_grpc.SchedulerStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = self._factory(address)
            stub = self._stubs[address] = pb_grpc.SchedulerStub(channel)
        return stub

    def _mux(self, address: str) -> SchedulerMux | None:
        """The AdmitMux stream to `address`; None when off, or when that replica has none (an older one)."""
        if not self._mux_on:
            return None
        mux = self._muxes.get(address)
        if mux is None:
            mux = self._muxes[address] = SchedulerMux(
                self._stub(address), address, write_stall_s=max(self._timeout_s, self._decision_s)
            )
        return None if mux.unsupported else mux

    @property
    def _failover_s(self) -> float:
        """The leader search bound: only with more than one replica known (given, or named by a standby's
        redirect: a router given one Service address learns the leader's own address that way)."""
        return self._failover_cfg_s if len(self.addresses) > 1 else 0.0

    def _learn(self, address: str) -> None:
        """Remember a replica a standby named (at most MAX_LEARNT beyond the given ones: pods come and go)."""
        if address in self.addresses:
            return
        self.addresses.append(address)
        while len(self.addresses) > self._configured + MAX_LEARNT:
            dropped = self.addresses.pop(self._configured)
            self._stubs.pop(dropped, None)
            mux = self._muxes.pop(dropped, None)
            if mux is not None:
                asyncio.get_running_loop().create_task(mux.close())
            channel = self._channels.pop(dropped, None)
            if channel is not None:
                asyncio.get_running_loop().create_task(channel.close())

    def _next(self, failed: str, exc: grpc.aio.AioRpcError | None) -> str:
        """Where to send a call that `failed` at `failed`: the leader a standby named (unless that one just
        failed itself), else the next address."""
        hint = leader_hint(exc) if exc is not None else None
        now = time.monotonic()
        if hint is None:
            # No answer, or not a standby's refusal: this replica is suspect for a decision window.
            self._suspect_until[failed] = now + self._decision_s
        elif hint and hint != failed and self._suspect_until.get(hint, 0.0) <= now:
            self._learn(hint)
            return hint
        if failed in self.addresses:
            return self.addresses[(self.addresses.index(failed) + 1) % len(self.addresses)]
        return self.addresses[0]

    def _follow(self, address: str) -> None:
        if address != self.address:
            log.info("scheduler leader: now %s (was %s)", address, self.address)
            self.address = address
            self._cache_lost()  # the event stream is the old leader's: the watcher moves to the new one

    # -- the admission fast path's event stream -------------------------------------------------------

    def _cache_lost(self) -> None:
        if self.cache is not None and self.cache.live:
            self.cache.lost()
            self._restart_watch.set()

    def start_watching(self, cache: AdmissionCache) -> None:
        """Hold the leader's WatchEvents stream and keep `cache` (the admission fast path) in step with it:
        live once the scheduler says it subscribed us, cleared at every event of a program, and whole at
        any loss of the stream, a leader change or an outage."""
        self.cache = cache
        self._watcher = asyncio.get_running_loop().create_task(self._watch_events(cache), name="scheduler-events")
        self._watcher.add_done_callback(_watch_ended)

    async def _watch_events(self, cache: AdmissionCache) -> None:
        # The kinds the cache ignores are not sent (ADMITTED: one per admission, to every router).
        request = pb.WatchEventsRequest(end_on_gap=True, exclude_kinds=_UNWATCHED_KINDS)
        while True:
            self._restart_watch.clear()
            call = self._stub(self.address).WatchEvents(request)
            # A leader change or an outage cancels the call, which ends the read below: again, on the leader.
            restart = asyncio.ensure_future(self._restart_watch.wait())
            restart.add_done_callback(_canceller(call))
            try:
                await asyncio.wait_for(call.initial_metadata(), self._decision_s)
                if not self.in_outage:
                    cache.connected()
                while True:
                    event = await call.read()
                    if event is grpc.aio.EOF:
                        break
                    # A kind from a newer scheduler is a change to its program all the same: its entry goes.
                    kind = _EVENT_NAMES.get(event.kind, "unknown")
                    cache.event(kind, event.session_id)
                    if kind in ENDED_EVENTS and self.on_program_ended is not None:
                        self.on_program_ended(event.session_id)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not restart.done() or (task is not None and task.cancelling()):
                    raise  # the watcher itself was cancelled (closed)
            except (grpc.aio.AioRpcError, asyncio.TimeoutError) as exc:
                if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    log.info("scheduler %s has no event stream: admission fast path off", self.address)
                    cache.lost()
                    return
                log.debug("scheduler event stream: %s", exc)
            finally:
                cache.lost()
                restart.cancel()
                call.cancel()
            await asyncio.sleep((PASS_PAUSE if self._restart_watch.is_set() else WATCH_RETRY).delay_s(1))

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
                    "RenewLeases", pb.RenewLeasesRequest(request_ids=ids[start : start + RENEW_BATCH])
                )
                if answer is None:
                    continue  # logged; the next period tries again, well within the lease
                for request_id in answer.unknown_request_ids:  # completed or expired there
                    self._leases.pop(request_id, None)
                if answer.lease_ttl_seconds > 0:
                    self._lease_ttl_s = answer.lease_ttl_seconds

    def delivered(self, request_id: str) -> None:
        """The turn's client has received something (headers with the first chunk, or the whole answer):
        the turn counts at the scheduler from now on, whatever happens to this router. Until then a lapsed
        lease rolls it back (its client got nothing and retries). Queued, and sent within DELIVERED_FLUSH_S
        with every other turn delivered meanwhile in one RenewLeases call."""
        if request_id not in self._leases:
            return  # leases off at the scheduler, or the turn is already over (Complete counts it)
        self._delivered[request_id] = None
        if self._confirmer is None or self._confirmer.done():
            self._confirmer = asyncio.get_running_loop().create_task(
                self._flush_delivered(), name="scheduler-delivered-flush"
            )

    async def _flush_delivered(self) -> None:
        while self._delivered:
            await asyncio.sleep(DELIVERED_FLUSH_S)
            ids = [rid for rid in self._delivered if rid in self._leases]  # a completed turn needs none
            self._delivered.clear()
            for start in range(0, len(ids), RENEW_BATCH):
                batch = ids[start : start + RENEW_BATCH]
                answer = await self._short("RenewLeases", pb.RenewLeasesRequest(delivered_request_ids=batch))
                if answer is None:
                    # Logged; tried again at the next flush (the lease is renewed meanwhile).
                    self._delivered.update((rid, None) for rid in batch if rid in self._leases)
                    continue
                for request_id in answer.unknown_request_ids:
                    self._leases.pop(request_id, None)

    @property
    def in_outage(self) -> bool:
        return self._outage_since is not None

    def _ok(self) -> None:
        self._ok_at = time.monotonic()
        self._breaker.on_success(self._ok_at)
        # A Complete that succeeds while the breaker is open ends nothing: the next probe Admit does.
        if self._outage_since is not None and self._breaker.state is CircuitState.CLOSED:
            log.info(
                "scheduler %s reachable again after %.1fs; admission resumes",
                self.address,
                time.monotonic() - self._outage_since,
            )
            self._outage_since = None
            self._outage_began.clear()
            self._metrics.scheduler_reachable.set(1)
            self._restart_watch.set()  # the fast path's stream starts afresh

    def _down(self, method: str, why: str, *, began: float | None = None) -> None:
        """The scheduler is taken for down: turns fail open until the breaker's probe gets an answer. Not
        for a call that `began` before another call reached the scheduler (a stale failure: sent to a
        leader that froze, while the router has since followed the new one and been answered there)."""
        self._metrics.scheduler_errors.labels(method).inc()
        now = time.monotonic()
        if began is not None and self._ok_at > began:
            log.debug("scheduler %s failed (%s), but a later call was answered: not an outage", method, why)
            return
        self._cache_lost()
        self._breaker.on_failure(now)
        if self._outage_since is None:
            self._outage_since = now
            self._outage_began.set()
            self._metrics.scheduler_reachable.set(0)
            log.warning("scheduler %s unreachable (%s); failing open to KV-aware routing", self.address, why)

    def _unreachable(self, method: str, exc: grpc.aio.AioRpcError, *, began: float | None = None) -> None:
        self._down(method, f"{exc.code().name}: {exc.details()}", began=began)

    def _on_time_clock(self, loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
        """Wall time on `loop` minus this process's measured event-loop lag (wall time alone without a
        sampler): the clock the decision windows are kept on."""
        lag = self._loop_lag
        if lag is None:
            return loop.time
        return lambda: loop.time() - lag.lag_clock()

    def _fail_open(self, reason: str) -> None:
        self._metrics.fail_open.labels(reason).inc()

    @property
    def failover_bound_s(self) -> float:
        """How long a call that must reach the scheduler keeps trying (the configured failover bound)."""
        return self._failover_cfg_s

    def count_fail_open(self, reason: str, request_id: str) -> None:
        """A turn that went uncounted for a reason outside this client's own calls (a dispatched Admit that
        raised or was cancelled): counted with its reason, and logged."""
        log.warning("turn %s goes without admission (%s); failing open", request_id, reason)
        self._fail_open(reason)

    async def admit(
        self,
        session_id: str,
        parent_session_id: str,
        request_id: str,
        estimated_prompt_tokens: int,
        *,
        dispatched: tuple[str, int] | None = None,
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
            if dispatched is not None:
                span.set_attribute("router.dispatched", True)
            admission = await self._admit(
                session_id, parent_session_id, request_id, estimated_prompt_tokens, dispatched
            )
            span.set_attribute("router.fail_open", admission is None)
            if admission is not None:
                span.set_attribute("router.held_seconds", admission.held_seconds)
                span.set_attribute("router.pinned", admission.pinned)
            return admission

    async def _admit(
        self,
        session_id: str,
        parent_session_id: str,
        request_id: str,
        estimated_prompt_tokens: int,
        dispatched: tuple[str, int] | None = None,
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
        if dispatched is not None:
            request.dispatched = True
            request.dispatched_worker_id, request.dispatched_dp_rank = dispatched
        loop = asyncio.get_running_loop()
        started = loop.time()
        began = time.monotonic()
        address = self.address
        tried: set[str] = set()
        # A dispatched Admit (the admission fast path) has no client waiting on it: the turn runs already.
        # It is given its own bound (the failover bound, at least the decision deadline) and tries again
        # within it after a transient failure (unreachable, no answer, a refusal of its own request id
        # while a cancelled earlier try is rolled back), with one replica known as with several: the
        # scheduler must still learn the turn. Only a failure that lasts fails it open (counted). With one
        # replica a try may wait the rest of the bound; with several, one decision deadline (the scheduler
        # never holds a dispatched Admit): a try sent to a leader that froze must not spend the whole bound
        # there while the router follows its successor.
        dispatched_until = started + max(self._failover_cfg_s, self._decision_s) if dispatched is not None else None
        while True:
            window_s = None
            if dispatched_until is not None and self._failover_s == 0:
                window_s = max(self._decision_s, dispatched_until - loop.time())
            kind, value, exc = await self._admit_once(address, request, request_id, window_s=window_s)
            if kind == "ok":
                self._follow(address)
                answer = value
                break
            single_down = self.in_outage and self._failover_s == 0  # known down, no other replica to try
            if dispatched is not None and dispatched_until is not None and kind != "hold_overrun" and not single_down:
                duplicate = kind == "error" and exc is not None and exc.code() == grpc.StatusCode.ALREADY_EXISTS
                if kind != "error" or duplicate:
                    if loop.time() < dispatched_until:
                        if kind != "error":
                            following = self._next(address, exc)
                            # The leader this router follows now (another call found it meanwhile), else
                            # the next replica.
                            address = self.address if self.address != address else following
                        await asyncio.sleep(PASS_PAUSE.delay_s(1, remaining_s=dispatched_until - loop.time()))
                        continue
                    if duplicate:
                        # Still in flight there under this id after the whole bound: the scheduler holds
                        # this turn's ticket (an earlier try's answer was lost). Complete counts it.
                        self._ok()
                        log.warning("scheduler already holds dispatched turn %s; taking it as admitted", request_id)
                        self._hold_lease(request_id, self._lease_ttl_s)
                        worker, rank = dispatched
                        # (was_paused: its state there unknown here, the program's next turn asks first.)
                        return Admission(worker, rank, False, 0, 0.0, True)
            if kind == "error":
                # The scheduler answered: it is up, but refused (a bug on one side). The turn fails open.
                self._ok()
                self._metrics.scheduler_errors.labels("Admit").inc()
                log.error("scheduler Admit failed with %s: %s; failing open", exc.code().name, exc.details())
                self._fail_open(FailOpen.ERROR)
                return None
            following = self._next(address, exc)  # may learn the leader a standby named
            give_up_at = started + self._failover_s
            if self._failover_s > 0 and loop.time() < give_up_at:
                # Another replica may lead (or is about to): look for it until the failover bound.
                tried.add(address)
                address = following
                if address in tried:
                    # A pass over the replicas found no leader (it is being elected): pause, then again.
                    tried.clear()
                    await asyncio.sleep(PASS_PAUSE.delay_s(1, remaining_s=give_up_at - loop.time()))
                continue
            if kind == "hold_overrun":
                log.warning("scheduler held turn %s past its own bound; failing open", request_id)
                self._down("Admit", "a held turn was not answered within the scheduler's bound", began=began)
                self._fail_open(FailOpen.HOLD_OVERRUN)
            elif kind == "no_answer":
                self._down("Admit", f"no answer to Admit within {self._decision_s:g}s", began=began)
                self._fail_open(FailOpen.NO_ANSWER)
            else:
                self._unreachable("Admit", exc, began=began)
                self._fail_open(FailOpen.UNREACHABLE)
            return None
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

    async def _admit_once(
        self, address: str, request: pb.AdmitRequest, request_id: str, *, window_s: float | None = None
    ):
        """One AdmitStream to `address`: ("ok", decision, None), ("error", None, exc) for a refusal that
        is no outage, or (why, None, exc|None) with why = unreachable / no_answer / hold_overrun. Raises
        CancelledError when the caller is cancelled (gRPC then cancels the call: the scheduler rolls the
        admission back)."""
        loop = asyncio.get_running_loop()
        cap_at = loop.time() + self._hold_cap_s
        stub = self._stub(address)

        def admit_stream():
            return stub.AdmitStream(request, timeout=self._hold_cap_s, metadata=inject_metadata())

        mux = self._mux(address)
        if mux is None:
            call = admit_stream()
        else:
            trace.get_current_span().set_attribute("rpc.method", "AdmitMux")
            call = mux.admit(request, self._hold_cap_s, _trace_carrier(), admit_stream)
        # The windows are kept on this loop's on-time clock (wall time minus its measured lag): a window
        # that passed only because our own loop ran late is not the scheduler's silence. The hold cap
        # (wall time) bounds every wait.
        on_time = self._on_time_clock(loop)
        window_end = on_time() + (self._decision_s if window_s is None else window_s)
        held = decided = excused = False
        # One read outlives a timeout that lag excuses (a cancelled read cancels the call), so that the
        # answer on its way is still taken.
        reading: asyncio.Future | None = None
        try:
            while True:
                if reading is None:
                    reading = asyncio.ensure_future(call.read())
                wait_s = min(cap_at - loop.time(), window_end - on_time())
                if window_s is not None and self._failover_s == 0:
                    # A dispatched Admit (its own, longer, window) to the only replica: once the scheduler
                    # is known down (another call's deadline passed), it is an outage: fail open now.
                    outage = asyncio.ensure_future(self._outage_began.wait())
                    try:
                        await asyncio.wait((reading, outage), timeout=max(0.0, wait_s), return_when="FIRST_COMPLETED")
                    finally:
                        outage.cancel()
                    if not reading.done() and self.in_outage:
                        return "no_answer", None, None
                    done = {reading} if reading.done() else set()
                else:
                    done, _ = await asyncio.wait((reading,), timeout=max(0.0, wait_s))
                if not done and not reading.done():
                    if on_time() < window_end and loop.time() < cap_at:
                        # Our own loop ran late in the window: the scheduler's answer may be here already.
                        if not excused:
                            excused = True
                            self._metrics.admit_deadline_extended.inc()
                        continue
                    return ("hold_overrun" if held else "no_answer"), None, None
                update, reading = reading.result(), None
                if update is grpc.aio.EOF:
                    raise grpc.aio.AioRpcError(
                        grpc.StatusCode.INTERNAL,
                        grpc.aio.Metadata(),
                        grpc.aio.Metadata(),
                        "AdmitStream ended without a decision",
                    )
                if update.HasField("decision"):
                    decided = True
                    return "ok", update.decision, None
                # Held: the scheduler is alive and says wait. It answers again within its bound (and, with
                # leader election, sends `held` again every heartbeat: silence past it = a frozen leader).
                if not held:
                    held = True
                    self._ok()
                bound_s = update.held.max_hold_seconds
                beat_s = update.held.heartbeat_seconds
                if beat_s > 0:
                    window_end = on_time() + beat_s + self._decision_s
                else:
                    window_end = float("inf") if bound_s <= 0 else on_time() + bound_s + self._decision_s
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                raise
            if exc.code() in _MOVE_ON:  # down, frozen, or a standby (no leader here): another replica may lead
                return "unreachable", None, exc
            return "error", None, exc
        finally:
            if reading is not None:
                reading.cancel()
            if not decided:
                call.cancel()  # the scheduler rolls the admission back

    async def _short(self, method: str, request, *, persist: bool = False):
        """One unary call, to the replica believed to lead; with several addresses, on to the others
        (one pass, or until `failover_s` when `persist`: Complete and Release must reach the new leader)."""
        loop = asyncio.get_running_loop()
        on_time = self._on_time_clock(loop)
        first_at = loop.time()
        began = time.monotonic()
        address = self.address
        attempts = 0
        while True:
            attempts += 1
            started = on_time()
            try:
                answer = await self._unary(address, method, request)
            except grpc.aio.AioRpcError as exc:
                lagged = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and on_time() - started < self._timeout_s
                nxt = self._next(address, exc) if exc.code() in _MOVE_ON and not lagged else address
                give_up_at = first_at + (self._failover_s if persist else 0.0)
                if self._failover_s > 0 and exc.code() in _MOVE_ON and not lagged:
                    if attempts <= len(self.addresses) or loop.time() < give_up_at:
                        if attempts % len(self.addresses) == 0:
                            await asyncio.sleep(PASS_PAUSE.delay_s(1, remaining_s=give_up_at - loop.time()))
                        address = nxt
                        continue
                if lagged:
                    # The deadline (wall time) passed while our own loop ran late: not the scheduler's
                    # silence, so the scheduler is not taken for down (turns would fail open for it).
                    self._metrics.scheduler_errors.labels(method).inc()
                    log.debug("scheduler %s exceeded its deadline while this router's loop lagged", method)
                    return None
                if self._failover_s > 0 and not persist:
                    # A pass over the replicas found no leader: a failover is under way. Only Admit (and a
                    # Complete/Release that outlived the failover bound) takes the scheduler for down.
                    self._metrics.scheduler_errors.labels(method).inc()
                    log.debug("scheduler %s: no leader answered (%s)", method, exc.code().name)
                elif exc.code() in _UNREACHABLE or exc.code() in FOLLOW:
                    self._unreachable(method, exc, began=began)
                else:
                    self._metrics.scheduler_errors.labels(method).inc()
                    log.error("scheduler %s failed with %s: %s", method, exc.code().name, exc.details())
                return None
            self._follow(address)
            self._ok()
            return answer

    async def _unary(self, address: str, method: str, request):
        """One call of `method` to `address`: Complete and Bind on the AdmitMux stream when there is one."""
        mux = self._mux(address) if method in _ON_THE_STREAM else None
        if mux is not None:
            op = mux.complete if method == "Complete" else mux.bind
            try:
                if self._inject_context:  # spans are not exported: the caller's context, no span of its own
                    return await op(request, self._timeout_s, _trace_carrier())
                # The CLIENT span the instrumentation gives the unary call.
                with self._tracer.start_as_current_span(
                    _ON_THE_STREAM[method], kind=trace.SpanKind.CLIENT, attributes=_MUX_RPC
                ):
                    return await op(request, self._timeout_s, _trace_carrier())
            except MuxUnsupported:
                pass  # an older scheduler: the call of its own
        metadata = inject_metadata() if self._inject_context else None
        return await getattr(self._stub(address), method)(request, timeout=self._timeout_s, metadata=metadata)

    async def bind(self, request_id: str, worker_id: str, dp_rank: int) -> None:
        await self._short("Bind", pb.BindRequest(request_id=request_id, worker_id=worker_id, dp_rank=dp_rank))

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
                persist=True,
            )
        finally:
            self._leases.pop(request_id, None)  # the turn is over (if Complete failed, its lease lapses)
            self._delivered.pop(request_id, None)

    async def release(self, session_id: str) -> bool:
        answer = await self._short("Release", pb.ReleaseRequest(session_id=session_id), persist=True)
        return bool(answer and answer.released)

    async def router_config(self) -> SchedulerKvSettings | None:
        """The scheduler's KvRouter settings, None when it does not answer."""
        rc = await self._short("GetRouterConfig", pb.GetRouterConfigRequest())
        return None if rc is None else kv_settings_from_proto(rc)


_MUX_RPC = {"rpc.system": "grpc", "rpc.service": "bandmaster.scheduler.v1.Scheduler", "rpc.method": "AdmitMux"}
_ON_THE_STREAM = {"Complete": "router.complete", "Bind": "router.bind"}
"""The unary methods carried on the AdmitMux stream, with the CLIENT span each gets there."""


def _watch_ended(task: asyncio.Task) -> None:
    """The event watcher ends only when it is cancelled (the client closed): any other end is a bug, and
    the admission fast path is off from then on (the cache was cleared as the watch ended)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("scheduler event watch stopped (%r): admission fast path off", task.exception())


def _canceller(call: grpc.aio.Call) -> Callable[[asyncio.Future], None]:
    """A done callback that cancels `call`."""

    def cancel(_done: asyncio.Future) -> None:
        call.cancel()

    return cancel


def _trace_carrier() -> dict[str, str]:
    """The current W3C trace context, for an operation on the AdmitMux stream (the fields the calls send as
    metadata; formatted directly, not through the propagators: one per operation, so one to three a turn)."""
    traceparent, tracestate = w3c_fields()
    return {"traceparent": traceparent, "tracestate": tracestate}


def kv_settings_from_proto(rc: pb.RouterConfig) -> SchedulerKvSettings:
    """The scheduler's GetRouterConfig answer as the router's selection core takes it."""
    return SchedulerKvSettings(
        router_temperature=rc.router_temperature,
        kv_overlap_score_weight=rc.kv_overlap_score_weight,
        use_kv_events=rc.use_kv_events,
        router_track_active_blocks=rc.router_track_active_blocks,
        router_track_output_blocks=rc.router_track_output_blocks,
        router_track_prefill_tokens=rc.router_track_prefill_tokens,
        router_ttl_secs=rc.router_ttl_secs,
        router_block_size=rc.router_block_size,
    )
