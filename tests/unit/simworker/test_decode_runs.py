"""`plan_decode` / `commit_decode` are exactly `step` repeated: same tokens, times, cache, counters.

Two engines get the same arrivals. One is stepped one iteration at a time; the other advances
pure-decode stretches as planned runs, cut short at the first step boundary after an arrival
(what the offline simulator does). Everything observable must agree.
"""

from __future__ import annotations

import bisect
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.simworker.core.api import EngineRequest
from tests.unit.simworker.helpers import make_engine


def _arrivals(seed: int, n: int, vocab_base: int = 1000) -> list[tuple[float, EngineRequest]]:
    rng = random.Random(seed)
    out = []
    t = 0.0
    shared = tuple(range(vocab_base, vocab_base + 24))  # a common system prompt
    for i in range(n):
        t += rng.expovariate(1 / 0.4)
        own = tuple(rng.randrange(2000, 9000) for _ in range(rng.randrange(1, 60)))
        ignore_eos = rng.random() < 0.5
        out.append(
            (
                t,
                EngineRequest(
                    f"r{i}",
                    shared + own,
                    rng.randrange(1, 90),
                    ignore_eos=ignore_eos,
                    target_output_tokens=rng.randrange(1, 120) if rng.random() < 0.7 else None,
                ),
            )
        )
    return out


def _play(engine, arrivals, fused: bool, max_steps: int = 64):
    """Drive `engine` in virtual time; returns (log of (time, rid, tokens, finished), end time)."""
    log = []
    pending = list(arrivals)
    now = 0.0
    busy_until = None  # end of the step or run in progress
    run = None  # (ends, steps) of the planned run in progress
    result = None
    while pending or engine.has_work() or busy_until is not None:
        next_arrival = pending[0][0] if pending else None
        if busy_until is not None and (next_arrival is None or busy_until < next_arrival):
            now = busy_until
            if run is not None:
                result = engine.commit_decode(run[1])
                run = None
            for out in result.outputs:
                log.append((now, out.rid, out.new_token_ids, out.finished, out.cached_tokens))
            busy_until = None
        elif next_arrival is not None and (busy_until is None or next_arrival <= busy_until):
            now, request = pending.pop(0)
            engine.submit(request, now)
            if run is not None:
                # Cut the run at the first step boundary at or after the arrival.
                steps = bisect.bisect_left(run[0], now) + 1
                run = (run[0], steps)
                busy_until = run[0][steps - 1]
            if busy_until is not None:
                continue
        if busy_until is None and engine.has_work():
            if fused:
                ends = engine.plan_decode(now, max_steps)
                if ends:
                    run = (ends, len(ends))
                    busy_until = ends[-1]
                    continue
            result = engine.step(now)
            if result.duration_s > 0:
                busy_until = now + result.duration_s
            else:
                for out in result.outputs:
                    log.append((now, out.rid, out.new_token_ids, out.finished, out.cached_tokens))
                if not pending:
                    break
    return log, now


def _per_request(log):
    tokens: dict[str, list[int]] = {}
    finished: dict[str, tuple[float, int]] = {}
    for t, rid, new, done, cached in log:
        tokens.setdefault(rid, []).extend(new)
        if done:
            finished[rid] = (t, cached)
    return tokens, finished


def _assert_plays_alike(stepped, fused, arrivals, max_steps: int) -> None:
    """`stepped` played one step at a time and `fused` in runs of up to `max_steps` end alike: the
    same tokens and finishes per request, the same end, stats and cached pages."""
    log_a, end_a = _play(stepped, arrivals, fused=False)
    log_b, end_b = _play(fused, arrivals, fused=True, max_steps=max_steps)
    assert _per_request(log_a) == _per_request(log_b)
    assert end_a == end_b
    assert stepped.stats() == fused.stats()
    assert stepped.cache.cached_hashes() == fused.cache.cached_hashes()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([96, 160, 400]), st.sampled_from([2, 8, 64]))
def test_runs_equal_single_steps(seed, pool_tokens, max_steps):
    arrivals = _arrivals(seed, 14)
    stepped, fused = make_engine(max_total_tokens=pool_tokens), make_engine(max_total_tokens=pool_tokens)
    _assert_plays_alike(stepped, fused, arrivals, max_steps)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([96, 160, 400]), st.sampled_from([2, 8, 64]))
