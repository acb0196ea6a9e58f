"""The router's view of the workers: the capacity service's WatchWorkers stream.

Each snapshot replaces the view (recompute from a fresh snapshot, not deltas). Only HEALTHY workers
with replicas are routable. The stream is reopened with exponential back-off when it breaks; the last
view stays in force meanwhile (the data plane keeps running through a control-plane outage).
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Callable

import grpc

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from services.router.core.types import Replica
from services.router.metrics import RouterMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerView:
    worker_id: str
    url: str
    model_name: str
    page_size: int
    replicas: tuple[Replica, ...]


Listener = Callable[[dict[str, WorkerView]], None]


def view_from_snapshot(snapshot: pb.WorkersSnapshot) -> dict[str, WorkerView]:
    out: dict[str, WorkerView] = {}
    for w in snapshot.workers:
        if w.health != pb.WORKER_HEALTH_HEALTHY or not w.replicas:
            continue
        replicas = tuple(sorted(Replica(w.worker_id, r.dp_rank) for r in w.replicas))
        out[w.worker_id] = WorkerView(w.worker_id, w.url.rstrip("/"), w.card.model_name, w.card.page_size, replicas)
    return out


class CapacityWatch:
    def __init__(self, address: str, metrics: RouterMetrics, on_change: Listener, *, retry_max_s: float,
                 channel: grpc.aio.Channel | None = None) -> None:
        self.address = address
        self._metrics = metrics
        self._on_change = on_change
        self._retry_max_s = retry_max_s
        self._channel = channel or grpc.aio.insecure_channel(address)
        self._stub = pb_grpc.CapacityStub(self._channel)
        self._task: asyncio.Task | None = None
        self.version = 0
        self.workers: dict[str, WorkerView] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="router-capacity-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self._channel.close()

    async def _run(self) -> None:
        delay_s = 0.1
        lost_logged = False
        while True:
            stream = self._stub.WatchWorkers(pb.WatchWorkersRequest(known_version=0))
            try:
                async for snapshot in stream:
                    if lost_logged:
                        log.info("capacity watch %s re-established", self.address)
                        lost_logged = False
                    self._metrics.capacity_connected.set(1)
                    delay_s = 0.1
                    if snapshot.heartbeat and snapshot.version == self.version:
                        continue
                    self.version = snapshot.version
                    self._apply(view_from_snapshot(snapshot))
                failure = "stream ended"
            except grpc.aio.AioRpcError as exc:
                failure = f"{exc.code().name}: {exc.details()}"
            finally:
                stream.cancel()
            self._metrics.capacity_connected.set(0)
            if not lost_logged:
                log.warning("capacity watch %s lost (%s); keeping %d known workers, retrying", self.address,
                            failure, len(self.workers))
                lost_logged = True
            await asyncio.sleep(delay_s * (0.5 + random.random()))
            delay_s = min(delay_s * 2, self._retry_max_s)

    def _apply(self, view: dict[str, WorkerView]) -> None:
        if view != self.workers:
            added = sorted(view.keys() - self.workers.keys())
            gone = sorted(self.workers.keys() - view.keys())
            if added or gone:
                log.info("workers: %d healthy (+%s -%s)", len(view), ",".join(added) or "none",
                         ",".join(gone) or "none")
        self.workers = view
        self._metrics.workers.set(len(view))
        self._on_change(view)
