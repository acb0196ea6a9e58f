"""Capacity follower: keeps a `WatchWorkers` stream open and feeds each snapshot to the scheduler.

Each snapshot (HEALTHY workers' replicas) replaces the core's capacity view at once, so a worker
that disappears loses its programs' placement on the spot. On any stream error the follower
reconnects with exponential backoff and jitter; it logs WARN once per outage and INFO on recovery.
A stream that stays silent past `idle_timeout_s` (the capacity service heartbeats every 10 s by
default) is treated as dead: that is the deadline of this otherwise endless call.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, Callable

import grpc

from bandmaster.capacity.v1 import capacity_pb2 as cap_pb
from services.scheduler.adapters.proto import capacity_from_proto
from services.scheduler.core import CapacitySnapshot
from services.scheduler.metrics import SchedulerMetrics

log = logging.getLogger("services.scheduler.capacity")


class CapacityFollower:
    def __init__(self, stub: Any, apply: Callable[[CapacitySnapshot], None], metrics: SchedulerMetrics, *,
                 address: str = "", initial_backoff_s: float = 0.2, max_backoff_s: float = 5.0,
                 idle_timeout_s: float = 60.0) -> None:
        self.stub = stub
        self.apply = apply
        self.metrics = metrics
        self.address = address
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.idle_timeout_s = idle_timeout_s
        self.version = 0
        self.connected = False
        self.failures = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="scheduler-capacity-follower")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def run(self) -> None:
        backoff_s = self.initial_backoff_s
        in_outage = False
        while True:
            try:
                async for _ in self._follow_once():
                    if in_outage:
                        log.info("capacity stream to %s recovered (snapshot version %d)", self.address, self.version)
                        in_outage = False
                    backoff_s = self.initial_backoff_s
                reason = "stream ended"
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            except TimeoutError:
                reason = f"no snapshot or heartbeat for {self.idle_timeout_s:g}s"
            except Exception as exc:  # a broken snapshot must not end the follower
                log.exception("capacity follower error")
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                self._set_connected(False)
            self.failures += 1
            self.metrics.capacity_reconnects.inc()
            if not in_outage:
                log.warning("capacity stream to %s lost (%s); keeping the last snapshot (version %d) and "
                            "reconnecting with backoff", self.address, reason, self.version)
                in_outage = True
            else:
                log.debug("capacity stream still down: %s", reason)
            await asyncio.sleep(backoff_s * random.uniform(0.5, 1.0))
            backoff_s = min(self.max_backoff_s, backoff_s * 2)

    async def _follow_once(self):
        """Yield once per message received; apply each real (non-heartbeat) change."""
        call = self.stub.WatchWorkers(cap_pb.WatchWorkersRequest(known_version=0))
        try:
            iterator = call.__aiter__()
            while True:
                try:
                    snapshot = await asyncio.wait_for(iterator.__anext__(), timeout=self.idle_timeout_s)
                except StopAsyncIteration:
                    return
                self._set_connected(True)
                if not (snapshot.heartbeat and snapshot.version == self.version):
                    self.apply(capacity_from_proto(snapshot))
                    self.version = snapshot.version
                yield snapshot
        finally:
            call.cancel()

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self.metrics.capacity_connected.set(1 if connected else 0)
