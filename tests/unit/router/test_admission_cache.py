"""The admission fast path's cache (services/router/core/admission_cache.py): its invalidation rules."""

from __future__ import annotations

import pytest

from services.router.core.admission_cache import AdmissionCache, CachedAdmission, CacheParams

PINNED = CachedAdmission("w1", 0, True, 5)
ANY = CachedAdmission("", 0, False, 0)


def live(**params) -> AdmissionCache:
    cache = AdmissionCache(CacheParams(**params))
    cache.connected()
    return cache


def test_nothing_is_cached_or_served_without_a_live_event_stream():
    cache = AdmissionCache()
    assert not cache.put(0.0, "p", cache.begin(), PINNED, was_paused=False)
    cache.connected()
    assert cache.put(0.0, "p", cache.begin(), PINNED, was_paused=False)
    assert cache.get(1.0, "p") == PINNED
    cache.lost()
    assert cache.get(1.0, "p") is None and len(cache) == 0


def test_an_admission_begun_before_the_stream_connected_is_not_stored():
    cache = AdmissionCache()
    token = cache.begin()
    cache.connected()
    assert not cache.put(0.0, "p", token, PINNED, was_paused=False)
    token = cache.begin()
    cache.lost()
    cache.connected()  # reconnected (a leader change): events may have been missed between
    assert not cache.put(0.0, "p", token, PINNED, was_paused=False)


def test_a_held_or_resumed_admission_is_not_stored():
    cache = live()
    assert not cache.put(0.0, "p", cache.begin(), PINNED, was_paused=True)
    assert cache.get(0.0, "p") is None


@pytest.mark.parametrize(
    "kind", ["paused", "marked", "soft_demoted", "resumed", "forced_resume", "released", "expired"]
)
def test_any_event_of_the_program_but_admitted_drops_its_entry(kind):
    cache = live()
    cache.put(0.0, "p", cache.begin(), PINNED, was_paused=False)
    cache.put(0.0, "q", cache.begin(), PINNED, was_paused=False)
    cache.event("admitted", "p")
    assert cache.get(0.0, "p") == PINNED
    cache.event(kind, "p")
    assert cache.get(0.0, "p") is None and cache.get(0.0, "q") == PINNED


def test_an_answer_older_than_an_event_of_its_program_is_not_stored():
    """The Admit was answered before the pause; the pause's event reached the router first."""
    cache = live()
    token = cache.begin()
    cache.event("paused", "p")
    assert not cache.put(0.0, "p", token, PINNED, was_paused=False)
    assert cache.put(0.0, "other", token, PINNED, was_paused=False)  # other programs' events do not matter
    assert cache.put(0.0, "p", cache.begin(), PINNED, was_paused=False)


def test_a_pressure_event_drops_every_unpinned_entry():
    cache = live()
    cache.put(0.0, "any", cache.begin(), ANY, was_paused=False)
    cache.put(0.0, "pinned", cache.begin(), PINNED, was_paused=False)
    cache.event("resumed", "x")
    assert cache.get(0.0, "any") == ANY
    cache.event("marked", "x")
    assert cache.get(0.0, "any") is None and cache.get(0.0, "pinned") == PINNED


def test_entries_age_out_and_the_least_recently_used_goes_first():
    cache = live(max_entries=2, ttl_s=10.0)
    cache.put(0.0, "a", cache.begin(), PINNED, was_paused=False)
    cache.put(0.0, "b", cache.begin(), PINNED, was_paused=False)
    assert cache.get(1.0, "a") == PINNED  # a is now the most recent
    cache.put(2.0, "c", cache.begin(), PINNED, was_paused=False)
    assert cache.get(2.0, "b") is None and cache.get(2.0, "a") == PINNED
    assert cache.get(12.5, "c") is None  # stored at 2, ttl 10


def test_a_program_forgotten_by_the_event_record_is_not_stored_from_an_older_admission():
    cache = live(max_entries=1)
    token = cache.begin()
    cache.event("paused", "p")
    cache.event("paused", "q")  # p's event leaves the bounded record
    assert not cache.put(0.0, "p", token, PINNED, was_paused=False)


def test_invalid_params_are_refused():
    with pytest.raises(ValueError, match="max_entries"):
        CacheParams(max_entries=0)
    with pytest.raises(ValueError, match="ttl_s"):
        CacheParams(ttl_s=0.0)


def test_a_was_paused_answer_drops_the_programs_entry():
    """A dispatched Admit of a program paused meanwhile (its pause event lost or late) answers was_paused."""
    cache = live()
    cache.put(0.0, "p", cache.begin(), PINNED, was_paused=False)
    assert not cache.put(1.0, "p", cache.begin(), PINNED, was_paused=True)
    assert cache.get(1.0, "p") is None


def test_a_pressure_event_drops_the_any_entries_however_they_came_and_went():
    """A random run of puts (pinned and "any", re-put as the other kind), events of every kind, reads past
    the TTL, drops, evictions at the bound, losses and reconnects: every pressure event drops exactly the "any"
    entries, as a walk over the whole cache would, and the cache serves what a plain model of its rules says.
    (A pressure event no longer walks the pinned entries: 1,400 of them over 10,000 pinned entries took 715 ms
    of the router's CPU, now about 1 ms; docs/benchmarks/router.md, "Issue 20, round 4".)"""
    import random

    rng = random.Random(20)
    cache = live(max_entries=8, ttl_s=5.0)
    model: dict[str, tuple[CachedAdmission, float]] = {}  # the entries the rules say are live
    sids = [f"p{i}" for i in range(12)]
    now = 0.0
    for _ in range(5_000):
        now += rng.random()
        op = rng.random()
        sid = rng.choice(sids)
        if op < 0.45:
            admission = rng.choice((PINNED, ANY))
            if cache.put(now, sid, cache.begin(), admission, was_paused=False):
                model.pop(sid, None)
                model[sid] = (admission, now)
                while len(model) > 8:
                    del model[next(iter(model))]
        elif op < 0.65:
            kind = rng.choice(("admitted", "paused", "marked", "soft_demoted", "resumed", "released", "expired"))
            cache.event(kind, sid)
            if kind != "admitted":
                model.pop(sid, None)
            if kind in ("paused", "marked", "soft_demoted"):
                model = {k: v for k, v in model.items() if v[0].pinned}
        elif op < 0.9:
            found = model.get(sid)
            expected = None
            if found is not None:
                if now - found[1] > 5.0:
                    del model[sid]
                else:
                    expected = found[0]
                    model[sid] = model.pop(sid)  # used: the most recent
            assert cache.get(now, sid) == expected
        elif op < 0.97:
            cache.drop(sid)
            model.pop(sid, None)
        else:
            cache.lost()
            cache.connected()
            model.clear()
        assert len(cache) == len(model)
