"""Active/standby scheduler replicas: who decides in this process, and the loop that keeps it so.

`SingleReplica` is the scheduler without leader election: one runtime, always deciding.

`Election` runs a leadership lease in the state store the table already lives in (the pure state machine
is `core/leadership.py`; the store calls are `adapters/state_store.py`):

- standby: tries to take the lease every `poll_s`; serves no decision (`current()` raises NotLeader
  with the leader's address, which the servicer puts in the `bandmaster-scheduler-leader` trailing
  metadata of a FAILED_PRECONDITION); keeps the capacity watch warm.
- takes the lease at epoch E: a *term* starts. A fresh core is rebuilt from the durable table
  (StatePersister.recover, the restart path), the last capacity snapshot is applied, the tick and
  timer loops and the epoch-fenced writer start. Renewals go on while the table loads.
- leader: renews every `renew_s`. It stops deciding the instant its local deadline (the last renewal
  *sent* + ttl - margin) passes, the store says the lease is another's, or a write is fenced; the term
  then ends: held Admits are answered UNAVAILABLE (rolled back; the router retries on the new leader),
  WatchEvents streams end, nothing more is written.
- graceful stop: the term ends with a last (fenced) batch and the lease is released, so a standby
  takes over at its next poll instead of after the TTL.
- a store that lost its data (Redis restarted without persistence): a leader that stepped down because
  it could not renew keeps its table in memory (`Retained`); a standby that finds the store holding no
  table although a leader ran leaves the lease for `ttl + 2 polls` to the replica that may hold it, and
  that replica's next term starts from its own table and writes it back whole instead of starting empty.
  A term of another replica at a later epoch makes the kept table stale: it is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from opentelemetry import trace

from services.common.clock import Clock
from services.scheduler.adapters.state_store import StateStore, StoreError
from services.scheduler.core import durable
from services.scheduler.core.leadership import Leadership, LeaseParams, Role, StepDown, Transition
from services.scheduler.core.state import CoreState
from services.scheduler.loop import SchedulerRuntime, ShuttingDown
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.persist import StatePersister, wait_bounded

log = logging.getLogger("services.scheduler.leader")

DEPOSED = "this scheduler replica is no longer the leader; retry on the new leader"
NOT_STORED = "the state store did not take this decision (it is failing); retry"


class NotLeader(Exception):
    """This replica does not decide (gRPC: FAILED_PRECONDITION, the leader's address in the trailing
    metadata)."""

    def __init__(self, leader_address: str) -> None:
        self.leader_address = leader_address
        where = f"the leader is {leader_address}" if leader_address else "no leader is known yet"
        super().__init__(f"this scheduler replica is a standby; {where}")


@dataclass
class Term:
    """One leadership term's components (a fresh core rebuilt from the store)."""

    epoch: int
    runtime: SchedulerRuntime
    persister: StatePersister | None
    started_at: float


@dataclass(frozen=True)
class Retained:
    """The table of a term that ended because the store stopped answering: the freshest copy if the store
    comes back without its data."""

    epoch: int
    state: CoreState


@dataclass(frozen=True)
class LeadershipView:
    role: str
    replica_id: str
    address: str
    leader_address: str
    epoch: int
    leader_for_s: float
    terms: int


class SingleReplica:
    """No leader election: the one runtime always decides; state is written in batches."""

    def __init__(self, runtime: SchedulerRuntime, address: Callable[[], str]) -> None:
        self.runtime = runtime
        self._address = address

    def current(self) -> SchedulerRuntime:
        return self.runtime

    async def commit(self, runtime: SchedulerRuntime) -> None:
        return None  # the persister writes every flush interval (its documented loss window)

    def refused(self) -> None:
        return None

    def view(self) -> LeadershipView:
        address = self._address()
        return LeadershipView("single", "", address, address, 0, 0.0, 1)


