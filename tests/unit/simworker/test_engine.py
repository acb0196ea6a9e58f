"""Pure tests of SimEngine: prefix cache, LRU, admission, retraction, HiCache, priority, events."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.settings.errors import ConfigError
from services.simworker.core.api import EngineConfig, EngineRequest
from services.simworker.core.radix import PageChain, extend_chain, page_hashes, token_bytes
from services.simworker.core.tokenizer import EOS_TOKEN_ID

from .helpers import Run, assert_no_leak, make_engine, prompt


def req(rid, n_prompt, out=4, base=1000, **kw):
    kw.setdefault("ignore_eos", True)
    return EngineRequest(rid, prompt(n_prompt, base), out, **kw)


def test_second_request_hits_the_full_pages_of_the_first():
    run = Run(make_engine(page_size=4))
    run.submit(req("a", 30))
    run.drain()
    run.submit(req("b", 30))
    run.drain()
    # 30 prompt tokens: at most (30-1)//4 = 7 full pages may be matched (the last token is computed).
    assert run.final("a").cached_tokens == 0
    assert run.final("b").cached_tokens == 28
    stats = run.engine.stats()
    assert stats.cached_tokens_total == 28
    assert stats.prompt_tokens_total == 60
    assert_no_leak(run.engine)


def test_output_tokens_are_cached_for_the_next_turn():
    run = Run(make_engine(page_size=4))
    run.submit(req("t1", 16, out=9))
    run.drain()
    turn2 = prompt(16) + tuple(run.tokens("t1")) + (7, 7, 7)
    run.submit(EngineRequest("t2", turn2, 2, ignore_eos=True))
    run.drain()
    # 16 + 8 computed output tokens = 24 = 6 full pages (the 9th token never had its KV computed).
    assert run.final("t2").cached_tokens == 24


def test_partial_pages_are_never_shared():
    run = Run(make_engine(page_size=8))
    run.submit(req("a", 7))
    run.drain()
    run.submit(req("b", 7))
    run.drain()
    assert run.final("b").cached_tokens == 0


def test_lru_evicts_least_recently_used_prefix_leaf_first():
    # Pool of 16 pages (64 tokens). Three 20-token prompts (5 pages each) fill 15; A is touched again.
    run = Run(make_engine(page_size=4, max_total_tokens=64))
    for rid, base in (("a", 1000), ("b", 2000), ("c", 3000)):
        run.submit(req(rid, 20, out=1, base=base))
        run.drain()
    run.submit(req("a2", 20, out=1, base=1000))
    run.drain()
    assert run.final("a2").cached_tokens == 16
    # D needs pages: B (least recently used) loses its deepest pages first.
    run.submit(req("d", 12, out=1, base=4000))  # 3 pages: 1 free, 2 evicted
    run.drain()
    gpu, _ = run.engine.cache.cached_hashes()
    hb = page_hashes(prompt(20, 2000), 4)
    ha = page_hashes(prompt(20, 1000), 4)
    assert set(ha) <= gpu
    assert set(hb[:3]) <= gpu and not set(hb[3:]) & gpu  # leaf-first: B's tail went, its head stayed
    assert run.engine.stats().evicted_tokens_total > 0
    assert_no_leak(run.engine)


def test_admission_waits_until_reservation_fits():
    # 32 pages. A running request reserves its output; B's prompt + reservation does not fit.
    run = Run(make_engine(page_size=4, max_total_tokens=128))
    run.submit(req("a", 60, out=40))
    run.step()
    run.submit(req("b", 60, out=40, base=5000))
    run.step()
    assert run.engine.stats().num_queue_reqs == 1
    run.drain()
    assert run.finish_order == ["a", "b"]
    assert run.engine.stats().retractions_total == 0
    assert_no_leak(run.engine)


def test_decode_pressure_retracts_least_progressed_and_recomputes():
    # Pool of 48 pages. Each request reserves 0.7 x 70 output tokens (13 pages) at admission, so
    # both get in (10 + 13 and 11 + 13 pages), but together they need 28 + 29 pages: decode runs
    # out of pages and one request is retracted, requeued and finished later.
    run = Run(make_engine(page_size=4, max_total_tokens=192, chunked_prefill_size=64))
    run.submit(req("a", 40, out=70))
    run.submit(req("b", 44, out=70, base=5000))
    run.drain()
    a, b = run.final("a"), run.final("b")
    assert a.finish_reason == {"type": "length", "length": 70}
    assert b.finish_reason == {"type": "length", "length": 70}
    assert a.completion_tokens == b.completion_tokens == 70
    assert max(a.num_retractions, b.num_retractions) >= 1
    stats = run.engine.stats()
    assert stats.retractions_total == a.num_retractions + b.num_retractions
    # The victim had made the same progress, so SGLang's tie-break picks the longer prompt.
    assert b.num_retractions >= 1
    assert len(run.tokens("a")) == 70 and len(run.tokens("b")) == 70
    assert_no_leak(run.engine)


def test_retracted_request_output_is_unchanged_by_the_retraction():
    roomy = Run(make_engine(page_size=4, max_total_tokens=4096, seed=3))
    tight = Run(make_engine(page_size=4, max_total_tokens=192, chunked_prefill_size=64, seed=3))
    for run in (roomy, tight):
        run.submit(req("a", 40, out=70))
        run.submit(req("b", 44, out=70, base=5000))
        run.drain()
    assert tight.engine.stats().retractions_total >= 1
    assert tight.tokens("b") == roomy.tokens("b")


@pytest.mark.parametrize("policy", ["write_back", "write_through", "write_through_selective"])
def test_host_tier_spill_and_load_back(policy):
    # 16 GPU pages, 64 host pages. Prompt A (40 tokens = 10 pages) is pushed out by B and C, then
    # comes back: its prefix is loaded from the host instead of recomputed (selective: only
    # once A's pages have been hit twice).
    run = Run(
        make_engine(
            page_size=4,
            max_total_tokens=64,
            enable_hierarchical_cache=True,
            hicache_size_tokens=256,
            hicache_write_policy=policy,
        )
    )
    turns = ["a", "a", "a"] if policy == "write_through_selective" else ["a"]
    for i, rid in enumerate(turns):
        run.submit(req(f"{rid}{i}", 40, out=1))
        run.drain()
    for rid, base in (("b", 2000), ("c", 3000)):
        run.submit(req(rid, 40, out=1, base=base))
        run.drain()
    hashes_a = page_hashes(prompt(40), 4)
    gpu, host = run.engine.cache.cached_hashes()
    assert not set(hashes_a) & gpu
    assert set(hashes_a[:9]) <= host
    before = run.engine.stats()
    run.submit(req("a_again", 40, out=1))
    run.drain()
    out = run.final("a_again")
    after = run.engine.stats()
    assert out.cached_tokens == 36 and out.host_cached_tokens == 36
    assert after.host_loadbacks_total == before.host_loadbacks_total + 1
    assert after.host_loadback_tokens_total - before.host_loadback_tokens_total == 36
    # Only the last page is recomputed: a match stops one token short of the prompt's end.
    assert after.recomputed_tokens_total == before.recomputed_tokens_total + 4
    if policy == "write_through":
        assert after.host_used_tokens >= 4 * len(run.engine.cache.cached_hashes()[0] & set(hashes_a))
    assert_no_leak(run.engine)
    assert (run.replay.gpu, run.replay.host) == run.engine.cache.cached_hashes()


def test_write_through_selective_skips_pages_hit_once():
    run = Run(
        make_engine(
            page_size=4,
            max_total_tokens=64,
            enable_hierarchical_cache=True,
            hicache_size_tokens=256,
            hicache_write_policy="write_through_selective",
        )
    )
    for rid, base in (("a", 1000), ("b", 2000), ("c", 3000)):
        run.submit(req(rid, 40, out=1, base=base))
        run.drain()
    assert run.engine.stats().host_used_tokens == 0
    run.submit(req("a2", 40, out=1))
    run.drain()
    assert run.final("a2").cached_tokens == 0
    assert run.engine.stats().recomputed_tokens_total == 40  # all 10 full pages computed again


def test_load_back_takes_time_from_the_host_bandwidth():
    engine = make_engine(
        page_size=4,
        max_total_tokens=64,
        enable_hierarchical_cache=True,
        hicache_size_tokens=256,
        hicache_write_policy="write_back",
    )
    run = Run(engine)
    for rid, base in (("a", 1000), ("b", 2000), ("c", 3000)):
        run.submit(req(rid, 40, out=1, base=base))
        run.drain()
    run.submit(req("a2", 40, out=1))
    duration = run.step()
    profile = engine.profile
    expected = (profile.decode_ms(0, 0) + profile.prefill_chunk_ms(4, 36)) / 1000 + profile.host_load_s(36)
    assert duration == pytest.approx(expected)


@pytest.mark.parametrize("low_first, expected", [(False, ["hi", "mid", "lo"]), (True, ["lo", "mid", "hi"])])
def test_priority_order(low_first, expected):
    run = Run(
        make_engine(
            page_size=4,
            max_total_tokens=4096,
            max_running_requests=1,
            enable_priority_scheduling=True,
            schedule_low_priority_values_first=low_first,
        )
    )
    run.submit(req("first", 8, base=100))
    run.step()
    for rid, prio, base in (("lo", 1, 200), ("mid", 5, 300), ("hi", 10, 400)):
        run.submit(req(rid, 8, priority=prio, base=base))
    run.drain()
    assert run.finish_order == ["first"] + expected


def test_fcfs_ignores_priority_when_disabled():
    run = Run(make_engine(page_size=4, max_total_tokens=4096, max_running_requests=1))
    for rid, prio, base in (("a", 1, 200), ("b", 10, 300)):
        run.submit(req(rid, 8, priority=prio, base=base))
    run.drain()
    assert run.finish_order == ["a", "b"]


def test_natural_stop_eos_and_length_and_ignore_eos():
    run = Run(make_engine(page_size=4, max_total_tokens=4096))
    run.submit(EngineRequest("stop", prompt(8), 10, target_output_tokens=3))
    run.submit(EngineRequest("len", prompt(8, 3000), 5, target_output_tokens=30))
    run.submit(EngineRequest("ign", prompt(8, 5000), 6, ignore_eos=True, target_output_tokens=2))
    run.drain()
    assert run.final("stop").finish_reason == {"type": "stop", "matched": EOS_TOKEN_ID}
    assert run.tokens("stop")[-1] == EOS_TOKEN_ID and len(run.tokens("stop")) == 3
    assert run.final("len").finish_reason == {"type": "length", "length": 5}
    assert run.final("ign").finish_reason == {"type": "length", "length": 6}
    assert EOS_TOKEN_ID not in run.tokens("ign")


def _transcript(seed):
    run = Run(make_engine(page_size=4, max_total_tokens=512, seed=seed))
    for i in range(6):
        run.submit(EngineRequest(f"r{i}", prompt(20 + 7 * i, 1000 + 50 * (i % 2)), 40))
    trace = []
    while run.engine.has_work():
        result = run.engine.step(run.now)
        run.now += result.duration_s
        trace.append((result.duration_s, result.outputs, result.kv_events))
    return trace


def test_deterministic_for_a_seed():
    assert _transcript(7) == _transcript(7)
    assert _transcript(7) != _transcript(8)


def test_abort_queued_and_running():
    run = Run(make_engine(page_size=4, max_total_tokens=4096, max_running_requests=1))
    run.submit(req("running", 16, out=50))
    run.submit(req("queued", 16, out=50, base=3000))
    run.step()
    assert run.engine.abort("queued", run.now)
    assert run.engine.abort("running", run.now)
    assert not run.engine.abort("unknown", run.now)
    run.drain()
    for rid in ("running", "queued"):
        assert run.final(rid).finish_reason["type"] == "abort"
    assert run.engine.stats().aborted_requests_total == 2
    assert not run.engine.has_work()
    assert_no_leak(run.engine)


def test_flush_refused_while_busy_and_clears_when_idle():
    run = Run(make_engine(page_size=4))
    run.submit(req("a", 20))
    run.step()
    assert run.engine.flush_cache() is False
    run.drain()
    assert run.engine.flush_cache() is True
    result = run.engine.step(run.now)
    run.replay.apply(result.kv_events)
    assert run.replay.gpu == set() and run.engine.cache.gpu_pages == 0
    run.submit(req("b", 20))
    run.drain()
    assert run.final("b").cached_tokens == 0
    assert run.engine.stats().recomputed_tokens_total == 20


def test_submit_rejects_what_can_never_be_served():
    engine = make_engine(page_size=4, max_total_tokens=64, context_length=100)
    with pytest.raises(ValueError):
        engine.submit(req("too_long_for_pool", 64), 0.0)
    with pytest.raises(ValueError):
        engine.submit(req("ctx", 50, out=60), 0.0)
    with pytest.raises(ValueError):
        engine.submit(EngineRequest("neg", (-1, 2), 1), 0.0)
    engine.submit(req("ok", 8), 0.0)
    with pytest.raises(ValueError):
        engine.submit(req("ok", 8), 0.0)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"page_size": 0}, "page_size"),
        ({"max_total_tokens": 2, "page_size": 4}, "max_total_tokens"),
        ({"hicache_write_policy": "write_sideways"}, "hicache_write_policy"),
        ({"enable_hierarchical_cache": True, "hicache_ratio": 1.0}, "hicache_ratio"),
    ],
)
def test_engine_config_validation(kwargs, field):
    with pytest.raises(ConfigError) as info:
        EngineConfig(**kwargs)
    assert info.value.field == field


def test_prefill_is_chunked_and_delays_decode():
    engine = make_engine(page_size=16, max_total_tokens=65536, chunked_prefill_size=1024)
    run = Run(engine)
    run.submit(req("small", 16, out=100))
    run.step()
    run.step()
    decode_only = run.step()
    run.submit(req("big", 4000, out=2, base=90_000))
    with_chunk = run.step()
    assert with_chunk > decode_only + engine.profile.prefill_chunk_ms(1024, 0) / 1000 * 0.99
    steps_to_first_token = 1
    while not run.outputs.get("big"):
        run.step()
        steps_to_first_token += 1
    assert steps_to_first_token == 4  # ceil(4000 / 1024)


def test_stats_gauges():
    run = Run(make_engine(page_size=4, max_total_tokens=256))
    run.submit(req("a", 40, out=20))
    run.step()
    stats = run.engine.stats()
    assert stats.num_running_reqs == 1 and stats.num_queue_reqs == 0
    assert stats.num_used_tokens == 40 and stats.token_usage == pytest.approx(40 / 256)
    run.drain()
    stats = run.engine.stats()
    assert stats.num_used_tokens == 0 and stats.generation_tokens_total == 20
    assert stats.gen_throughput > 0


request_mix = st.lists(
    st.tuples(
        st.integers(1, 90),  # prompt tokens
        st.integers(0, 40),  # max new tokens
        st.integers(0, 3),  # shared-prefix family
        st.integers(0, 6),  # submit after this many steps
        st.one_of(st.none(), st.integers(0, 12)),  # abort after this many steps
        st.integers(0, 20),  # priority
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mix=request_mix,
    hicache=st.sampled_from([None, "write_back", "write_through", "write_through_selective"]),
    priority=st.booleans(),
    pool_pages=st.integers(26, 60),
)
def test_no_page_leaks_and_events_match_cache(mix, hicache, priority, pool_pages):
    config = dict(
        page_size=4,
        max_total_tokens=4 * pool_pages,
        chunked_prefill_size=32,
        max_running_requests=5,
        enable_priority_scheduling=priority,
        context_length=4096,
    )
    if hicache:
        config.update(enable_hierarchical_cache=True, hicache_size_tokens=96, hicache_write_policy=hicache)
    run = Run(make_engine(**config))
    pending = sorted(enumerate(mix), key=lambda item: item[1][3])
    aborts = {}
    step = 0
    while pending or run.engine.has_work():
        while pending and pending[0][1][3] <= step:
            i, (n, out, family, _, abort_at, prio) = pending.pop(0)
            ids = prompt(n, 10_000 * family) if family else prompt(n, 500_000 + 1000 * i)
            run.submit(EngineRequest(f"r{i}", ids, out, priority=prio, target_output_tokens=max(1, out // 2)))
            if abort_at is not None:
                aborts[f"r{i}"] = step + abort_at
        for rid, at in list(aborts.items()):
            if at <= step:
                run.engine.abort(rid, run.now)
                del aborts[rid]
        run.step()
        step += 1
        assert step < 5000
        cache = run.engine.cache
        assert 0 <= cache.free_pages and cache.host_used <= cache.host_pages
        assert (run.replay.gpu, run.replay.host) == cache.cached_hashes()
    assert sorted(run.finish_order) == sorted(f"r{i}" for i in range(len(mix)))
    for i, (_n, out, *_rest) in enumerate(mix):
        final = run.final(f"r{i}")
        if final.finish_reason["type"] != "abort":
            assert len(run.tokens(f"r{i}")) == final.completion_tokens <= out
    assert_no_leak(run.engine)


def test_a_prompt_chain_gives_the_same_run_and_must_cover_the_prompt():
    """`prompt_pages` (the simulator's chain of the prompt's pages) changes nothing but who hashes."""

    def run(with_chain: bool) -> tuple:
        engine = make_engine(page_size=4, max_total_tokens=96, emit_kv_events=True)
        r = Run(engine)
        for k, n in enumerate((30, 41, 30, 52)):  # the third repeats the first: a cached prefix
            ids = prompt(n, 1000 if k != 1 else 5000)
            chain = extend_chain(PageChain([], []), token_bytes(ids[: n // 4 * 4]), 16, 0) if with_chain else None
            r.submit(EngineRequest(f"r{k}", ids, 9, ignore_eos=True, prompt_pages=chain))
            r.drain()
        return r.outputs, r.replay.gpu, engine.stats()

    assert run(True) == run(False)
    engine = make_engine(page_size=4)
    short = extend_chain(PageChain([], []), token_bytes(prompt(8)), 16, 0)
    with pytest.raises(ValueError, match="prompt_pages"):
        engine.submit(EngineRequest("x", prompt(12), 1, prompt_pages=short), 0.0)
