import math
import random
from collections import Counter

import pytest

from services.common.settings.errors import ConfigError
from services.common.sglang.kv_events import BlockStored
from services.router.core.cost import ClassicCost, CostInputs, LMetricCost, make_cost_policy
from services.router.core.kv_router import KvRouterCore
from services.router.core.params import KvRouterParams, RouterOverride
from services.router.core.select import (
    Candidate,
    NoWorkerAvailable,
    PickReason,
    PinOutcome,
    WorkerScore,
    pick_lowest,
    pick_sampled,
    softmax_probabilities,
)
from services.router.core.types import Replica

WA, WB, WC = Replica("a"), Replica("b"), Replica("c")


class FixedRandom:
    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def score(replica, cost, tree_size=0):
    return WorkerScore(replica, 0, 0, 0, 0, tree_size, cost)


# -- the formula ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prefill_tokens, decode_blocks, block_size, weight, expected",
    [
        (8 * 16, 10, 16, 1.0, 18.0),  # reference worked example: W1 = 8 + 10
        (5 * 16, 5, 16, 1.0, 10.0),  # W2 = 5 + 5 (chosen)
        (2 * 16, 9, 16, 1.0, 11.0),  # W3 = 2 + 9
        (24, 3, 16, 1.0, 4.5),  # prefill blocks are not rounded
        (24, 3, 16, 2.0, 6.0),  # weight scales the prefill term only
        (24, 3, 16, 0.0, 3.0),  # weight 0: pure decode balancing
    ],
)
def test_classic_cost(prefill_tokens, decode_blocks, block_size, weight, expected):
    assert ClassicCost()(CostInputs(prefill_tokens, decode_blocks, block_size, weight)) == pytest.approx(expected)


@pytest.mark.parametrize(
    "prefill_tokens, decode_blocks, weight, expected",
    [
        (32, 0, 1.0, 2.0),
        (32, 4, 1.0, 10.0),
        (0, 9, 1.0, 0.0),  # fully cached, nothing queued: free
        (32, 4, 0.5, 5.0),
    ],
)
def test_lmetric_cost(prefill_tokens, decode_blocks, weight, expected):
    assert LMetricCost()(CostInputs(prefill_tokens, decode_blocks, 16, weight)) == pytest.approx(expected)


def test_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError):
        make_cost_policy("nope")


# -- picking -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scores, rng_value, expected, reason",
    [
        ([score(WA, 3.0), score(WB, 2.0), score(WC, 4.0)], None, WB, PickReason.LOWEST_COST),
        ([score(WA, 2.0, 5), score(WB, 2.0, 3), score(WC, 4.0, 0)], None, WB, PickReason.TIE_SMALLEST_TREE),
        ([score(WA, 2.0, 3), score(WB, 2.0 + 1e-9, 3)], 0.0, WA, PickReason.TIE_RANDOM),
        ([score(WA, 2.0, 3), score(WB, 2.0, 3)], 0.99, WB, PickReason.TIE_RANDOM),
        ([score(WA, 9.0)], None, WA, PickReason.ONLY_CANDIDATE),
    ],
)
def test_temperature_zero(scores, rng_value, expected, reason):
    rng = FixedRandom(*([] if rng_value is None else [rng_value]))
    chosen, why = pick_lowest(scores, rng)
    assert (chosen.replica, why) == (expected, reason)
    assert rng.values == []  # randomness is drawn only for a full tie


def test_softmax_probabilities_follow_the_relative_temperature():
    p = softmax_probabilities([10.0, 12.0, 14.0], temperature=1.0)
    assert p[2] / p[0] == pytest.approx(math.exp(-1))
    assert p[1] / p[0] == pytest.approx(math.exp(-0.5))
    assert sum(p) == pytest.approx(1.0)
    assert softmax_probabilities([5.0, 5.0], temperature=0.3) == [0.5, 0.5]
    # same spread relative to the range -> same probabilities, whatever the scale
    assert softmax_probabilities([0.0, 200.0, 400.0], 1.0) == pytest.approx(p)


