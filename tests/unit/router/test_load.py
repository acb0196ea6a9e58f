import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.router.core.load import ActiveLoad, ReplicaLoad
from services.router.core.types import Replica

A, W = Replica("a"), Replica("w")
B = 4


def tracker(track_output_blocks=False, expiry_s=300.0, **tracking):
    return ActiveLoad(block_size=B, track_output_blocks=track_output_blocks, request_expiry_s=expiry_s, **tracking)


@pytest.mark.parametrize(
    "tracking, load_a, potential_a",
    [
        # One request on A: 6 uncached prompt tokens still in prefill, 3 prompt blocks. The new prompt: one
        # block (4 tokens) nothing holds.
        ({}, ReplicaLoad(1, 6, 3), (6 + 4, 3 + 1)),
        ({"track_active_blocks": False}, ReplicaLoad(1, 6, 0), (6 + 4, 1)),
        ({"track_prefill_tokens": False}, ReplicaLoad(1, 0, 3), (4, 3 + 1)),
        ({"track_active_blocks": False, "track_prefill_tokens": False}, ReplicaLoad(1, 0, 0), (4, 1)),
    ],
)
def test_active_block_and_prefill_tracking_switch_their_load_term_off(tracking, load_a, potential_a):
    load = tracker(track_output_blocks=True, **tracking)
    assert load.add_request("r1", A, [1, 2, 3], isl_tokens=14, cached_tokens=8, now=0.0)
    load.observe_output("r1", 8)  # crosses into output blocks: still no decode load without active tracking
    if tracking.get("track_active_blocks", True):
        load_a = ReplicaLoad(load_a.active_requests, load_a.active_prefill_tokens, load_a.active_decode_blocks + 2)
        potential_a = (potential_a[0], potential_a[1] + 2)
    assert load.load(A) == load_a
    assert load.potential(A, [9], isl_tokens=4, cached_tokens=0) == potential_a
    assert load.potential(W, [9], isl_tokens=4, cached_tokens=0) == (4, 1)  # an idle replica: the same either way
    assert load.free("r1") and load.load(A) == ReplicaLoad(0, 0, 0)


def test_prefill_counts_uncached_tokens_until_the_first_token():
    load = tracker()
    assert load.add_request("r1", A, [1, 2, 3], isl_tokens=14, cached_tokens=8, now=0.0)
    assert load.load(A) == ReplicaLoad(active_requests=1, active_prefill_tokens=6, active_decode_blocks=3)
    assert load.mark_prefill_completed("r1")
    assert load.load(A) == ReplicaLoad(1, 0, 3)
    assert not load.mark_prefill_completed("r1")  # only once
    assert load.free("r1")
    assert load.load(A) == ReplicaLoad(0, 0, 0)


def test_completion_is_idempotent_and_duplicate_ids_are_refused():
    load = tracker()
    assert load.add_request("r1", A, [1], 4, 0, now=0.0)
    assert not load.add_request("r1", W, [2], 4, 0, now=0.0)
    assert load.replica_of("r1") == A
    assert load.free("r1")
    assert not load.free("r1")
    assert not load.free("never-seen")
    assert not load.mark_prefill_completed("r1")
    assert len(load) == 0


def test_free_before_first_token_removes_the_prefill_too():
    load = tracker()
    load.add_request("r1", A, [1, 2], 8, 0, now=0.0)
    load.free("r1")
    assert load.load(A) == ReplicaLoad(0, 0, 0)


def test_shared_prompt_blocks_count_once():
    load = tracker()
    load.add_request("r1", A, [1, 2, 3], 12, 0, now=0.0)
    load.add_request("r2", A, [1, 2, 4], 12, 8, now=0.0)
    assert load.load(A) == ReplicaLoad(2, 12 + 4, 4)
    load.free("r1")
    assert load.load(A).active_decode_blocks == 3


