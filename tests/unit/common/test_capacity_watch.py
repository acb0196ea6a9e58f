"""The one capacity watch client (services/common/outbound/capacity_watch.py): stop() always ends the watch.

Found in the suite: a router fixture's teardown blocked for good in `watch.stop()` about one run in
five. The stream's read failed (the capacity address refuses connections) in the same loop iteration
as stop() cancelled the task; on Python 3.11 `asyncio.wait_for` then returned the read's error instead
of the cancellation, the watch took it for an outage and went back to its backoff sleep, and stop()
waited on a task that no longer knew it was stopped.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from services.common.outbound.capacity_watch import CapacityWatch

pytestmark = pytest.mark.timeout(30)


class _Unavailable(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "refused")


class _EventStream:
    """A WatchWorkers call whose reads wait on `event` (subclasses say what a read does)."""

    def __init__(self, event: asyncio.Event) -> None:
        self._event = event

    def __aiter__(self):
        return self

    def cancel(self) -> bool:
        return True


class _FailingStream(_EventStream):
    """The next read fails as soon as the event is set."""

    async def __anext__(self):
        await self._event.wait()
        raise _Unavailable()


class _Stub:
    def __init__(self) -> None:
        self.fail = asyncio.Event()
        self.calls = 0

    def WatchWorkers(self, request):  # noqa: N802 (the gRPC method's name)
        self.calls += 1
        return _FailingStream(self.fail)


def _watch(stub: _Stub) -> CapacityWatch:
    return CapacityWatch(
        stub,
        lambda snapshot: None,
        address="127.0.0.1:1",
        logger=logging.getLogger("test.capacity_watch"),
        initial_backoff_s=30.0,
        max_backoff_s=60.0,
        idle_timeout_s=60.0,
    )


async def test_stop_ends_the_watch_when_the_read_fails_as_it_is_cancelled():
    stub = _Stub()
    watch = _watch(stub)
    watch.start()
    await asyncio.sleep(0.05)  # the watch is reading its stream
    stub.fail.set()  # the read fails in the same loop iteration as the cancellation below
    await asyncio.wait_for(watch.stop(), timeout=5)
    assert stub.calls == 1


async def test_stop_during_the_backoff_sleep_ends_the_watch():
    stub = _Stub()
    stub.fail.set()
    watch = _watch(stub)
    watch.start()
    await asyncio.sleep(0.05)  # the first read failed: the watch sleeps its 15-30 s backoff
    assert watch.failures == 1
    await asyncio.wait_for(watch.stop(), timeout=5)


class _DeafStream(_EventStream):
    """A read that swallows every cancellation until the event is set (a hung dependency)."""

    async def __anext__(self):
        while not self._event.is_set():
            try:
                await self._event.wait()
            except asyncio.CancelledError:
                pass
        raise StopAsyncIteration


async def test_stop_is_bounded_when_the_read_ignores_cancellation(caplog):
    release = asyncio.Event()
    stub = _Stub()
    stub.WatchWorkers = lambda request: _DeafStream(release)  # type: ignore[method-assign]
    watch = _watch(stub)
    watch.start()
    await asyncio.sleep(0.05)
    task = watch._task
    try:
        await asyncio.wait_for(watch.stop(timeout_s=0.5), timeout=5)
        assert "did not stop within" in caplog.text
    finally:
        release.set()
        await asyncio.wait({task}, timeout=5)