def test_sampling_uses_the_cumulative_distribution():
    scores = [score(WA, 0.0), score(WB, 1.0)]
    p_a = softmax_probabilities([0.0, 1.0], 1.0)[0]
    assert pick_sampled(scores, 1.0, FixedRandom(p_a - 1e-9))[0].replica == WA
    assert pick_sampled(scores, 1.0, FixedRandom(p_a + 1e-9))[0].replica == WB


def test_sampled_distribution_with_a_seeded_rng():
    scores = [score(WA, 1.0), score(WB, 2.0), score(WC, 3.0)]
    rng = random.Random(1234)
    counts = Counter(pick_sampled(scores, 1.0, rng)[0].replica for _ in range(20_000))
    expected = softmax_probabilities([1.0, 2.0, 3.0], 1.0)
    for replica, p in zip((WA, WB, WC), expected):
        assert counts[replica] / 20_000 == pytest.approx(p, abs=0.015)
    # a low temperature concentrates on the best, a high one flattens
    cold = Counter(pick_sampled(scores, 0.05, rng)[0].replica for _ in range(2_000))
    hot = Counter(pick_sampled(scores, 100.0, rng)[0].replica for _ in range(6_000))
    assert cold[WA] > 1_990
    assert all(abs(hot[r] / 6_000 - 1 / 3) < 0.03 for r in (WA, WB, WC))


# -- the whole pipeline --------------------------------------------------------------------

B = 8


def block(letter):
    rnd = random.Random(letter)
    return [rnd.randrange(1, 50_000) for _ in range(B)]


def prompt_tokens(*letters):
    return [t for letter in letters for t in block(letter)]


def engine_stores(core, replica, token_ids):
    """What an SGLang worker publishes after serving a prompt: one BlockStored per page, chained."""
    hashes = core.prompt_from_tokens(token_ids).block_hashes
    parent = None
    for i, h in enumerate(hashes):
        core.apply_kv_event(replica, BlockStored((h,), parent, tuple(token_ids[i * B : (i + 1) * B]), B))
        parent = h


def serve(core, request_id, letters, candidates, now, pinned=None):
    tokens = prompt_tokens(*letters)
    decision = core.pick(core.prompt_from_tokens(tokens), candidates, now, pinned=pinned)
    assert core.commit(request_id, decision, now)
    core.first_token(request_id)
    if core.params.use_kv_events:
        engine_stores(core, decision.replica, tokens)
    assert core.finish(request_id)
    return decision


@pytest.mark.parametrize("use_kv_events", [True, False])
def test_golden_router_decisions(use_kv_events):
    """Reference §A.11 on two workers, B = 8: prefix length wins, then the smaller tree."""
    core = KvRouterCore(KvRouterParams(block_size=B, use_kv_events=use_kv_events), random.Random(0))
    workers = [Candidate(WA), Candidate(WB)]
    serve(core, "1", "AB", workers, 0.0, pinned=WA)
    serve(core, "2", "ACD", workers, 1.0, pinned=WA)
    serve(core, "3", "ACE", workers, 2.0, pinned=WB)
    fourth = serve(core, "4", "ACDF", workers, 3.0)
    assert (fourth.replica, fourth.overlap_blocks, fourth.reason) == (WA, 3, PickReason.LOWEST_COST)
    fifth = serve(core, "5", "ACG", workers, 4.0)
    assert (fifth.replica, fifth.reason) == (WB, PickReason.TIE_SMALLEST_TREE)
    assert {s.replica: s.tree_size for s in fifth.scores} == {WA: 5, WB: 3}
    assert (core.index.tree_size(WA), core.index.tree_size(WB)) == (5, 4)


