"""The one client of the capacity service's `WatchWorkers` stream (the scheduler's and the routers').

Each real snapshot goes to the service's `on_snapshot` (recompute from a fresh snapshot, not deltas);
a heartbeat that repeats the version already taken is skipped. The stream is given up and reopened,
with exponential backoff and jitter, when it fails, ends, stays silent past `idle_timeout_s` (the
capacity service heartbeats every 10 s by default: that is the deadline of this otherwise endless
call), or when `on_snapshot` raises; the reopened stream starts with the latest snapshot, so nothing
is lost. Meanwhile the last snapshot taken stays in force: the caller keeps running through a
control-plane outage. WARN once per outage, INFO on recovery, on the caller's logger. A task that
ends any other way is logged at ERROR by its done-callback: the view is frozen from then on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import grpc

from bandmaster.capacity.v1 import capacity_pb2 as cap_pb
from services.common.outbound.retry import Backoff, RetryPolicy


def _ignore(*_: Any) -> None:
    pass


class CapacityWatch:
    def __init__(
        self,
        stub: Any,
        on_snapshot: Callable[[cap_pb.WorkersSnapshot], None],
        *,
        address: str,
        logger: logging.Logger,
        on_connected: Callable[[bool], None] = _ignore,
        on_failure: Callable[[], None] = _ignore,
        initial_backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        idle_timeout_s: float = 60.0,
        name: str = "capacity-watch",
    ) -> None:
        self.stub = stub
        self.on_snapshot = on_snapshot
        self.address = address
        self.log = logger
        self.on_connected = on_connected
        self.on_failure = on_failure
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.idle_timeout_s = idle_timeout_s
        self.name = name
        self.version = 0
        self.connected = False
        self.failures = 0
        self._stopping = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=self.name)
        self._task.add_done_callback(self._ended)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """End the watch. The flag, not the cancellation alone, is what ends it: a cancellation that lands
        as the stream's read fails can reach the task as that failure instead. Bounded: a task still
        running after `timeout_s` (a read that swallows cancellation) is left behind, logged, so that a
        hung dependency cannot hang the service's shutdown."""
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not task.done():
            left = deadline - loop.time()
            if left <= 0:
                self.log.error("capacity watch of %s did not stop within %.1f s; left behind", self.address, timeout_s)
                return
            task.cancel()
            await asyncio.wait({task}, timeout=min(1.0, left))

    def _ended(self, task: asyncio.Task) -> None:
        if task.cancelled() or self._stopping:
            return
        self._set_connected(False)
        self.log.error(
            "capacity watch of %s stopped (%r); the last snapshot (version %d) stays in force until a restart",
            self.address,
            task.exception(),
            self.version,
        )

    async def run(self) -> None:
        # Read at each start: tests shorten the waits on a built watch. The cap bounds every wait.
        backoff = Backoff(RetryPolicy(min(self.initial_backoff_s, self.max_backoff_s), self.max_backoff_s, jitter=0.5))
        in_outage = False
        while not self._stopping:
            try:
                async for _ in self._follow_once():
                    if in_outage:
                        self.log.info(
                            "capacity stream to %s recovered (snapshot version %d)", self.address, self.version
                        )
                        in_outage = False
                    backoff.reset()
                reason = "stream ended"
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            except TimeoutError:
                reason = f"no snapshot or heartbeat for {self.idle_timeout_s:g}s"
            except Exception as exc:  # a snapshot the caller could not take must not end the watch
                self.log.exception("capacity snapshot from %s not applied", self.address)
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                self._set_connected(False)
            if self._stopping:
                return
            self.failures += 1
            self.on_failure()
            if not in_outage:
                self.log.warning(
                    "capacity stream to %s lost (%s); keeping the last snapshot (version %d) and "
                    "reconnecting with backoff",
                    self.address,
                    reason,
                    self.version,
                )
                in_outage = True
            else:
                self.log.debug("capacity stream still down: %s", reason)
            await asyncio.sleep(backoff.failed())

    async def _follow_once(self):
        """Yield once per message received; hand each real (non-heartbeat) change to `on_snapshot`."""
        call = self.stub.WatchWorkers(cap_pb.WatchWorkersRequest(known_version=0))
        try:
            iterator = call.__aiter__()
            while True:
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can return the read's own outcome in
                    # place of a cancellation that lands in the same iteration.
                    async with asyncio.timeout(self.idle_timeout_s):
                        snapshot = await iterator.__anext__()
                except StopAsyncIteration:
                    return
                self._set_connected(True)
                if not (snapshot.heartbeat and snapshot.version == self.version):
                    self.on_snapshot(snapshot)
                    self.version = snapshot.version
                yield snapshot
        finally:
            call.cancel()

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self.on_connected(connected)