@pytest.mark.parametrize(
    "blocks, isl, cached, expected",
    [
        ([1, 2, 3], 12, 0, (5 + 12, 3 + 1)),  # 1,2 already active on A: only 3 is new
        ([7, 8], 8, 8, (5 + 0, 3 + 2)),
        ([], 3, 0, (5 + 3, 3)),
    ],
)
def test_potential_load_of_a_new_prompt(blocks, isl, cached, expected):
    load = tracker()
    load.add_request("r1", A, [1, 2, 5], 9, 4, now=0.0)  # prefill 5 tokens, 3 blocks
    assert load.potential(A, blocks, isl, cached) == expected


def test_unknown_replica_has_only_the_new_prompt():
    assert tracker().potential(W, [1, 2], 10, 4) == (6, 2)


def test_output_blocks_are_counted_only_when_tracked():
    off = tracker(track_output_blocks=False)
    off.add_request("r1", A, [1, 2], 8, 0, now=0.0)
    off.observe_output("r1", 9)
    assert off.load(A).active_decode_blocks == 2

    on = tracker(track_output_blocks=True)
    on.add_request("r1", A, [1, 2], 10, 0, now=0.0)  # ceil(10/4) = 3 blocks incl. the partial tail
    on.observe_output("r1", 2)  # 12 tokens: still 3
    assert on.load(A).active_decode_blocks == 2
    on.observe_output("r1", 3)  # 13 tokens: 4th block
    assert on.load(A).active_decode_blocks == 3
    on.observe_output("r1", 1)  # counts are cumulative; stale values ignored
    assert on.load(A).active_decode_blocks == 3
    on.free("r1")
    assert on.load(A) == ReplicaLoad(0, 0, 0)


def test_expected_output_length_decays_exclusive_blocks():
    load = tracker(track_output_blocks=True)
    load.add_request("shared", A, [1, 2], 8, 0, now=0.0)
    load.add_request("r", A, [1, 2, 3, 4], 16, 0, now=0.0, expected_output_tokens=8)
    assert load.load(A).active_decode_blocks == 4
    load.observe_output("r", 4)  # 1 output block; fraction 1 - 4/8 = 0.5
    # shared blocks 1,2 count fully; r's own blocks 3,4 and its output block count half
    assert load.load(A).active_decode_blocks == round(2 + 0.5 * 3)
    load.observe_output("r", 8)  # 2 output blocks; fraction 0
    assert load.load(A).active_decode_blocks == 2
    load.free("shared")  # blocks 1,2 become r's alone: they decay too
    assert load.load(A).active_decode_blocks == 0


def test_stale_requests_expire():
    load = tracker(expiry_s=300.0)
    load.add_request("old", A, [1], 4, 0, now=0.0)
    load.add_request("new", A, [2], 4, 0, now=200.0)
    assert load.expire(299.0) == []
    assert load.expire(300.0) == ["old"]
    assert load.load(A).active_requests == 1


def test_remove_worker_drops_its_requests():
    load = tracker()
    load.add_request("r1", A, [1], 4, 0, now=0.0)
    load.add_request("r2", W, [1], 4, 0, now=0.0)
    assert load.remove_worker(A) == ["r1"]
    assert not load.free("r1")
    assert load.load(W).active_requests == 1


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "first", "out", "free"]),
        st.integers(0, 5),
        st.lists(st.integers(0, 6), max_size=4),
        st.integers(0, 20),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_load_returns_to_zero_and_never_goes_negative(operations):
    load = ActiveLoad(block_size=B, track_output_blocks=True, request_expiry_s=300.0)
    for kind, n, blocks, tokens in operations:
        rid = f"r{n}"
        replica = A if n % 2 else W
        if kind == "add":
            load.add_request(
                rid,
                replica,
                blocks,
                isl_tokens=tokens,
                cached_tokens=tokens // 2,
                now=0.0,
                expected_output_tokens=tokens or None,
            )
        elif kind == "first":
            load.mark_prefill_completed(rid)
        elif kind == "out":
            load.observe_output(rid, tokens)
        else:
            load.free(rid)
        for r in (A, W):
            snapshot = load.load(r)
            assert snapshot.active_prefill_tokens >= 0 and snapshot.active_decode_blocks >= 0
    for n in range(6):
        load.free(f"r{n}")
    assert load.load(A) == load.load(W) == ReplicaLoad(0, 0, 0)


