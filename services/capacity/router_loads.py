"""The shell around the router-load table: accepts reports, ages them out, fans the table out.

One event loop owns it (no locks). Every accepted report and every expiry builds one
`RouterLoadsSnapshot` and hands the same object to every watcher's one-slot mailbox (a slow watcher
only ever holds the newest table). Idle cost: nothing runs while no router reports (the flag is off).
"""

from __future__ import annotations

import asyncio
import logging

from bandmaster.capacity.v1 import capacity_pb2 as pb
from services.capacity.core.errors import InvalidArgument
from services.capacity.core.router_loads import RouterLoadTable
from services.capacity.loop import Mailbox
from services.capacity.metrics import CapacityMetrics
from services.common.clock import Clock

log = logging.getLogger("services.capacity")

MIN_TTL_MS = 10
MAX_TTL_MS = 60_000
MAX_ROUTER_ID_CHARS = 256


class RouterLoadHub:
    def __init__(self, clock: Clock, metrics: CapacityMetrics) -> None:
        self.clock = clock
        self.metrics = metrics
        self.table: RouterLoadTable[pb.RouterLoadReport] = RouterLoadTable()
        self._mailboxes: set[Mailbox[pb.RouterLoadsSnapshot]] = set()
        self._current = pb.RouterLoadsSnapshot(version=0)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._stopped = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._expire_loop(), name="capacity-router-loads")

    async def stop(self) -> None:
        self._stopped = True
        for mailbox in list(self._mailboxes):
            mailbox.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def report(self, report: pb.RouterLoadReport) -> bool:
        """Validate and keep one router's report; False for a late duplicate. Raises InvalidArgument."""
        if not report.router_id or len(report.router_id) > MAX_ROUTER_ID_CHARS:
            raise InvalidArgument(f"router_id is required, at most {MAX_ROUTER_ID_CHARS} characters")
        if not MIN_TTL_MS <= report.ttl_ms <= MAX_TTL_MS:
            raise InvalidArgument(f"ttl_ms must be in [{MIN_TTL_MS}, {MAX_TTL_MS}], got {report.ttl_ms}")
        known = len(self.table)
        accepted = self.table.report(
            report.router_id, report.sequence, report.ttl_ms / 1000.0, report, self.clock.monotonic()
        )
        if accepted:
            if len(self.table) != known:
                log.info("router load: %s reports (%d routers)", report.router_id, len(self.table))
            self._publish()
            self._wake.set()
        return accepted

    def sweep(self) -> list[str]:
        """Drop the routers whose report outlived its TTL (the expiry task calls this)."""
        gone = self.table.expire(self.clock.monotonic())
        if gone:
            log.info("router load: %s stopped reporting (%d routers)", ", ".join(gone), len(self.table))
            self._publish()
        return gone

    def current(self) -> pb.RouterLoadsSnapshot:
        return self._current

    def subscribe(self) -> Mailbox[pb.RouterLoadsSnapshot]:
        mailbox: Mailbox[pb.RouterLoadsSnapshot] = Mailbox()
        if self._stopped:
            mailbox.close()
        self._mailboxes.add(mailbox)
        self.metrics.router_load_watchers.set(len(self._mailboxes))
        return mailbox

    def unsubscribe(self, mailbox: Mailbox[pb.RouterLoadsSnapshot]) -> None:
        self._mailboxes.discard(mailbox)
        self.metrics.router_load_watchers.set(len(self._mailboxes))

    def _publish(self) -> None:
        self._current = pb.RouterLoadsSnapshot(version=self.table.version, routers=self.table.live())
        self.metrics.router_load_reporters.set(len(self.table))
        for mailbox in self._mailboxes:
            mailbox.put(self._current)

    async def _expire_loop(self) -> None:
        # Sleeps until the earliest report's expiry (or a new report); nothing runs while none is held.
        while True:
            self.sweep()
            due = self.table.next_expiry()
            self._wake.clear()
            if due is None:
                await self._wake.wait()
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(due - self.clock.monotonic(), 0.0) + 0.001)
            except TimeoutError:
                pass
