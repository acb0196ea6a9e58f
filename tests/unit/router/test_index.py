import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.sglang.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from services.router.core.events import EventOutcome
from services.router.core.hashing import token_block_hashes
from services.router.core.index import KvEventIndex, RoutingHistoryIndex
from services.router.core.types import Replica

B = 4
A, W = Replica("a"), Replica("w", 1)


def tokens(*blocks):
    """Token ids of the given block letters, each B ids derived from its letter."""
    return [ord(b) * 100 + i for b in blocks for i in range(B)]


def query(*blocks):
    return token_block_hashes(tokens(*blocks), B)


def events_index(max_blocks=1000, ratio=0.8):
    return KvEventIndex(block_size=B, max_blocks_per_worker=max_blocks, prune_target_ratio=ratio)


def stored(ext_ids, blocks, parent=None, block_size=B, medium="GPU"):
    return BlockStored(tuple(ext_ids), parent, tuple(tokens(*blocks)), block_size, medium)


# -- event-driven mode ---------------------------------------------------------------------


def test_store_with_parent_chaining_matches_the_query_prefix():
    index = events_index()
    assert index.apply(A, stored([11, 12], "XY")) is EventOutcome.APPLIED
    # one page per event, chained to the parent's engine id, as SGLang publishes them
    assert index.apply(A, stored([13], "Z", parent=12)) is EventOutcome.APPLIED
    assert index.find_matches(query("X", "Y", "Z", "Q")) == {A: 3}
    assert index.find_matches(query("X", "Z")) == {A: 1}  # Z under X is another prefix
    assert index.find_matches(query("Y")) == {}
    assert index.tree_size(A) == 3


def test_engine_ids_are_opaque():
    # Whatever ids the engine uses, matching goes by re-hashed token content.
    index = events_index()
    index.apply(A, stored([-5, 2**62], "XY"))
    assert index.find_matches(query("X", "Y")) == {A: 2}


def test_unknown_parent_is_rejected():
    index = events_index()
    assert index.apply(A, stored([13], "Z", parent=999)) is EventOutcome.PARENT_NOT_FOUND
    assert index.tree_size(A) == 0
    index.apply(W, stored([999], "X"))  # another worker's block is not a's parent
    assert index.apply(A, stored([13], "Z", parent=999)) is EventOutcome.PARENT_NOT_FOUND


@pytest.mark.parametrize(
    "event, outcome",
    [
        (stored([1], "X", block_size=8), EventOutcome.BLOCK_SIZE_MISMATCH),
        (BlockStored((1, 2), None, tuple(tokens("X")), B), EventOutcome.MALFORMED),
        (BlockStored((), None, (), B), EventOutcome.MALFORMED),
        (BlockStored((1,), None, (-1, 0, 0, 0), B), EventOutcome.MALFORMED),
    ],
)
def test_bad_stored_events_are_dropped(event, outcome):
    index = events_index()
    assert index.apply(A, event) is outcome
    assert index.tree_size(A) == 0


def test_remove_ends_the_match_at_the_hole_and_unknown_removals_are_counted():
    index = events_index()
    index.apply(A, stored([1, 2, 3], "XYZ"))
    assert index.apply(A, BlockRemoved((3,))) is EventOutcome.APPLIED
    assert index.find_matches(query("X", "Y", "Z")) == {A: 2}
    assert index.apply(A, BlockRemoved((3,))) is EventOutcome.BLOCK_NOT_FOUND
    index.apply(A, BlockRemoved((1,)))
    assert index.find_matches(query("X", "Y")) == {}  # Y is still held but X is not
    assert index.tree_size(A) == 1


def test_a_block_is_held_while_any_medium_holds_it():
    index = events_index()
    index.apply(A, stored([1], "X"))
    index.apply(A, stored([1], "X", medium="CPU_PINNED"))  # HiCache write-through copy
    index.apply(A, BlockRemoved((1,), "GPU"))  # evicted from GPU, still on host
    assert index.find_matches(query("X")) == {A: 1}
    index.apply(A, BlockRemoved((1,), "CPU_PINNED"))
    assert index.find_matches(query("X")) == {}


