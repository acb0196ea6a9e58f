"""Continuum's policy core (harness/peers/continuum.py): the TTL, pins as occupied room, program-level
FCFS, unpinning later programs, expiry timers, as tables."""

from __future__ import annotations

import pytest

from harness.peers import ContinuumCore, ContinuumParams, Wake
from harness.peers.continuum import prefill_reload_s
from services.common.settings.errors import ConfigError


def linear_reload(tokens: int) -> float:
    """1,000 tokens a second."""
    return tokens / 1000.0


def core(capacities=(10_000,), reload=linear_reload, **params) -> ContinuumCore:
    return ContinuumCore(ContinuumParams(**params), capacities, reload)


@pytest.mark.parametrize(
    "tokens, mean, expected",
    [
        # break-even τ* = reload_s(c)·C/c = C / 1,000 tokens/s = 10 s for any c (linear reload)
        (2_000, None, 10.0),  # cold start: the break-even
        (2_000, 1.0, 4.0),  # min(τ*, 4·μ)
        (2_000, 3.0, 10.0),  # 4·μ = 12 > τ*
        (2_000, 10.0, 10.0),  # μ = τ*: still worth it
        (2_000, 10.5, 0.0),  # the tool is expected to outlast the break-even: no pin
        (0, 1.0, 0.0),
    ],
)
def test_ttl_from_the_tool_average_and_the_reload_cost(tokens, mean, expected):
    assert core().ttl_s(tokens, mean) == pytest.approx(expected)


def test_the_break_even_grows_with_a_superlinear_reload_cost_and_is_capped():
    c = core(reload=lambda t: (t / 1000.0) ** 2, max_ttl_s=50.0)
    assert c.ttl_s(1_000, None) == pytest.approx(10.0)  # 1 s x 10,000 / 1,000
    assert c.ttl_s(4_000, None) == pytest.approx(40.0)
    assert c.ttl_s(8_000, None) == pytest.approx(50.0)  # 80 s, capped


def test_prefill_reload_sums_the_chunks_with_their_prefix():
    calls = []

    def chunk_ms(new: int, prefix: int) -> float:
        calls.append((new, prefix))
        return float(new)

    assert prefill_reload_s(chunk_ms, 4)(10) == pytest.approx(0.010)
    assert calls == [(4, 0), (4, 4), (2, 8)]


def test_a_pinned_program_returns_to_its_backend_past_the_queue():
    c = core((10_000,))
    assert c.begin_turn(0, "a", 4_000) == 0
    c.end_turn(1, "a", 4_000, 100)  # pinned for 10 s (cold start)
    assert c.occupied(0, 1) == 4_100
    assert c.begin_turn(2, "b", 6_000) is None  # 5,900 free: b waits, a's context stays
    assert c.begin_turn(3, "a", 4_500) == 0  # back within its TTL: its pin is its room
    assert c.pin_hits_total == 1
    assert c.end_turn(4, "a", 4_500, 100) == []  # pinned again: 5,400 free, still < 6,000


def test_the_pin_lapses_at_its_ttl_and_the_queue_moves():
    c = core((10_000,))
    c.begin_turn(0, "a", 4_000)
    c.end_turn(1, "a", 4_000, 100)
    assert c.begin_turn(2, "b", 6_000) is None
    assert c.next_timer() == pytest.approx(11.0)
    assert c.tick(10.9) == []
    assert c.tick(11.0) == [Wake("b", 0)]
    assert c.pins_expired_total == 1 and c.next_timer() is None


def test_admission_is_program_level_fcfs():
    c = core((10_000,))
    assert c.begin_turn(0, "old", 9_000) == 0
    assert c.begin_turn(1, "mid", 5_000) is None
    assert c.begin_turn(2, "new", 500) is None  # fits, but an earlier program waits: FCFS
    c.end_turn(3, "old", 9_000, 0)  # old's tool: pinned (9,000), so mid still does not fit
    assert c.queue == ["mid", "new"]
    # old comes back and grows beyond its pin: it queues ahead of mid and new (it arrived first).
    assert c.begin_turn(4, "old", 9_500) == 0
    assert c.queue == ["mid", "new"]
    assert c.end_turn(5, "old", 0, 0) == [Wake("mid", 0), Wake("new", 0)]  # a failed turn pins nothing


def test_the_head_unpins_later_programs_latest_first_but_not_earlier_ones():
    c = core((10_000,))
    for t, pid in enumerate(("p0", "p1", "p2")):
        assert c.begin_turn(t, pid, 3_000) == 0
    for pid in ("p0", "p1", "p2"):
        c.end_turn(5, pid, 3_000, 0)  # three pins, 9,000 tokens
    # p0 returns with 4,500: 1,000 free + its own 3,000 = 4,000 < 4,500: it unpins p2 (the latest).
    assert c.begin_turn(6, "p0", 4_500) == 0
    assert c.programs["p2"].pinned_tokens == 0 and c.programs["p1"].pinned_tokens == 3_000
    assert c.unpinned_total == 1
    # p2 comes back, needs 3,500: 10,000 - 4,500 - 3,000 = 2,500; it may not unpin p1 (earlier): waits.
    assert c.begin_turn(7, "p2", 3_500) is None
    assert c.programs["p1"].pinned_tokens == 3_000


def test_a_context_larger_than_the_pool_runs_on_an_empty_backend():
    c = core((1_000, 1_000))
    assert c.begin_turn(0, "huge", 5_000) == 0


def test_tool_durations_are_learned_per_program_with_a_global_prior():
    c = core((100_000,), ema_alpha=0.5)
    c.begin_turn(0, "a", 1_000)
    c.end_turn(1, "a", 1_000, 0)
    c.begin_turn(3, "a", 1_100)  # a tool of 2 s
    assert c.programs["a"].tool_mean_s == pytest.approx(2.0)
    c.end_turn(4, "a", 1_100, 0)
    c.begin_turn(8, "a", 1_200)  # 4 s: 0.5·4 + 0.5·2
    assert c.programs["a"].tool_mean_s == pytest.approx(3.0)
    # A new program's first pin uses the average over all programs (3.0 s here): TTL = 4 x 3 s.
    c.begin_turn(9, "b", 1_000)
    c.end_turn(10, "b", 1_000, 0)
    assert c.programs["b"].pin_until == pytest.approx(10 + 12.0)


def test_release_frees_the_pin_and_admits():
    c = core((10_000,))
    c.begin_turn(0, "a", 8_000)
    c.end_turn(1, "a", 8_000, 0)
    assert c.begin_turn(2, "b", 5_000) is None
    assert c.release(3, "a") == [Wake("b", 0)]


@pytest.mark.parametrize(
    "field, value", [("ttl_mean_multiple", 0), ("ema_alpha", 0), ("ema_alpha", 1.5), ("max_ttl_s", -1)]
)
def test_invalid_params_name_the_rule(field, value):
    with pytest.raises(ConfigError) as exc:
        ContinuumParams(**{field: value})
    assert exc.value.field == field
