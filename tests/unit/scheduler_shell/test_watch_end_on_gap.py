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


async def test_excluded_kinds_are_never_queued_so_they_neither_arrive_nor_make_a_gap(make_harness):
    """A router's fast path leaves out ADMITTED (one per admission, which it ignores): those are not sent,
    not queued (a burst of them cannot overflow its queue into a gap), and every other kind still comes."""
    h = await make_harness()
    h.runtime.watch_queue = 4
    await h.set_capacity({W: 100_000})
    stream = h.client.WatchEvents(pb.WatchEventsRequest(end_on_gap=True, exclude_kinds=[pb.EVENT_KIND_ADMITTED]))
    await asyncio.wait_for(stream.initial_metadata(), 5)
    unread = h.runtime.subscribe()  # a watcher of every kind that reads nothing
    for i in range(10):  # ten admissions: more than the queue holds
        await h.admit(f"p{i}", f"r{i}", 1, timeout=5)
    assert (await h.client.Release(pb.ReleaseRequest(session_id="p0"))).released
    event = await asyncio.wait_for(stream.read(), 5)
    assert event.kind == pb.EVENT_KIND_RELEASED and event.session_id == "p0"  # no gap: the stream goes on
    assert unread.dropped > 0  # the same burst overflowed a queue that took every kind
    h.runtime.unsubscribe(unread)
    stream.cancel()


async def test_an_unknown_kind_to_exclude_excludes_nothing(make_harness):
    """A kind this scheduler does not know (a newer router's) names nothing it sends."""
    h = await make_harness()
    await h.set_capacity({W: 100_000})
    stream = h.client.WatchEvents(pb.WatchEventsRequest(exclude_kinds=[pb.EVENT_KIND_UNSPECIFIED, 99]))
    await asyncio.wait_for(stream.initial_metadata(), 5)
    await h.admit("p", "r1", 1, timeout=5)
    event = await asyncio.wait_for(stream.read(), 5)
    assert event.kind == pb.EVENT_KIND_ADMITTED and event.session_id == "p"
    stream.cancel()