def test_cleared_drops_only_that_worker():
    index = events_index()
    index.apply(A, stored([1, 2], "XY"))
    index.apply(W, stored([7], "X"))
    assert index.find_matches(query("X", "Y")) == {A: 2, W: 1}
    assert index.apply(A, AllBlocksCleared()) is EventOutcome.APPLIED
    assert index.find_matches(query("X", "Y")) == {W: 1}
    assert index.apply(A, stored([3], "Z", parent=2)) is EventOutcome.PARENT_NOT_FOUND


def test_remove_worker_drops_its_entries():
    index = events_index()
    index.apply(A, stored([1, 2], "XY"))
    index.apply(W, stored([1, 2], "XY"))
    assert index.remove_worker(A) == 2
    assert index.find_matches(query("X", "Y")) == {W: 2}
    assert index.remove_worker(A) == 0
    assert index.replicas() == [W]


def test_memory_bound_prunes_least_recently_stored_deepest_first():
    index = events_index(max_blocks=4, ratio=0.5)
    index.apply(A, stored([1, 2], "XY"))
    index.apply(A, stored([3, 4], "PQ"))
    index.apply(A, stored([5], "R", parent=4))  # 5 blocks > 4: prune down to 2
    assert index.tree_size(A) == 2
    assert index.pruned_blocks_total == 3
    # the oldest chain went first, deepest block before its prefix: Y, X, then Q
    assert index.find_matches(query("X")) == {}
    assert index.find_matches(query("P", "Q", "R")) == {A: 1}


def test_store_after_prune_of_the_parent_is_rejected_not_misplaced():
    index = events_index(max_blocks=1, ratio=1.0)
    index.apply(A, stored([1], "X"))
    index.apply(A, stored([2], "Y"))  # X pruned
    assert index.apply(A, stored([3], "Z", parent=1)) is EventOutcome.PARENT_NOT_FOUND


# -- approximate mode (routing history with TTL) -------------------------------------------


def history(ttl=10.0, max_blocks=1000, ratio=0.8):
    return RoutingHistoryIndex(ttl_s=ttl, max_blocks_per_worker=max_blocks, prune_target_ratio=ratio)


def test_recorded_decisions_expire_after_the_ttl():
    index = history(ttl=10.0)
    index.record(A, query("X", "Y"), now=100.0)
    assert index.find_matches(query("X", "Y", "Z"), now=109.9) == {A: 2}
    assert index.find_matches(query("X", "Y", "Z"), now=110.0) == {}
    assert index.tree_size(A) == 0
    assert index.expired_blocks_total == 2


def test_re_recording_refreshes_the_ttl():
    index = history(ttl=10.0)
    index.record(A, query("X", "Y"), now=100.0)
    index.record(A, query("X"), now=105.0)
    assert index.find_matches(query("X", "Y"), now=112.0) == {A: 1}  # Y expired at 110, X lives to 115
    assert index.find_matches(query("X"), now=115.0) == {}


def test_history_matches_only_the_replicas_asked_for_and_still_expires_the_others():
    index = history(ttl=10.0)
    index.record(A, query("X", "Y"), now=0.0)
    index.record(W, query("X"), now=5.0)
    assert index.find_matches(query("X", "Y"), now=6.0, replicas=[W]) == {W: 1}
    assert index.find_matches(query("X", "Y"), now=6.0, replicas=[A, Replica("absent", 0)]) == {A: 2}
    assert index.find_matches(query("X", "Y"), now=10.0, replicas=[W]) == {W: 1}
    assert index.tree_size(A) == 0  # expired although not asked for


def test_history_is_per_worker_and_bounded():
    index = history(ttl=100.0, max_blocks=3, ratio=1.0)
    index.record(A, query("X", "Y"), now=0.0)
    index.record(W, query("X"), now=1.0)
    index.record(A, query("P", "Q"), now=2.0)  # 4 > 3: drops Y (oldest, deepest first)
    assert index.find_matches(query("X", "Y"), now=3.0) == {A: 1, W: 1}
    assert index.find_matches(query("P", "Q"), now=3.0) == {A: 2}


