"""Health, both ways.

`FleetHealth`: the router's `grpc.health.v1` follows its fleet, as `/health` does: SERVING while it has at
least one healthy worker, NOT_SERVING while it has none (docs/protocols/router.md, Health). The scheduler
being unreachable does not change it (the router fails open).

`WorkerProbes`: is a worker alive *now*? Asked by a turn past its answer deadline (turns.py): one probe
per worker at a time, whatever the number of turns asking, and an answer younger than `fresh_s` is reused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Iterable, Mapping

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


class WorkerProbes:
    """`await probes.alive(worker_id, url)`: True when the worker answered its health probe (`probe(url)`)."""

    def __init__(
        self,
        probe: Callable[[str], Awaitable[bool]],
        *,
        fresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe
        self._fresh_s = fresh_s
        self._clock = clock
        self._inflight: dict[str, asyncio.Future[bool]] = {}
        self._last: dict[str, tuple[float, bool]] = {}

    async def alive(self, worker_id: str, url: str) -> bool:
        last = self._last.get(worker_id)
        if last is not None and self._clock() - last[0] < self._fresh_s:
            return last[1]
        pending = self._inflight.get(worker_id)
        if pending is None:
            pending = self._inflight[worker_id] = asyncio.ensure_future(self._run(worker_id, url))
        # shield: one asker leaving (its turn cancelled) must not cancel the probe the others wait on
        return await asyncio.shield(pending)

    async def _run(self, worker_id: str, url: str) -> bool:
        try:
            answer = await self._probe(url)
        except Exception:  # a probe that could not even be made says the same as no answer
            log.debug("health probe of %s failed", worker_id, exc_info=True)
            answer = False
        finally:
            self._inflight.pop(worker_id, None)
        self._last[worker_id] = (self._clock(), answer)
        if not answer:
            log.debug("worker %s did not answer its health probe", worker_id)
        return answer

    def forget(self, live: Iterable[str]) -> None:
        keep = set(live)
        for worker_id in [w for w in self._last if w not in keep]:
            del self._last[worker_id]