class Election:
    def __init__(
        self,
        params: LeaseParams,
        store: StateStore,
        clock: Clock,
        metrics: SchedulerMetrics,
        build_term: Callable[[int, Callable[[], bool], CoreState | None], Awaitable[Term]],
        *,
        address: Callable[[], str],
        call_timeout_s: float,
        tracer: trace.Tracer | None = None,
        stop_timeout_s: float = 5.0,
    ) -> None:
        """`build_term(epoch, may_decide, retained)` rebuilds the table (from `retained` if the store holds
        none) and starts a term's loops; `address` is this
        replica's advertised address (known once the server is bound). `stop_timeout_s` bounds `stop`
        (the server passes its shutdown grace): past it what did not finish is logged and left behind."""
        self.params = params
        self.store = store
        self.clock = clock
        self.metrics = metrics
        self.build_term = build_term
        self.replica_id = secrets.token_hex(6)
        self.leadership = Leadership(params, self.replica_id, "")
        self._address = address
        self.call_timeout_s = call_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.tracer = tracer or trace.get_tracer("services.scheduler")
        self.term: Term | None = None
        self.terms = 0
        self._starting: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._fenced_epoch: int | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._retained: Retained | None = None
        self._empty_store_since: float | None = None
        """When this replica (holding no table of its own) found the store without a table after a leader ran."""
        self._waited_out = False
        self.on_term: Callable[[Term | None], None] = lambda term: None
        """Told of each term that starts (and None when it ends): the server's capacity feed and tests."""

    # ------------------------------------------------------------------ what the servicer asks

    def leads(self, epoch: int) -> bool:
        """Whether this replica may still decide as the leader of `epoch` (checked per decision)."""
        return (
            self.leadership.epoch == epoch
            and self.leadership.is_leader(self.clock.monotonic())
            and self._fenced_epoch != epoch
        )

    def current(self) -> SchedulerRuntime:
        term = self.term
        if term is None or not self.leads(term.epoch) or term.runtime.stopping:
            raise NotLeader(self.leadership.leader_address(self.clock.monotonic()) if term is None else "")
        return term.runtime

    async def commit(self, runtime: SchedulerRuntime) -> None:
        """Make this term's changes durable before an answer leaves (group commit). Raises ShuttingDown
        (UNAVAILABLE: the caller retries on the new leader) if the term ended or its write was fenced."""
        term = self.term
        if term is None or term.runtime is not runtime or term.persister is None:
            raise ShuttingDown(DEPOSED)
        stored = await term.persister.commit()
        if term.persister.fenced or not self.leads(term.epoch):
            raise ShuttingDown(DEPOSED)
        if not stored and not term.persister.busy:
            # An answer is given only for what a successor would find: with the store down (this leader
            # cannot renew either, and steps down) the call is refused (an Admit rolled back) and the
            # router retries, here or on the next leader. A shared SQLite file whose write lock a frozen
            # replica holds is up, and this leader keeps its lease (another file): it decides on and
            # rewrites the whole table once the lock is free (lost only if it fails before that).
            raise ShuttingDown(NOT_STORED)

    def refused(self) -> None:
        self.metrics.not_leader_refusals.inc()

    def view(self) -> LeadershipView:
        now = self.clock.monotonic()
        lead = self.leadership
        leading = self.term is not None and lead.is_leader(now)
        known = lead.leader
        return LeadershipView(
            "leader" if leading else "standby",
            self.replica_id,
            self._address(),
            lead.leader_address(now) if leading or lead.role is Role.STANDBY else "",
            known.epoch if known is not None else lead.highest_epoch,
            now - self.term.started_at if leading and self.term is not None else 0.0,
            self.terms,
        )

    def fenced(self, epoch: int) -> None:
        """A write of `epoch` was refused (called by the persister): stop deciding now."""
        self._fenced_epoch = epoch
        self._wake.set()

    # ------------------------------------------------------------------ the loop

    def start(self) -> None:
        self.leadership.address = self._address()
        self._task = asyncio.create_task(self._run(), name="scheduler-election")

    async def stop(self) -> None:
        """End the term (last fenced batch), release the lease, stop the loop. Bounded by `stop_timeout_s`:
        each wait gets what is left of it (the lease release keeps its own call timeout), and whatever
        did not finish in time is named in a WARNING and left behind, so a SIGTERM always ends."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_timeout_s
        # What the lease release may need is kept back from the term's stop.
        reserve = min(self.call_timeout_s, self.stop_timeout_s / 4)
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            if not await wait_bounded(task, min(self.call_timeout_s, deadline - reserve - loop.time())):
                log.warning("scheduler leadership: the election loop did not end when cancelled; going on")
        epoch = self.leadership.epoch
        was_leader = self.leadership.role is Role.LEADER
        transition = self.leadership.released(self.clock.monotonic())
        ending = asyncio.ensure_future(
            self._end(transition or Transition(Role.STANDBY, epoch, "stopping", StepDown.SHUTDOWN))
        )
        if not await wait_bounded(ending, deadline - reserve - loop.time()):
            log.warning(
                "scheduler leadership: the term of epoch %d did not end within the %gs stop bound; going on",
                epoch,
                self.stop_timeout_s,
            )
        if was_leader:
            try:
                async with asyncio.timeout(max(0.001, min(self.call_timeout_s, deadline - loop.time()))):
                    await self.store.release_lease(self.replica_id, epoch)
                log.info("scheduler leadership: released the lease (epoch %d)", epoch)
            except (StoreError, TimeoutError, OSError) as exc:
                log.warning("scheduler leadership: could not release the lease (%s); it expires by itself", exc)

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let a bug stop the election: a leader steps down by its deadline
                log.exception("scheduler leadership: election step failed")
                await asyncio.sleep(self.params.poll_s)
            now = self.clock.monotonic()
            delay = max(0.005, min(self.leadership.next_wakeup(now) - now, self.params.poll_s))
            self._wake.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _step(self) -> None:
        lead = self.leadership
        now = self.clock.monotonic()
        if self._fenced_epoch is not None and self._fenced_epoch == lead.epoch and lead.role is Role.LEADER:
            await self._end(lead.lost(now, None, StepDown.FENCED))
        transition = lead.expired(now)
        if transition is not None:
            await self._end(transition)
        if lead.acquire_due(now):
            await self._try_acquire(now)
        elif lead.renew_due(now):
            await self._renew(now)

    async def _try_acquire(self, sent_at: float) -> None:
        lead = self.leadership
        if await self._leaving_a_lost_store_to_its_last_leader(sent_at):
            return
        try:
            async with asyncio.timeout(self.call_timeout_s):
                read = await self.store.acquire_lease(
                    self.replica_id, lead.address, self.params.ttl_s, lead.highest_epoch
                )
        except (StoreError, TimeoutError, OSError) as exc:
            lead.attempt_failed(self.clock.monotonic())
            log.debug("scheduler leadership: cannot reach the lease (%s)", exc)
            return
        if not read.held:
            before = lead.leader
            lead.observed(self.clock.monotonic(), read.record)
            kept = self._retained
            if kept and read.record and read.record.holder != self.replica_id and read.record.epoch > kept.epoch:
                self._retained = None  # another replica's term: its table is fresher than the one kept
                log.info("scheduler leadership: dropped the table kept from epoch %d (a later term ran)", kept.epoch)
            if read.record is not None and before != read.record:
                self.metrics.leader_epoch.set(read.record.epoch)
                log.info(
                    "scheduler leadership: standing by; the leader is %s (epoch %d)",
                    read.record.address or "?",
                    read.record.epoch,
                )
            return
        transition = lead.acquired(sent_at, read.epoch)
        self._span(transition)
        self._fenced_epoch = None
        self.terms += 1
        self.metrics.leader_epoch.set(read.epoch)
        self.metrics.leadership_changes.labels("leader", "acquired").inc()
        log.info("scheduler leadership: %s at epoch %d; loading the table", transition.reason, read.epoch)
        epoch = read.epoch
        self._starting = asyncio.create_task(self._begin(epoch, sent_at), name="scheduler-term-start")

    async def _leaving_a_lost_store_to_its_last_leader(self, now: float) -> bool:
        """True while this standby should not take the lease: the store holds no table although a leader
        ran (it lost its data), this replica has no copy of it, and the replica that led last may: it gets
        `ttl + 2 polls` to take the lease and write its table back. One probe per poll (a key's existence)."""
        lead = self.leadership
        if self._retained is not None or lead.highest_epoch == 0:
            return False
        try:
            async with asyncio.timeout(self.call_timeout_s):
                has_table = await self.store.has_table()
        except (StoreError, TimeoutError, OSError):
            return False  # the acquire fails the same way, and is handled there
        if has_table:
            self._empty_store_since = None
            return False
        grace_s = self.params.ttl_s + 2 * self.params.poll_s
        if self._empty_store_since is None:
            self._empty_store_since = now
            log.warning(
                "scheduler leadership: the store holds no table although epoch %d led (it lost its data); "
                "leaving the lease for %gs to a replica that kept the table",
                lead.highest_epoch,
                grace_s,
            )
        if now - self._empty_store_since < grace_s:
            lead.observed(now, None)
            return True
        if not self._waited_out:
            self._waited_out = True
            log.warning("scheduler leadership: no replica wrote a table back; taking the lease with an empty table")
        return False

    async def _begin(self, epoch: int, acquired_at: float) -> None:
        kept = self._retained
        try:
            term = await self.build_term(epoch, lambda: self.leads(epoch), kept.state if kept else None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("scheduler leadership: cannot start the term of epoch %d (%s); stepping down", epoch, exc)
            if self.leadership.epoch == epoch and self.leadership.role is Role.LEADER:
                self._fenced_epoch = epoch  # gives the lease up through the FENCED path
                self._wake.set()
            return
        if self._retained is kept:
            self._retained = None  # used (the store had no table) or superseded (it had one)
        self._empty_store_since, self._waited_out = None, False
        if not self.leads(epoch):
            await self._stop_term(term, StepDown.LOST)
            return
        self.term = term
        self.metrics.leader.set(1)
        self.on_term(term)
        log.info(
            "scheduler leadership: deciding as the leader (epoch %d, %.3fs after taking the lease)",
            epoch,
            self.clock.monotonic() - acquired_at,
        )

    async def _renew(self, sent_at: float) -> None:
        lead = self.leadership
        budget = min(self.call_timeout_s, max(0.001, lead.valid_until - sent_at))
        try:
            async with asyncio.timeout(budget):
                read = await self.store.renew_lease(self.replica_id, lead.address, lead.epoch, self.params.ttl_s)
        except (StoreError, TimeoutError, OSError) as exc:
            transition = lead.attempt_failed(self.clock.monotonic())
            if transition is None:
                log.warning("scheduler leadership: renewal failed (%s); retrying within the lease", exc)
            await self._end(transition)
            return
        if read.held:
            lead.renewed(sent_at)
            return
        await self._end(lead.lost(self.clock.monotonic(), read.record))

    async def _end(self, transition: Transition | None) -> None:
        if transition is None:
            return
        why = transition.step_down or StepDown.LOST
        if why is StepDown.SHUTDOWN and self.term is None and self._starting is None:
            return  # a standby stopping: no term to end
        self._span(transition)
        if why is not StepDown.SHUTDOWN or self.term is not None:
            log.warning(
                "scheduler leadership: stepping down from epoch %d: %s (%s)",
                transition.epoch,
                transition.reason,
                why.value,
            )
        self.metrics.leadership_changes.labels("standby", why.value).inc()
        self.metrics.leader.set(0)
        starting, self._starting = self._starting, None
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        term, self.term = self.term, None
        if term is not None:
            self.on_term(None)
            await self._stop_term(term, why)
            if why is StepDown.EXPIRED:
                # The store stopped answering: if it comes back without its data, this is the freshest table.
                self._retained = Retained(term.epoch, durable.export_state(term.runtime.core))

    def _span(self, transition: Transition) -> None:
        """One span per leadership decision (a term started, or ended and why)."""
        attributes = {"scheduler.role": transition.role.value, "scheduler.epoch": transition.epoch}
        if transition.step_down is not None:
            attributes["scheduler.step_down"] = transition.step_down.value
        with self.tracer.start_as_current_span("scheduler.leadership", attributes=attributes):
            pass

    async def _stop_term(self, term: Term, why: StepDown) -> None:
        """Held Admits answered UNAVAILABLE (rolled back: their routers retry on the new leader), event
        streams ended, loops stopped, then the writer (a graceful stop writes a last, fenced batch). Each
        step is bounded (`stop_timeout_s` in all): one that does not finish is named and left behind."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_timeout_s
        reason = DEPOSED if why is not StepDown.SHUTDOWN else "scheduler is shutting down"
        persister = term.persister
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [("the runtime", lambda: term.runtime.stop(reason))]
        if persister is not None:
            # Only a graceful stop writes a last batch (fenced by the epoch all the same).
            steps.append(
                (
                    "the state writer",
                    lambda: persister.stop(final_flush=why is StepDown.SHUTDOWN, close_store=False),
                )
            )
        late: list[str] = []
        for what, step in steps:
            task = asyncio.ensure_future(step())
            if not await wait_bounded(task, deadline - loop.time()):
                task.cancel()
                late.append(what)
        self.metrics.watch_core(None, self.clock.monotonic, lambda: 0)
        if late:
            log.warning(
                "scheduler leadership: term of epoch %d ended without waiting for %s (not done within %gs)",
                term.epoch,
                " and ".join(late),
                self.stop_timeout_s,
            )
        log.info("scheduler leadership: term of epoch %d ended in %.3fs", term.epoch, time.perf_counter() - started)