def test_expire_returns_count_and_keeps_live_entries():
    index = history(ttl=5.0)
    index.record(A, query("X"), now=0.0)
    index.record(W, query("Y"), now=3.0)
    assert index.expire(5.0) == 1
    assert index.replicas() == [W]


# -- invariants ----------------------------------------------------------------------------

LETTERS = "XYZPQ"
WORKERS = [Replica("a"), Replica("b"), Replica("b", 1)]
chains = st.lists(st.sampled_from(LETTERS), min_size=1, max_size=5)
operation = st.one_of(
    st.tuples(st.just("store"), st.sampled_from(WORKERS), chains),
    st.tuples(st.just("remove"), st.sampled_from(WORKERS), chains),
    st.tuples(st.just("clear"), st.sampled_from(WORKERS), st.just([])),
    st.tuples(st.just("drop"), st.sampled_from(WORKERS), st.just([])),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(operation, max_size=25), chains, st.integers(1, 12))
def test_event_index_invariants(operations, probe, max_blocks):
    index = KvEventIndex(block_size=B, max_blocks_per_worker=max_blocks, prune_target_ratio=0.75)
    removed: set[Replica] = set()
    for kind, worker, blocks in operations:
        hashes = query(*blocks)
        if kind == "store":
            # engine ids = our ids, so removals can name them
            index.apply(worker, BlockStored(tuple(hashes), None, tuple(tokens(*blocks)), B))
            removed.discard(worker)
        elif kind == "remove":
            index.apply(worker, BlockRemoved(tuple(hashes[-1:])))
        elif kind == "clear":
            index.apply(worker, AllBlocksCleared())
        else:
            index.remove_worker(worker)
            removed.add(worker)
        assert index.tree_size(worker) <= max_blocks
    q = query(*probe)
    matches = index.find_matches(q)
    assert all(0 < n <= len(q) for n in matches.values())
    assert not removed & set(matches)
    for worker, n in matches.items():  # a score is a contiguous held prefix
        assert all(index.holds(worker, h) for h in q[:n])
        assert n == len(q) or not index.holds(worker, q[n])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(WORKERS), chains, st.floats(0, 50)), max_size=20), chains, st.floats(0, 100))
def test_history_index_invariants(records, probe, probe_at):
    index = RoutingHistoryIndex(ttl_s=10.0, max_blocks_per_worker=6, prune_target_ratio=0.5)
    now = 0.0
    last_seen: dict[Replica, float] = {}
    for worker, blocks, dt in records:
        now += dt
        index.record(worker, query(*blocks), now)
        last_seen[worker] = now
    now += probe_at
    q = query(*probe)
    matches = index.find_matches(q, now)
    assert all(0 < n <= len(q) for n in matches.values())
    assert all(now < last_seen[w] + 10.0 for w in matches)  # nothing older than the TTL


# -- conformance with the simulated engine's events ----------------------------------------


def test_index_mirrors_the_simworker_cache():
    from services.simworker.core import api as sim
    from services.simworker.core.engine import SimEngine
    from services.simworker.profiles import load_profile

    page = 4
    config = sim.EngineConfig(
        max_total_tokens=160,
        page_size=page,
        context_length=1024,
        enable_hierarchical_cache=True,
        hicache_size_tokens=96,
    )
    engine = SimEngine(config, load_profile())
    index = KvEventIndex(block_size=page, max_blocks_per_worker=10_000, prune_target_ratio=0.8)
    system = list(range(1, 25))
    prompts = [system + [100 + i] * (4 + 4 * (i % 3)) + [7, 7, 7] for i in range(12)]
    now = 0.0
    for i, prompt in enumerate(prompts):
        engine.submit(sim.EngineRequest(f"r{i}", tuple(prompt), max_new_tokens=3, ignore_eos=True), now)
        while engine.has_work():
            result = engine.step(now)
            now += result.duration_s
            for event in result.kv_events:
                translated = (
                    BlockStored(
                        event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size, event.medium
                    )
                    if isinstance(event, BlockStored)
                    else BlockRemoved(event.block_hashes, event.medium)
                    if isinstance(event, BlockRemoved)
                    else AllBlocksCleared()
                )
                assert index.apply(A, translated) is EventOutcome.APPLIED
    gpu, host = engine.cache.cached_hashes()
    held = gpu | host
    assert index.tree_size(A) == len(held)
    for prompt in prompts:
        q = token_block_hashes(prompt, page)
        expected = next((d for d, h in enumerate(q) if h not in held), len(q))
        assert index.find_matches(q).get(A, 0) == expected


