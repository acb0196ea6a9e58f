"""The router's WatchEvents watcher (the admission fast path's view of the scheduler), against the real
scheduler servicer: it asks to be spared the kinds its cache ignores, keeps the cache in step with every
other kind, and a leader change or outage (its restart) reopens the stream at once."""

from __future__ import annotations

import asyncio

import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.router.core.admission_cache import AdmissionCache, CachedAdmission
from services.scheduler.core import EventKind
from tests.support.eventually import assert_eventually
from tests.unit.scheduler_shell.support import router_client, start_harness

pytestmark = pytest.mark.timeout(30)
W = ("w1", 0)


@pytest.fixture
async def h():
    harness = await start_harness()
    await harness.set_capacity({W: 100_000})
    yield harness
    await harness.channel.close()
    await harness.running.stop()


@pytest.fixture
async def watching(h):
    client = router_client(h.running.address)
    cache = AdmissionCache()
    ended: list[str] = []
    client.on_program_ended = ended.append
    client.start_watching(cache)
    await assert_eventually(lambda: len(h.runtime._subscribers) == 1 and cache.live, timeout_s=5)
    yield client, cache, ended
    await client.close()


async def test_the_watcher_is_spared_admitted_events_and_sees_the_others(h, watching):
    client, cache, ended = watching
    (queue,) = h.runtime._subscribers
    assert queue.excluded == frozenset({EventKind.ADMITTED})
    await h.admit("p", "r1", 10, timeout=5)
    assert not queue.events  # its admission's event was never queued for this router
    assert (await h.client.Release(pb.ReleaseRequest(session_id="p"))).released
    await assert_eventually(lambda: ended == ["p"], timeout_s=5)


async def test_a_restart_reopens_the_stream_and_the_cache_is_whole_again(h, watching):
    client, cache, ended = watching
    (first,) = h.runtime._subscribers
    assert cache.put(0.0, "p", cache.begin(), CachedAdmission("w1", 0, True, 0), was_paused=False)
    client._restart_watch.set()  # what a leader change or an outage does
    await assert_eventually(
        lambda: len(h.runtime._subscribers) == 1 and first not in h.runtime._subscribers and cache.live,
        timeout_s=5,
    )
    assert cache.get(0.0, "p") is None  # cleared when the stream was lost
    assert (await h.client.Release(pb.ReleaseRequest(session_id="gone"))).released is False
    await h.admit("q", "r2", 10, timeout=5)
    assert (await h.client.Release(pb.ReleaseRequest(session_id="q"))).released
    await assert_eventually(lambda: ended == ["q"], timeout_s=5)  # the new stream delivers


async def test_an_event_kind_from_a_newer_scheduler_drops_its_programs_entry_and_the_watch_goes_on(
    h, watching, monkeypatch
):
    """A kind this router does not know is a change to its program (the entry goes, the next turn asks),
    not the end of the watch: the fast path stayed off for good when an unknown kind ended the task."""
    from services.scheduler import servicer

    newer_kind = max(pb.EventKind.values()) + 1
    to_proto = servicer.event_to_proto

    def from_a_newer_scheduler(event, *args, **kwargs):
        message = to_proto(event, *args, **kwargs)
        if message.session_id == "newer":
            message.kind = newer_kind
        return message

    monkeypatch.setattr(servicer, "event_to_proto", from_a_newer_scheduler)
    client, cache, ended = watching
    await h.admit("newer", "r1", 10, timeout=5)
    assert cache.put(0.0, "newer", cache.begin(), CachedAdmission("w1", 0, True, 0), was_paused=False)
    assert cache.put(0.0, "other", cache.begin(), CachedAdmission("", 0, False, 0), was_paused=False)
    assert (await h.client.Release(pb.ReleaseRequest(session_id="newer"))).released
    await assert_eventually(lambda: cache.get(0.0, "newer") is None, timeout_s=5)
    assert cache.get(0.0, "other") is None  # it may be a pressure event: the "any" entries go too
    await h.admit("q", "r2", 10, timeout=5)
    assert (await h.client.Release(pb.ReleaseRequest(session_id="q"))).released
    await assert_eventually(lambda: ended == ["q"], timeout_s=5)  # the same stream goes on
    assert cache.live


def test_the_cache_knows_every_kind_this_routers_scheduler_protocol_has():
    from services.router.adapters.scheduler import _EVENT_NAMES
    from services.router.core.admission_cache import KNOWN_EVENTS

    assert KNOWN_EVENTS == {name for value, name in _EVENT_NAMES.items() if value != pb.EVENT_KIND_UNSPECIFIED}


async def test_a_watcher_that_ends_on_a_bug_says_so(h, watching, monkeypatch, caplog):
    client, cache, ended = watching

    def broken(kind, session_id):
        raise RuntimeError("a bug in the cache")

    monkeypatch.setattr(cache, "event", broken)
    await h.admit("p", "r1", 10, timeout=5)
    assert (await h.client.Release(pb.ReleaseRequest(session_id="p"))).released
    await assert_eventually(lambda: client._watcher.done(), timeout_s=5)
    await asyncio.sleep(0)  # the done-callbacks run
    assert any(
        r.levelname == "ERROR" and "event watch stopped" in r.getMessage() and "a bug in the cache" in r.getMessage()
        for r in caplog.records
    )
    assert not cache.live  # cleared as it ended: no answer is taken from a cache nothing keeps in step