@pytest.mark.parametrize(
    "active_blocks, prefill_tokens, expected",
    [(True, True, WB), (False, True, WA), (True, False, WA), (False, False, WA)],
)
def test_load_tracking_flags_change_the_pick(active_blocks, prefill_tokens, expected):
    """A holds ABC cached and is busy prefilling DE (2 uncached blocks); the prompt is ABCF, B = 8.
    Cost = prefill blocks + decode blocks: A = (2 + 1) + (2 + 4) = 9, B = 4 + 4 = 8, so the load sends it to
    B. Without prefill tracking A = 1 + 6 = 7, without active-block tracking A = 3 + 4 = 7: the cache wins."""
    params = KvRouterParams(
        block_size=B, router_track_active_blocks=active_blocks, router_track_prefill_tokens=prefill_tokens
    )
    core = KvRouterCore(params, random.Random(0))
    workers = [Candidate(WA), Candidate(WB)]
    serve(core, "1", "ABC", workers, 0.0, pinned=WA)
    busy = core.pick(core.prompt_from_tokens(prompt_tokens("D", "E")), workers, 1.0, pinned=WA)
    assert core.commit("busy", busy, 1.0)  # no first token yet: its prompt is still in prefill
    decision = core.pick(core.prompt_from_tokens(prompt_tokens("A", "B", "C", "F")), workers, 2.0)
    assert decision.replica == expected
    assert {s.replica: s.overlap_blocks for s in decision.scores} == {WA: 3, WB: 0}


def test_pinned_replica_is_used_without_rescoring():
    core = KvRouterCore(KvRouterParams(block_size=B), random.Random(0))
    engine_stores(core, WA, prompt_tokens("A", "B"))
    decision = core.pick(
        core.prompt_from_tokens(prompt_tokens("A", "B", "C")), [Candidate(WA), Candidate(WB)], 0.0, pinned=WB
    )
    assert (decision.replica, decision.reason, decision.pin) == (WB, PickReason.PINNED, PinOutcome.HONOURED)
    assert [s.replica for s in decision.scores] == [WB]


@pytest.mark.parametrize("candidates", [[Candidate(WA), Candidate(WB, healthy=False)], [Candidate(WA)]])
def test_unavailable_pin_falls_back_to_healthy_workers(candidates):
    core = KvRouterCore(KvRouterParams(block_size=B), random.Random(0))
    decision = core.pick(core.prompt_from_tokens(prompt_tokens("A")), candidates, 0.0, pinned=WB)
    assert (decision.replica, decision.pin) == (WA, PinOutcome.UNAVAILABLE)


def test_unhealthy_workers_are_never_picked_and_none_left_is_an_error():
    core = KvRouterCore(KvRouterParams(block_size=B, router_temperature=5.0), random.Random(7))
    engine_stores(core, WA, prompt_tokens("A", "B"))
    candidates = [Candidate(WA, healthy=False), Candidate(WB), Candidate(WC)]
    picked = {core.pick(core.prompt_from_tokens(prompt_tokens("A", "B")), candidates, 0.0).replica for _ in range(50)}
    assert picked == {WB, WC}
    with pytest.raises(NoWorkerAvailable):
        core.pick(core.prompt_from_tokens(prompt_tokens("A")), [Candidate(WA, healthy=False)], 0.0)


def test_active_load_outweighs_a_short_cache_hit():
    core = KvRouterCore(KvRouterParams(block_size=B), random.Random(0))
    engine_stores(core, WA, prompt_tokens("A"))
    busy = core.pick(core.prompt_from_tokens(prompt_tokens("X", "Y", "Z", "Q")), [Candidate(WA)], 0.0)
    core.commit("long", busy, 0.0)  # 32 tokens of prefill in flight on a
    decision = core.pick(core.prompt_from_tokens(prompt_tokens("A", "B")), [Candidate(WA), Candidate(WB)], 0.1)
    costs = {s.replica: s.cost for s in decision.scores}
    # a: (32 + 8) / 8 + (4 + 2) = 11 ; b: 16 / 8 + 2 = 4
    assert costs == {WA: pytest.approx(11.0), WB: pytest.approx(4.0)}
    assert decision.replica == WB
    core.first_token("long")  # the prefill is done: only decode blocks stay
    again = core.pick(core.prompt_from_tokens(prompt_tokens("A", "B")), [Candidate(WA), Candidate(WB)], 0.2)
    assert {s.replica: s.cost for s in again.scores}[WA] == pytest.approx(1.0 + 6)


def test_per_request_override():
    core = KvRouterCore(KvRouterParams(block_size=B), random.Random(0))
    engine_stores(core, WA, prompt_tokens("A", "B"))
    prompt = core.prompt_from_tokens(prompt_tokens("A", "B", "C"))
    decision = core.pick(
        prompt, [Candidate(WA), Candidate(WB)], 0.0, override=RouterOverride(kv_overlap_score_weight=0.0)
    )
    assert {s.cost for s in decision.scores} == {3.0}  # decode blocks only: a tie
    assert decision.reason is PickReason.TIE_SMALLEST_TREE and decision.replica == WB