class _HistoryModel:
    """The plain definition of the routing history: per replica, block -> expiry in least
    recently recorded order (a record puts its blocks deepest first); LRU pruning; a match is
    the contiguous held prefix."""

    def __init__(self, ttl, max_blocks, ratio):
        from collections import OrderedDict

        self.ttl, self.max_blocks, self.prune_to = ttl, max_blocks, int(max_blocks * ratio)
        self.blocks: dict = {}
        self.OrderedDict = OrderedDict
        self.expired = self.pruned = 0

    def record(self, replica, hashes, now):
        blocks = self.blocks.setdefault(replica, self.OrderedDict())
        for h in reversed(hashes):
            blocks.pop(h, None)
            blocks[h] = now + self.ttl
        if len(blocks) > self.max_blocks:
            while len(blocks) > self.prune_to:
                blocks.popitem(last=False)
                self.pruned += 1

    def find_matches(self, hashes, now):
        for replica in list(self.blocks):
            live = self.OrderedDict((h, e) for h, e in self.blocks[replica].items() if e > now)
            self.expired += len(self.blocks[replica]) - len(live)
            self.blocks[replica] = live
            if not self.blocks[replica]:
                del self.blocks[replica]
        out = {}
        for replica, blocks in self.blocks.items():
            n = 0
            while n < len(hashes) and hashes[n] in blocks:
                n += 1
            if n:
                out[replica] = n
        return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(WORKERS), chains, st.floats(0, 6), st.booleans()), max_size=30),
    st.integers(1, 8),
    st.sampled_from([0.5, 0.75, 1.0]),
)
def test_history_index_equals_its_plain_definition(steps, max_blocks, ratio):
    index = RoutingHistoryIndex(ttl_s=10.0, max_blocks_per_worker=max_blocks, prune_target_ratio=ratio)
    model = _HistoryModel(10.0, max_blocks, ratio)
    now = 0.0
    for worker, blocks, dt, probe in steps:
        now += dt
        hashes = query(*blocks)
        if probe:
            assert index.find_matches(hashes, now) == model.find_matches(hashes, now)
            for w in WORKERS:
                assert index.tree_size(w) == len(model.blocks.get(w, ()))
        else:
            index.record(worker, hashes, now)
            model.record(worker, hashes, now)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(WORKERS), st.integers(0, 3), st.integers(-1, 3), st.floats(0, 6), st.booleans()),
        max_size=40,
    ),
    st.integers(1, 30),
    st.sampled_from([0.5, 0.75, 1.0]),
)
def test_history_index_of_growing_conversations_equals_its_plain_definition(steps, max_blocks, ratio):
    """Agent-like chains: conversations that share a first block and grow every turn (or
    shrink by one: a retried, shorter prompt), so that a record is usually extended by a later
    one (renumbered) and shares its shallow blocks with the other conversations' records."""
    index = RoutingHistoryIndex(ttl_s=10.0, max_blocks_per_worker=max_blocks, prune_target_ratio=ratio)
    model = _HistoryModel(10.0, max_blocks, ratio)
    conversations = [["S", letter] for letter in "ABCD"]
    now = 0.0
    for worker, which, grow, dt, probe in steps:
        now += dt
        blocks = conversations[which]
        if grow < 0 and len(blocks) > 1:
            blocks.pop()
        blocks.extend(LETTERS[(len(blocks) * 7 + which + i) % len(LETTERS)] for i in range(max(grow, 0)))
        hashes = query(*blocks)
        if probe:
            assert index.find_matches(hashes, now) == model.find_matches(hashes, now)
            for w in WORKERS:
                assert index.tree_size(w) == len(model.blocks.get(w, ()))
            assert (index.expired_blocks_total, index.pruned_blocks_total) == (model.expired, model.pruned)
        else:
            index.record(worker, hashes, now)
            model.record(worker, hashes, now)
    assert (index.pruned_blocks_total,) == (model.pruned,)
