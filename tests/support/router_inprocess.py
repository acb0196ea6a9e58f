"""An in-process router for HTTP-edge and servicer tests: `start_router` on 127.0.0.1:0 with in-process
fake workers (`FaultyWorker`) put straight into its fleet and, optionally, a `RecordingScheduler`.

    r = await InProcessRouter.start(["ok", "refuse"], http_max_connections=8)
    r.url, r.workers[0].mode = "hang", r.sample("bandmaster_router_retries_total")
    await r.close()

The capacity address points at a closed port: the watch retries in the background and never
replaces the fleet set here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.common.observe.telemetry import setup_telemetry
from services.router.config import RouterConfig
from services.router.core.types import Replica, WorkerView
from services.router.server import RunningRouter, start_router
from tests.support.router_doubles import MODEL, FaultyWorker, RecordingScheduler
from tests.support.router_stack import free_port


@dataclass
class InProcessRouter:
    running: RunningRouter
    workers: list[FaultyWorker]
    sched: RecordingScheduler | None

    @classmethod
    async def start(
        cls,
        modes: list[str] | tuple[str, ...] = ("ok",),
        *,
        scheduler: bool = True,
        sched: RecordingScheduler | None = None,
        **config,
    ) -> "InProcessRouter":
        workers = [FaultyWorker(mode) for mode in modes]
        for worker in workers:
            await worker.start()
        address = ""
        if scheduler:
            sched = sched or RecordingScheduler()
            address = await sched.start()
        else:
            sched = None
        settings = dict(
            capacity_addr=f"127.0.0.1:{free_port()}",
            listen="127.0.0.1:0",
            http_port=0,
            metrics_port=-1,
            shutdown_grace_seconds=0.5,
            seed=0,
            capacity_retry_max_seconds=60,
        )
        if scheduler:
            settings["scheduler_addr"] = address
        else:
            settings["use_scheduler"] = False
        settings.update(config)
        running = await start_router(
            RouterConfig(**settings), telemetry=setup_telemetry("router-test", set_global=False)
        )
        router = cls(running, workers, sched)
        router.set_workers(range(len(workers)))
        return router

    def set_workers(self, indexes) -> None:
        """Route to these workers only (w0, w1, ... by index)."""
        views = {}
        for i in indexes:
            wid = f"w{i}"
            views[wid] = WorkerView(wid, self.workers[i].url, MODEL, 16, (Replica(wid, 0),))
        self.running.fleet.update(views)

    @property
    def url(self) -> str:
        return self.running.base_url

    @property
    def port(self) -> int:
        return self.running.http_port

    def sample(self, name: str, **labels: str) -> float:
        """One sample of the router's registry (0 when absent); `labels` may be a subset: their sum."""
        total = 0.0
        for metric in self.running.metrics.registry.collect():
            for s in metric.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    async def close(self) -> None:
        for worker in self.workers:
            worker.gate.set()
        await self.running.stop()
        for worker in self.workers:
            await worker.stop()
        if self.sched is not None:
            await self.sched.stop()


async def raw_exchange(port: int, data: bytes, *, read_timeout_s: float = 5.0) -> bytes:
    """Send raw bytes on a fresh connection; everything the server sends until it closes (or the timeout)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        chunks = []
        try:
            async with asyncio.timeout(read_timeout_s):
                while chunk := await reader.read(65536):
                    chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)
    finally:
        writer.close()