def test_pick_changes_nothing_until_commit():
    core = KvRouterCore(KvRouterParams(block_size=B, use_kv_events=False), random.Random(0))
    prompt = core.prompt_from_tokens(prompt_tokens("A", "B"))
    core.pick(prompt, [Candidate(WA)], 0.0)
    assert core.index.tree_size(WA) == 0 and len(core.load) == 0
    decision = core.pick(prompt, [Candidate(WA)], 0.0)
    assert core.commit("r", decision, 0.0) and not core.commit("r", decision, 0.0)
    assert core.index.tree_size(WA) == 2 and len(core.load) == 1


def test_approximate_mode_forgets_after_the_ttl_and_sweeps():
    core = KvRouterCore(
        KvRouterParams(block_size=B, use_kv_events=False, router_ttl_s=60.0, request_expiry_s=300.0), random.Random(0)
    )
    workers = [Candidate(WA), Candidate(WB)]
    first = serve(core, "1", "AB", workers, 0.0, pinned=WB)
    assert first.replica == WB
    assert serve(core, "2", "ABC", workers, 59.0).replica == WB  # remembered (and refreshed)
    prompt = core.prompt_from_tokens(prompt_tokens("A", "B", "C"))
    late = core.pick(prompt, workers, 118.5)  # refreshed at 59: lives to 119
    assert {s.replica: s.overlap_blocks for s in late.scores} == {WA: 0, WB: 3}
    assert {s.replica: s.overlap_blocks for s in core.pick(prompt, workers, 119.0).scores} == {WA: 0, WB: 0}
    core.commit("stuck", late, 120.0)
    result = core.sweep(420.0)
    assert result.expired_requests == ("stuck",) and len(core.load) == 0


def test_text_prompts_route_by_shared_conversation_prefix():
    core = KvRouterCore(KvRouterParams(block_size=16, use_kv_events=False, text_chunk_chars=64), random.Random(0))
    history = "system: you are a coding agent\n" * 20
    turn1 = core.prompt_from_text(history + "user: fix foo", isl_tokens=160)
    decision = core.pick(turn1, [Candidate(WA)], 0.0)
    core.commit("t1", decision, 0.0)
    core.finish("t1")
    turn2 = core.prompt_from_text(history + "user: fix foo\nassistant: done\nuser: now bar", isl_tokens=175)
    choice = core.pick(turn2, [Candidate(WA), Candidate(WB)], 1.0)
    assert choice.replica == WA
    chosen = choice.chosen
    assert chosen.overlap_blocks == len(turn1.block_hashes)
    # overlap converts to tokens by the prompt's own tokens per character
    assert chosen.cached_tokens == int(
        chosen.overlap_blocks * 64 * 175 / len(history + "user: fix foo\nassistant: done\nuser: now bar")
    )


def test_span_attributes_are_bounded():
    core = KvRouterCore(KvRouterParams(block_size=B), random.Random(0))
    decision = core.pick(
        core.prompt_from_tokens(prompt_tokens("A")), [Candidate(Replica(f"w{i}")) for i in range(20)], 0.0
    )
    attributes = decision.span_attributes()
    assert len(attributes) == 9 and attributes["router.candidates"] == 20
    assert attributes["router.reason"] == "tie_random"


def test_kv_events_are_refused_in_approximate_mode():
    core = KvRouterCore(KvRouterParams(block_size=B, use_kv_events=False), random.Random(0))
    with pytest.raises(RuntimeError):
        engine_stores(core, WA, prompt_tokens("A"))


def test_remove_worker_drops_index_and_load():
    core = KvRouterCore(KvRouterParams(block_size=B), random.Random(0))
    engine_stores(core, WA, prompt_tokens("A", "B"))
    decision = core.pick(core.prompt_from_tokens(prompt_tokens("A", "B")), [Candidate(WA)], 0.0)
    core.commit("r", decision, 0.0)
    assert core.remove_worker(WA) == ["r"]
    assert core.index.tree_size(WA) == 0 and not core.finish("r")
