"""The cleanup loop: deletes stored files whose `expires_at` has passed.

Every `interval_s` one pass deletes at most `max_files` expired files (oldest expiry first): an input file
with its lines, a batch's output or error file with its result lines. An input file a batch that has not
ended still uses is skipped until that batch ends. The batch objects themselves stay listed, as OpenAI's
do (their `output_file_id` then answers 404, as an expired OpenAI file does). The work of one pass is
bounded so a backlog (a restart after a long stop) drains over several passes without stalling the
event loop the Batch API and the dispatcher share. Each removal is counted in
`bandmaster_batch_files_deleted{kind,reason="expired"}` and `bandmaster_batch_file_bytes_deleted`.
"""

from __future__ import annotations

import asyncio
import logging

from services.batch.adapters.registry import FileInUse, NotFound, Registry
from services.common.clock import Clock

log = logging.getLogger("services.batch.cleanup")


class Cleanup:
    def __init__(self, registry: Registry, clock: Clock, *, interval_s: float, max_files: int, metrics=None) -> None:
        self.registry = registry
        self.clock = clock
        self.interval_s = interval_s
        self.max_files = max_files
        self.metrics = metrics
        self.removed_total = 0
        self._task: asyncio.Task | None = None

    def run_once(self) -> list[dict]:
        """One bounded pass; returns what it deleted ({id, kind, bytes} each)."""
        removed = []
        for file_id in self.registry.expired_files(int(self.clock.wall()), self.max_files):
            try:
                deleted = self.registry.delete_file(file_id)
            except (NotFound, FileInUse):
                continue  # deleted by a client meanwhile, or its batch was re-checked as running
            removed.append(deleted)
            if self.metrics is not None:
                self.metrics.record_deleted(deleted, "expired")
        if removed:
            self.removed_total += len(removed)
            log.info(
                "cleanup: %d expired files deleted (%d bytes)%s",
                len(removed),
                sum(d["bytes"] for d in removed),
                "; more next pass" if len(removed) == self.max_files else "",
            )
        return removed

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="batch-cleanup")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cleanup pass failed")
            await asyncio.sleep(self.interval_s)