def test_runs_without_kv_events_equal_single_steps_with_them(seed, pool_tokens, max_steps):
    # Without KV events (the simulator's engines) a run evicts what its steps lack in one call and
    # the tree evicts a run of pages at a time; with them, page by page at each step: the reference.
    arrivals = _arrivals(seed, 14)
    stepped = make_engine(max_total_tokens=pool_tokens, emit_kv_events=True)
    fused = make_engine(max_total_tokens=pool_tokens, emit_kv_events=False)
    _assert_plays_alike(stepped, fused, arrivals, max_steps)


def test_a_run_stops_at_the_first_finish_and_before_memory_runs_short():
    engine = make_engine(max_total_tokens=64)  # 16 pages of 4
    engine.submit(EngineRequest("a", tuple(range(1000, 1010)), 5, ignore_eos=True), 0.0)
    engine.submit(EngineRequest("b", tuple(range(2000, 2006)), 50, ignore_eos=True), 0.0)
    first = engine.step(0.0)  # prefill both, first token each
    ends = engine.plan_decode(first.duration_s, 100)
    assert len(ends) == 4  # a finishes in its 4th decode step
    result = engine.commit_decode(len(ends))
    by_rid = {o.rid: o for o in result.outputs}
    assert by_rid["a"].finished and by_rid["a"].completion_tokens == 5
    assert not by_rid["b"].finished and len(by_rid["b"].new_token_ids) == 4


def test_no_run_while_anything_waits_or_prefills_and_abort_cancels_the_plan():
    engine = make_engine()
    engine.submit(EngineRequest("a", tuple(range(1000, 1010)), 30, ignore_eos=True), 0.0)
    assert engine.plan_decode(0.0, 10) == ()  # waiting
    engine.step(0.0)
    assert len(engine.plan_decode(1.0, 10)) == 10
    engine.abort("a", 1.0)
    with pytest.raises(RuntimeError):
        engine.commit_decode(1)


def _first_token_times(log) -> dict[str, float]:
    first: dict[str, float] = {}
    for t, rid, new, _, _ in log:
        if new:
            first.setdefault(rid, t)
    return first


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([96, 160, 400]), st.booleans())
def test_outputs_at_first_token_and_end_only_carry_the_same_run(seed, pool_tokens, fused):
    """`stream_outputs=False` (the simulator's engines): the same tokens, first-token times, finish
    times and counters as streaming, in at most two outputs per request (its first token, its end)."""
    arrivals = _arrivals(seed, 14)
    streaming, bulk = (
        make_engine(max_total_tokens=pool_tokens),
        make_engine(max_total_tokens=pool_tokens, stream_outputs=False),
    )
    log_a, end_a = _play(streaming, arrivals, fused=fused)
    log_b, end_b = _play(bulk, arrivals, fused=fused)
    assert _per_request(log_a) == _per_request(log_b)
    assert _first_token_times(log_a) == _first_token_times(log_b)
    assert end_a == end_b
    assert streaming.stats() == bulk.stats()
    assert streaming.cache.cached_hashes() == bulk.cache.cached_hashes()
    outputs: dict[str, int] = {}
    for _, rid, _, _, _ in log_b:
        outputs[rid] = outputs.get(rid, 0) + 1
    assert max(outputs.values()) <= 2


def test_without_streaming_an_abort_carries_the_tokens_not_yet_given_out():
    engine = make_engine(stream_outputs=False)
    engine.submit(EngineRequest("a", tuple(range(1000, 1010)), 30, ignore_eos=True), 0.0)
    first = engine.step(0.0)
    assert [len(o.new_token_ids) for o in first.outputs] == [1]
    assert engine.step(1.0).outputs == () and engine.step(2.0).outputs == ()
    engine.abort("a", 3.0)
    (aborted,) = engine.step(3.0).outputs
    assert aborted.finished and aborted.finish_reason["type"] == "abort"
    assert len(aborted.new_token_ids) == 2 and aborted.completion_tokens == 3
