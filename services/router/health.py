"""The router's `grpc.health.v1` follows its fleet, as `/health` does: SERVING while it has at least one
healthy worker, NOT_SERVING while it has none (docs/protocols/router.md, Health). The scheduler being
unreachable does not change it (the router fails open)."""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable, Mapping

from grpc_health.v1 import health_pb2

log = logging.getLogger(__name__)


class FleetHealth:
    """Sets the health status of `services` (the overall "" among them) on `servicer` from each fleet
    update; only transitions are written, each by a task that writes the state current when it runs, so
    updates that arrive faster than they are written still end on the last one."""

    def __init__(self, servicer, services: Iterable[str]) -> None:
        self._servicer = servicer
        self._services = tuple(services)
        self._serving: bool | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def serving(self) -> bool:
        return bool(self._serving)

    async def apply(self, serving: bool) -> None:
        """Set the status now (at start, before the fleet is known)."""
        self._serving = serving
        await self._write()

    def on_workers(self, workers: Mapping) -> None:
        serving = bool(workers)
        if serving == self._serving:
            return
        self._serving = serving
        log.info("gRPC health -> %s (%d healthy workers)", "SERVING" if serving else "NOT_SERVING", len(workers))
        task = asyncio.get_running_loop().create_task(self._write(), name="router-health")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if self._serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in self._services:
            await self._servicer.set(service, status)  # ignored once the host is shutting down