chains = st.lists(st.sampled_from("XYZPQ"), min_size=0, max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 4), chains), max_size=20), chains)
def test_potential_counts_exactly_the_prompt_blocks_not_yet_active(operations, probe):
    """Prompts are chains (each id names its prefix): the bisection equals the set difference."""
    from services.router.core.hashing import token_block_hashes

    def chain(letters):
        return token_block_hashes([ord(c) for c in letters for _ in range(B)], B)

    load = tracker()
    for add, n, letters in operations:
        if add:
            load.add_request(f"r{n}", A, chain(letters), isl_tokens=4 * len(letters), cached_tokens=0, now=0.0)
        else:
            load.free(f"r{n}")
    prompt = chain(probe)
    state = load._replicas.get(A)
    active = state.blocks if state else set()
    _, decode = load.potential(A, prompt, 0, 0)
    assert decode == load.load(A).active_decode_blocks + len(set(prompt) - active)


def _chain(letters):
    from services.router.core.hashing import token_block_hashes

    return token_block_hashes([ord(c) for c in letters for _ in range(B)], B)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["chain", "list", "first", "out", "free"]),
            st.integers(0, 3),
            st.lists(st.sampled_from("XYZ"), max_size=5),
            st.integers(0, 20),
        ),
        max_size=30,
    ),
    st.lists(st.sampled_from("XYZPQ"), max_size=6),
)
@example([("chain", 1, ["X", "Y"], 4), ("chain", 3, ["X", "Z"], 4), ("free", 1, [], 0)], [])  # shared, freed
@example([("list", 1, ["X", "Y"], 4), ("chain", 3, ["X", "Y"], 4), ("free", 1, [], 0)], [])  # a list is active
@example([("chain", 3, ["X", "Y"], 4), ("list", 1, ["X", "Y"], 4), ("free", 3, [], 0)], ["X"])
@example([("chain", 1, ["X", "Y"], 4), ("chain", 3, ["X", "Y"], 4), ("out", 3, [], 2), ("free", 1, [], 0)], [])
@example([("list", 1, ["X"], 4), ("chain", 3, ["X", "Y"], 4), ("chain", 1, ["Y"], 4), ("free", 1, [], 0)], ["X"])
def test_chains_are_counted_as_the_same_blocks_given_as_lists(operations, probe):
    """`chain=True` (sorted chains, shares found by prefix comparisons) against the plain set
    operations on the same blocks, mixed with requests given as arbitrary lists (which bring the
    set form back while they are active): the same loads (with decaying exclusive blocks),
    potentials, distinct blocks and shared holders."""
    fast = ActiveLoad(block_size=B, track_output_blocks=True, request_expiry_s=300.0)
    plain = ActiveLoad(block_size=B, track_output_blocks=True, request_expiry_s=300.0)
    for kind, n, letters, tokens in operations:
        rid, replica = f"r{n}", (A if n % 2 else W)
        if kind in ("chain", "list"):
            # a list: the chain's ids without its first, repeated: not closed under prefixes
            blocks = _chain(letters) if kind == "chain" else _chain(letters)[1:] * 2
            for load, chain in ((fast, kind == "chain"), (plain, False)):
                load.add_request(
                    rid, replica, blocks, tokens, tokens // 2, 0.0, expected_output_tokens=tokens or None, chain=chain
                )
        else:
            for load in (fast, plain):
                if kind == "first":
                    load.mark_prefill_completed(rid)
                elif kind == "out":
                    load.observe_output(rid, tokens)
                else:
                    load.free(rid)
        for r in (A, W):
            assert fast.load(r) == plain.load(r)
            for prompt in (_chain(probe), _chain(letters)):
                assert fast.potential(r, prompt, 4, 0) == plain.potential(r, prompt, 4, 0)
            states = fast._replicas.get(r), plain._replicas.get(r)
            if states[0] is None or states[1] is None:
                assert states[0] is states[1]
            else:
                assert states[0].distinct_blocks() == len(states[1].blocks)
                if states[0].general:  # the set form, built from the chains when a list came
                    assert (states[0].blocks, states[0].extra) == (states[1].blocks, states[1].extra)
