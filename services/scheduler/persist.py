"""Durable scheduler state: recover the table at start, then write what changed in batches.

Nothing is written per RPC. Every `flush_s` (default 1 s) the persister takes the core's changes
(`take_changes`: programs and tickets touched since the last batch), encodes them on the event
loop and hands one batch to the store (SQLite: one transaction and one fsync on the store's own
thread; Redis: one MULTI/EXEC), bounded by `write_timeout_s`. A batch that fails or times out is not
retried piecemeal: the store is marked stale and, once it answers a ping again, the whole table is
written in one replacing batch. So a store outage never blocks an RPC or a tick, costs one WARNING
(and one INFO when it ends) per episode plus a failure counter, and ends with the store exact.

Loss window: a SIGKILL loses at most the changes of the last `flush_s` plus the batch being written
(and, with Redis, whatever Redis itself does not persist). A graceful stop writes a last batch.

With leader election (`epoch` set) every write is conditional on the leadership epoch (StoreFenced when
another replica took over: the writer stops and `on_fenced` ends its term), and `commit()` is a group
commit: it wakes the writer at once and returns when a batch holding every change made before the call
is in the store. The servicer awaits it before answering Admit, Complete and Release, so an answer the
router got is never lost to a failover: the loss window is then the RPCs not yet answered, which the
router retries on the new leader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

from services.common.clock import Clock
from services.common.outbound.retry import Backoff, RetryPolicy
from services.scheduler.adapters.state_store import (
    StateStore,
    StoreBusy,
    StoreError,
    StoreFenced,
    StoreLost,
    WriteBatch,
    decode_state,
    encode_meta,
    encode_program,
    encode_ticket,
)
from services.scheduler.core import SchedulerCore, durable
from services.scheduler.core.state import CoreState
from services.scheduler.metrics import SchedulerMetrics

log = logging.getLogger("services.scheduler.state")

LOAD_RETRY = RetryPolicy(first_delay_s=0.2, max_delay_s=2.0)
"""A state store that does not answer at start: tried again after 0.2 s, doubling to 2 s, until the load bound."""


@dataclass(frozen=True)
class Recovery:
    programs: int
    paused: int
    tickets: int
    skipped: int
    load_s: float
    rebuild_s: float

    @property
    def seconds(self) -> float:
        return self.load_s + self.rebuild_s


async def wait_bounded(task: asyncio.Future, timeout_s: float) -> bool:
    """Wait for `task` at most `timeout_s` (never longer, even if it ignores a cancellation: it is not
    cancelled here). True if it finished; its exception, if any, is logged and swallowed."""
    done, _ = await asyncio.wait((task,), timeout=max(0.001, timeout_s))
    if not done:
        return False
    if not task.cancelled() and task.exception() is not None:
        log.error(
            "scheduler stop: %s failed",
            task.get_name() if isinstance(task, asyncio.Task) else task,
            exc_info=task.exception(),
        )
    return True


class StatePersister:
    def __init__(
        self,
        core: SchedulerCore,
        store: StateStore,
        clock: Clock,
        metrics: SchedulerMetrics,
        *,
        flush_s: float,
        write_timeout_s: float,
        epoch: int | None = None,
        on_fenced: Callable[[], None] | None = None,
    ) -> None:
        self.core = core
        self.store = store
        self.clock = clock
        self.metrics = metrics
        self.flush_s = flush_s
        self.write_timeout_s = write_timeout_s
        self.recovery: Recovery | None = None
        self._needs_full = True  # the first batch after recovery makes the store exactly the table
        self._failing_since: float | None = None
        self._task: asyncio.Task | None = None
        self.epoch = epoch
        """The leadership epoch every write is conditional on (None: a single scheduler, unconditional)."""
        self.on_fenced = on_fenced
        self.fenced = False
        """A write was refused for a stale epoch: nothing more is written."""
        self.busy = False
        """The last failure was a write lock held elsewhere (StoreBusy): the store itself is up."""
        self._kick = asyncio.Event()
        self._waiters: list[asyncio.Future[bool]] = []
        self._stopping = False

    def _wall_offset(self) -> float:
        return self.clock.wall() - self.clock.monotonic()

    # ------------------------------------------------------------------ recovery

    async def recover(self, load_timeout_s: float, retained: CoreState | None = None) -> Recovery:
        """Load the stored table and rebuild the core from it (before anything is served). Retries a
        store that does not answer until `load_timeout_s`; raises StoreError past it. `retained`: this
        process's own table from an earlier term, rebuilt instead if the store holds no table at all (it
        lost its data while this replica could not write); the first batch writes it back whole."""
        started = time.perf_counter()
        deadline = time.monotonic() + load_timeout_s
        backoff = Backoff(LOAD_RETRY)
        while True:
            try:
                async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                    stored = await self.store.load()
                break
            except (StoreError, TimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"cannot load the scheduler state from {self.store.description} within "
                        f"{load_timeout_s:g}s: {exc or 'timed out'}"
                    ) from None
                log.warning("scheduler state: %s not readable yet (%s); retrying", self.store.description, exc)
                await asyncio.sleep(backoff.failed(remaining_s=deadline - time.monotonic()))
        loaded = time.perf_counter()
        decoded = decode_state(stored, self._wall_offset())
        state = decoded.state
        if retained is not None and stored.meta is None and not stored.programs and not stored.tickets:
            log.warning(
                "scheduler state: %s holds no table (it lost its data); rebuilding from this replica's own "
                "table (%d programs) and writing it back",
                self.store.description,
                len(retained.programs),
            )
            self.metrics.state_tables_written_back.inc()
            state = retained
            self._kick.set()  # the writer's first pass writes it back at once, not a flush interval later
        effects = durable.restore(self.core, self.clock.monotonic(), state)
        self.core.ledger.track_changes()
        done = time.perf_counter()
        stats = self.core.stats(self.clock.monotonic())
        self.recovery = Recovery(
            len(decoded.state.programs),
            stats.programs_paused,
            stats.tickets_in_flight,
            decoded.skipped,
            loaded - started,
            done - loaded,
        )
        self.metrics.state_recovery_seconds.set(self.recovery.seconds)
        self.metrics.state_recovered_programs.set(self.recovery.programs)
        for record in effects.logs:
            logging.getLogger("services.scheduler.control").log(record.level, "%s", record.message)
        if decoded.skipped:
            log.warning(
                "scheduler state: %d unreadable records in %s were skipped", decoded.skipped, self.store.description
            )
        log.info(
            "scheduler state: recovered %d programs (%d paused, %d turns in flight) from %s in %.3fs "
            "(load %.3fs, rebuild %.3fs)",
            self.recovery.programs,
            self.recovery.paused,
            self.recovery.tickets,
            self.store.description,
            self.recovery.seconds,
            self.recovery.load_s,
            self.recovery.rebuild_s,
        )
        return self.recovery

    # ------------------------------------------------------------------ writing

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="scheduler-state-writer")

    async def stop(self, *, final_flush: bool = True, close_store: bool = True) -> None:
        """Stop the loop, write a last batch (bounded), close the store. A deposed leader writes nothing
        more (`final_flush=False`) and leaves the store open for the next term (`close_store=False`).

        Every wait is bounded: the writer is told to stop (it checks `_stopping` at each pass, so a
        cancellation lost inside a store client cannot keep it writing forever) and cancelled, and is
        waited for at most a write's timeout; past it a WARNING names it and the stop goes on."""
        self._stopping = True
        self._kick.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            if not await wait_bounded(task, self.write_timeout_s):
                log.warning(
                    "scheduler state: the writer did not stop within %gs of its cancellation; going on without it",
                    self.write_timeout_s,
                )
        self._settle(False)
        try:
            if final_flush and not self.fenced:
                last = asyncio.ensure_future(self.flush())
                if not await wait_bounded(last, 3 * self.write_timeout_s):
                    last.cancel()
                    log.warning(
                        "scheduler state: the last batch was not written within %gs; going on",
                        3 * self.write_timeout_s,
                    )
        finally:
            if close_store:
                await self._close_store()

    async def _close_store(self) -> None:
        try:
            async with asyncio.timeout(self.write_timeout_s):  # a hung store must not hang the stop
                await self.store.close()
        except TimeoutError:
            log.warning("scheduler state: %s did not close within %gs", self.store.description, self.write_timeout_s)

    async def commit(self) -> bool:
        """Wait until every change made before this call is in the store (group commit). False if the
        store failed or refused the write (then `fenced` tells which), or the writer is stopping."""
        if self.fenced or self._stopping:
            return False
        if self._failing_since is not None:
            # The store is failing (down, or its write lock held by a frozen replica): the caller is not held
            # up (it refuses the call at once); the writer keeps trying and rewrites everything when it can.
            self._kick.set()
            return False
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self._kick.set()
        return await future

    def _settle(self, ok: bool) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(ok)

    async def _loop(self) -> None:
        # Ends on `_stopping`, not only by its cancellation: on Python 3.11 a stop's cancel that lands as the
        # flush interval's timeout fires is swallowed by `asyncio.timeout` (seen as TimeoutError), and this
        # loop then went on writing for ever while `stop` waited for it (chaos.md, defect 5).
        while not self.fenced and not self._stopping:
            try:
                async with asyncio.timeout(self.flush_s):
                    await self._kick.wait()
            except TimeoutError:
                pass
            if self._stopping:
                return  # `stop` settles the waiters and writes the last batch itself
            self._kick.clear()
            waiters, self._waiters = self._waiters, []
            ok = False
            try:
                ok = await self.flush()
            except Exception:  # never let a bug stop the writer; the next batch rewrites everything
                self._needs_full = True
                log.exception("scheduler state: writer failed; the whole table is rewritten next")
            finally:
                for future in waiters:
                    if not future.done():
                        future.set_result(ok)

    @property
    def healthy(self) -> bool:
        return self._failing_since is None

    async def flush(self) -> bool:
        """Write one batch: the changes since the last one, or the whole table when the store may be
        stale. False if the store failed (or was not reachable for a full rewrite)."""
        if self.fenced:
            return False
        if self._needs_full:
            # The full rewrite will export everything: what changed meanwhile need not be remembered
            # (a long outage with many programs coming and going must not grow the change sets).
            self.core.ledger.take_changes()
            try:
                async with asyncio.timeout(self.write_timeout_s):
                    await self.store.ping()
            except (StoreError, TimeoutError, OSError) as exc:
                self._failed(exc)
                return False
            batch = self._full_batch()
        else:
            delta = self._delta_batch()
            if delta is None:
                return True
            batch = delta
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.write_timeout_s):
                if self.epoch is None:
                    await self.store.write(batch)
                else:
                    await self.store.write(batch, self.epoch)
        except StoreFenced as exc:
            self.fenced = True
            log.warning("scheduler state: %s; this replica writes nothing more", exc)
            if self.on_fenced is not None:
                self.on_fenced()
            return False
        except StoreLost as exc:
            log.warning("scheduler state: %s; writing the whole table again", exc)
            self._needs_full = True
            return await self.flush()
        except (StoreError, TimeoutError, OSError) as exc:
            self._needs_full = True  # this batch's changes are lost to the store: rewrite everything
            self.busy = isinstance(exc, StoreBusy)
            self._failed(exc)
            return False
        self.busy = False
        self.metrics.state_write_seconds.observe(time.perf_counter() - started)
        self.metrics.state_writes.labels("full" if batch.full else "delta").inc()
        if batch.full:
            self._needs_full = False
        if self._failing_since is not None:
            log.info(
                "scheduler state: %s writable again after %.1fs; table rewritten (%d programs)",
                self.store.description,
                time.monotonic() - self._failing_since,
                len(batch.programs),
            )
            self._failing_since = None
        self.metrics.state_store_up.set(1)
        return True

    def _failed(self, exc: BaseException) -> None:
        self.metrics.state_write_failures.inc()
        self.metrics.state_store_up.set(0)
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.warning(
                "scheduler state: cannot write to %s (%s); serving on, the table is rewritten when it answers again",
                self.store.description,
                str(exc) or type(exc).__name__,  # a timeout's message is empty: name it
            )

    def _full_batch(self) -> WriteBatch:
        offset = self._wall_offset()
        state = durable.export_state(self.core)  # also the new baseline of change tracking
        return WriteBatch(
            programs={r.session_id: encode_program(r, offset) for r in state.programs},
            tickets={r.request_id: encode_ticket(r, offset) for r in state.tickets},
            meta=encode_meta(state.meta),
            full=True,
        )

    def _delta_batch(self) -> WriteBatch | None:
        changes = self.core.ledger.take_changes()
        if not changes:
            return None
        offset = self._wall_offset()
        programs: dict[str, bytes | None] = {}
        for sid in changes.programs:
            record = durable.export_program(self.core.ledger, sid)
            programs[sid] = None if record is None else encode_program(record, offset)
        tickets: dict[str, bytes | None] = {}
        for rid in changes.tickets:
            ticket = durable.export_ticket(self.core.ledger, rid)
            tickets[rid] = None if ticket is None else encode_ticket(ticket, offset)
        return WriteBatch(programs, tickets, encode_meta(durable.export_meta(self.core)))
