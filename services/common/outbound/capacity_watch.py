"""The one follower of the capacity service's server streams: `StreamWatch` follows one endless stream, and
`CapacityWatch` is it on `WatchWorkers` (the scheduler's and the routers' worker view); the routers' replica
sync follows `WatchRouterLoads` with it too.

Each message goes to the caller's `on_message` (for `CapacityWatch`: each real snapshot, recomputed from
fresh, not deltas; a heartbeat that repeats the version already taken is skipped). The stream is given up
and reopened, with exponential backoff and jitter, when it fails, ends, stays silent past `idle_timeout_s`
(the capacity service heartbeats every 10 s by default: that is the deadline of this otherwise endless
call), or when `on_message` raises; the reopened stream starts with the latest state, so nothing is lost.
Meanwhile what was last taken stays in force: the caller keeps running through a control-plane outage.
WARN once per outage, INFO on recovery, on the caller's logger. A task that ends any other way is logged
at ERROR by its done-callback: the view is frozen from then on.
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


class StreamWatch:
    """Follow the server stream `open_call()` opens, for good (see the module docstring). `what` names it in
    the log ("capacity stream"); `kept` says what stays in force meanwhile."""

    def __init__(
        self,
        open_call: Callable[[], Any],
        on_message: Callable[[Any], None],
        *,
        address: str,
        logger: logging.Logger,
        what: str,
        kept: Callable[[], str] = lambda: "the last state",
        on_connected: Callable[[bool], None] = _ignore,
        on_failure: Callable[[], None] = _ignore,
        initial_backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        idle_timeout_s: float = 60.0,
        name: str = "stream-watch",
    ) -> None:
        self.open_call = open_call
        self.on_message = on_message
        self.what = what
        self.kept = kept
        self.address = address
        self.log = logger
        self.on_connected = on_connected
        self.on_failure = on_failure
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.idle_timeout_s = idle_timeout_s
        self.name = name
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
                self.log.error(
                    "%s watch of %s did not stop within %.1f s; left behind", self.what, self.address, timeout_s
                )
                return
            task.cancel()
            await asyncio.wait({task}, timeout=min(1.0, left))

    def _ended(self, task: asyncio.Task) -> None:
        if task.cancelled() or self._stopping:
            return
        self._set_connected(False)
        self.log.error(
            "%s watch of %s stopped (%r); %s stays in force until a restart",
            self.what,
            self.address,
            task.exception(),
            self.kept(),
        )

    async def run(self) -> None:
        # Read at each start: tests shorten the waits on a built watch. The cap bounds every wait.
        backoff = Backoff(RetryPolicy(min(self.initial_backoff_s, self.max_backoff_s), self.max_backoff_s, jitter=0.5))
        in_outage = False
        while not self._stopping:
            try:
                async for _ in self._follow_once():
                    if in_outage:
                        self.log.info("%s to %s recovered (%s)", self.what, self.address, self.kept())
                        in_outage = False
                    backoff.reset()
                reason = "stream ended"
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            except TimeoutError:
                reason = f"no message or heartbeat for {self.idle_timeout_s:g}s"
            except Exception as exc:  # a message the caller could not take must not end the watch
                self.log.exception("%s from %s: a message not applied", self.what, self.address)
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                self._set_connected(False)
            if self._stopping:
                return
            self.failures += 1
            self.on_failure()
            if not in_outage:
                self.log.warning(
                    "%s to %s lost (%s); keeping %s and reconnecting with backoff",
                    self.what,
                    self.address,
                    reason,
                    self.kept(),
                )
                in_outage = True
            else:
                self.log.debug("%s still down: %s", self.what, reason)
            await asyncio.sleep(backoff.failed())

    async def _follow_once(self):
        """Yield once per message received, each handed to `on_message` first."""
        call = self.open_call()
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
                self.on_message(snapshot)
                yield snapshot
        finally:
            call.cancel()

    def _set_connected(self, connected: bool) -> None:
        self.connected = connected
        self.on_connected(connected)


class CapacityWatch(StreamWatch):
    """`WatchWorkers`: each real snapshot to `on_snapshot`; a heartbeat repeating the version taken is skipped."""

    def __init__(
        self,
        stub: Any,
        on_snapshot: Callable[[cap_pb.WorkersSnapshot], None],
        *,
        name: str = "capacity-watch",
        **options: Any,
    ) -> None:
        super().__init__(
            lambda: stub.WatchWorkers(cap_pb.WatchWorkersRequest(known_version=0)),
            self._take,
            what="capacity stream",
            kept=lambda: f"the last snapshot (version {self.version})",
            name=name,
            **options,
        )
        self.stub = stub
        self.on_snapshot = on_snapshot
        self.version = 0

    def _take(self, snapshot: cap_pb.WorkersSnapshot) -> None:
        if not (snapshot.heartbeat and snapshot.version == self.version):
            self.on_snapshot(snapshot)
            self.version = snapshot.version
