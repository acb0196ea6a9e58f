"""WatchEvents for a watcher that must see every change (a router's admission fast path): initial metadata
as soon as it is subscribed, and with `end_on_gap` the stream ends at the first dropped event."""

from __future__ import annotations

import asyncio

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from tests.support.eventually import assert_eventually

W = ("w1", 0)


async def test_subscribed_at_initial_metadata_and_ended_at_the_first_gap(make_harness):
    h = await make_harness()
    await h.set_capacity({W: 100_000})
    stream = h.client.WatchEvents(pb.WatchEventsRequest(end_on_gap=True))
    await asyncio.wait_for(stream.initial_metadata(), 5)  # subscribed, with no event yet
    assert h.runtime.metrics.watchers._value.get() == 1
    queue = next(iter(h.runtime._subscribers))
    queue.dropped += 1  # as a full queue does (EventQueue.put)
    await h.admit("p", "r1", 1, timeout=5)  # an event wakes the stream
    got = [e async for e in stream]  # ends, OK
    assert got == []
    await assert_eventually(lambda: h.runtime.metrics.watchers._value.get() == 0, timeout_s=5)
