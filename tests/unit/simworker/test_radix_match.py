"""The run-length prefix tree behaves as one node per page: matches, splits, LRU eviction order."""

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.simworker.core.radix import (
    PageChain,
    RadixCache,
    digest_to_int64,
    extend_chain,
    page_hashes,
    path_pages,
)

PAGE = 2


def _data(tokens):
    return struct.pack(f"<{len(tokens)}I", *tokens)


def _cache(host_pages=0, total_pages=16, emit_events=False):
    return RadixCache(PAGE, total_pages=total_pages, host_pages=host_pages, emit_events=emit_events)


def _insert(cache, tokens, now=0.0):
    """Compute `tokens` as one request would, then release them (evictable, stamped `now`)."""
    last, _ = cache.insert_run(cache.root, _data(tokens))
    cache.release(last, now)
    return last


def _cached(cache, tokens):
    gpu, host = cache.match(_data(tokens), len(tokens) // PAGE)
    return path_pages(gpu), path_pages(host)


TOKENS = list(range(1, 13))  # 6 pages


def test_computed_pages_form_one_node():
    cache = _cache()
    last = _insert(cache, TOKENS)
    assert last.n == 6 and last.parent is cache.root and cache.gpu_pages == cache.evictable_pages == 6


@pytest.mark.parametrize("evicted", [0, 1, 2, 5, 6])
def test_eviction_takes_the_deepest_pages_first(evicted):
    cache = _cache()
    _insert(cache, TOKENS)
    assert cache.evict_gpu(evicted) == evicted
    assert _cached(cache, TOKENS) == (6 - evicted, 0)
    assert cache.gpu_pages == cache.evictable_pages == 6 - evicted
    assert len(cache.cached_hashes()[0]) == 6 - evicted


@pytest.mark.parametrize("max_pages", [1, 3, 5])
def test_a_match_ending_inside_a_run_splits_it(max_pages):
    cache = _cache()
    whole = _insert(cache, TOKENS)
    gpu, host = cache.match(_data(TOKENS), max_pages)
    assert [node.n for node in gpu] == [max_pages] and not host
    assert whole.n == 6 - max_pages and whole.parent is gpu[0]
    # Holding the matched prefix keeps it; the rest stays evictable, deepest first.
    cache.lock(gpu)
    assert cache.evictable_pages == 6 - max_pages
    assert cache.evict_gpu(6) == 6 - max_pages
    cache.release(gpu[-1], 1.0)
    assert _cached(cache, TOKENS) == (max_pages, 0)


def test_divergent_prompts_share_the_common_pages():
    cache = _cache()
    _insert(cache, TOKENS)
    other = TOKENS[:6] + [99, 98, 97, 96]  # 3 common pages, then 2 of its own
    gpu, _ = cache.match(_data(other), 5)
    assert path_pages(gpu) == 3
    cache.lock(gpu)
    last, recomputed = cache.insert_run(gpu[-1], _data(other[6:]))
    assert recomputed == 0 and last.n == 2 and cache.gpu_pages == 8
    cache.release(last, 1.0)
    assert _cached(cache, TOKENS) == (6, 0) and _cached(cache, other) == (5, 0)
    assert cache.evictable_pages == cache.gpu_pages == 8


def test_least_recently_used_run_goes_first_and_whole():
    cache = _cache()
    a, b = TOKENS, [t + 100 for t in TOKENS]
    _insert(cache, a, now=1.0)
    _insert(cache, b, now=2.0)
    assert cache.evict_gpu(7) == 7
    assert _cached(cache, a) == (0, 0) and _cached(cache, b) == (5, 0)


def test_equal_last_access_evicts_page_by_page_in_turn():
    """Per page, the page before an evicted one becomes a leaf behind the other leaves of the
    same last access: two chains released at one instant lose pages alternately."""
    cache = _cache()
    a, b = TOKENS, [t + 100 for t in TOKENS]
    _insert(cache, a, now=1.0)
    _insert(cache, b, now=1.0)
    for evicted in range(1, 12):
        cache.evict_gpu(1)
        assert _cached(cache, a) == (6 - (evicted + 1) // 2, 0)
        assert _cached(cache, b) == (6 - evicted // 2, 0)


def test_pages_computed_again_after_eviction_count_as_recomputed():
    cache = _cache()
    _insert(cache, TOKENS)
    cache.evict_gpu(3)
    gpu, _ = cache.match(_data(TOKENS), 6)
    cache.lock(gpu)
    last, recomputed = cache.insert_run(gpu[-1], _data(TOKENS[6:]))
    assert recomputed == 3 and path_pages(gpu) == 3 and last.end == 6
    cache.release(last, 1.0)


def test_a_host_tier_keeps_one_node_per_page():
    cache = _cache(host_pages=16)
    last = _insert(cache, TOKENS)
    assert last.n == 1 and last.end == 6
    cache.evict_gpu(4)  # to the host tier: the pages stay in the tree, host only
    assert _cached(cache, TOKENS) == (2, 4)


def test_events_name_every_page():
    cache = _cache(emit_events=True)
    _insert(cache, TOKENS)
    stored = cache.drain_events()
    assert [e.block_hashes[0] for e in stored] == [_hash for _hash in _page_hashes(TOKENS)]
    assert [e.parent_block_hash for e in stored] == [None, *_page_hashes(TOKENS)[:-1]]
    cache.evict_gpu(2)
    removed = cache.drain_events()
    assert [e.block_hashes[0] for e in removed] == _page_hashes(TOKENS)[:-3:-1]


def _page_hashes(tokens):
    from services.simworker.core.radix import page_hashes

    return page_hashes(tokens, PAGE)


def test_random_operations_keep_the_counts_consistent():
    """Random prompts over a small alphabet (many shared prefixes and splits), held, extended,
    released and evicted: the page counts always agree with the tree."""
    rng = random.Random(7)
    cache = _cache(total_pages=40)
    held = []
    for step in range(400):
        if held and (rng.random() < 0.4 or len(held) > 4):
            cache.release(held.pop(rng.randrange(len(held))), float(step // 3))
        else:
            tokens = [rng.randrange(3) for _ in range(PAGE * rng.randrange(1, 10))]
            pages = len(tokens) // PAGE
            gpu, _ = cache.match(_data(tokens), pages)
            matched = path_pages(gpu)
            cache.lock(gpu)  # before evicting: the matched pages stay
            parent = gpu[-1] if gpu else cache.root
            if not cache.ensure_free(pages - matched):
                if gpu:
                    cache.release(parent, float(step // 3))
                continue
            last, _ = cache.insert_run(parent, _data(tokens[matched * PAGE :]))
            assert last.end == pages
            held.append(last)
        _check(cache)
    while held:
        cache.release(held.pop(), 1e9)
    _check(cache)
    assert cache.evictable_pages == cache.gpu_pages
    pages = cache.gpu_pages
    assert cache.evict_gpu(pages) == pages and not cache.root.children


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000))
def test_evicting_runs_at_once_equals_evicting_page_by_page(seed):
    """The same operations on a tree without events (runs of pages evicted at once, a parent that
    becomes the oldest leaf taken without a trip through the heap) and on one with events (one
    page at a time): after each eviction the same pages are left, the same counts. Few distinct
    release times, so that many leaves tie."""
    rng = random.Random(seed)
    fast, reference = _cache(total_pages=40), _cache(total_pages=40, emit_events=True)
    held: list[tuple] = []
    for step in range(150):
        if held and (rng.random() < 0.4 or len(held) > 4):
            pair = held.pop(rng.randrange(len(held)))
            now = float(rng.randrange(3) + step // 20)
            for cache, last in zip((fast, reference), pair):
                cache.release(last, now)
        elif rng.random() < 0.2:
            pages = rng.randrange(1, 12)
            assert fast.evict_gpu(pages) == reference.evict_gpu(pages)
        else:
            tokens = [rng.randrange(3) for _ in range(PAGE * rng.randrange(1, 10))]
            pages = len(tokens) // PAGE
            pair = []
            for cache in (fast, reference):
                gpu, _ = cache.match(_data(tokens), pages)
                matched = path_pages(gpu)
                cache.lock(gpu)
                parent = gpu[-1] if gpu else cache.root
                if not cache.ensure_free(pages - matched):
                    pair.append(None)
                    if gpu:
                        cache.release(parent, 0.0)
                    continue
                pair.append(cache.insert_run(parent, _data(tokens[matched * PAGE :]))[0])
            assert (pair[0] is None) == (pair[1] is None)
            if pair[0] is not None:
                held.append(tuple(pair))
        assert fast.cached_hashes() == reference.cached_hashes()
        assert (fast.gpu_pages, fast.evictable_pages, fast.evicted_pages_total) == (
            reference.gpu_pages,
            reference.evictable_pages,
            reference.evicted_pages_total,
        )


def _check(cache):
    gpu_pages = evictable = 0
    stack = [(cache.root, 0)]
    while stack:
        node, depth = stack.pop()
        for key, child in node.children.items():
            assert key == child.key[: 4 * PAGE] and child.parent is node
            assert child.end == depth + child.n and len(child.digests) == child.n >= 1
            assert child.on_gpu
            gpu_pages += child.n
            evictable += child.n if child.ref == 0 else 0
            assert child.ref <= node.ref or node is cache.root
            stack.append((child, child.end))
        assert node.gpu_children == len(node.children)
    assert gpu_pages == cache.gpu_pages == len(cache.cached_hashes()[0])
    assert evictable == cache.evictable_pages


class _Node:
    def __init__(self, ref, n=1):
        self.ref = ref
        self.n = n


@pytest.mark.parametrize("refs", [[], [0], [1], [0, 0, 1, 0], [1, 1, 0, 0, 0], [2, 0, 1, 0, 0, 0, 3]])
@pytest.mark.parametrize("pages", [1, 3])
@pytest.mark.parametrize("limit", [-2, -1, 0, 1, 2, 3, 10])
def test_counting_unreferenced_pages_stops_early_with_the_same_answer(refs, pages, limit):
    from services.simworker.core.engine import _more_unreferenced

    nodes = [_Node(ref, pages) for ref in refs]
    assert _more_unreferenced(nodes, limit) == (sum(n.n for n in nodes if n.ref == 0) > limit)


@pytest.mark.parametrize("seed", range(6))
def test_pages_computed_again_after_eviction_have_their_chain_hashes(seed):
    """Every page's hash is the SHA-256 chain of its tokens (page_hashes), however the pages
    were evicted, split and computed again."""
    rng = random.Random(seed)
    cache = _cache(total_pages=10)
    prompts = [[rng.randrange(1, 6) for _ in range(PAGE * rng.randrange(1, 9))] for _ in range(5)]
    for step in range(60):
        tokens = prompts[rng.randrange(len(prompts))]
        gpu, _ = cache.match(_data(tokens), len(tokens) // PAGE)
        cached = path_pages(gpu)
        cache.lock(gpu)
        cache.ensure_free(len(tokens) // PAGE - cached)
        parent = gpu[-1] if gpu else cache.root
        last, _ = cache.insert_run(parent, _data(tokens[cached * PAGE :]))
        cache.release(last, float(step))
        path, node = [], last
        while node is not cache.root:
            path[:0] = node.digests
            node = node.parent
        assert [struct.unpack(">q", d[:8])[0] for d in path] == page_hashes(tokens, PAGE)
        cache.evict_gpu(rng.randrange(0, 6))


def _count_page_by_page(computed, order, computed_max, hashes):
    """The memory of computed pages, the plain way: one page at a time, the oldest forgotten
    past the bound."""
    recomputed = 0
    for page_hash in hashes:
        if page_hash in computed:
            recomputed += 1
        else:
            computed.add(page_hash)
            order.append(page_hash)
            if len(order) > computed_max:
                computed.discard(order.popleft())
    return recomputed


@given(
    st.integers(1, 12),
    st.lists(st.lists(st.integers(0, 20), max_size=14), max_size=25),
)
@settings(max_examples=300, deadline=None)
def test_the_bulk_memory_of_computed_pages_equals_the_page_by_page_one(computed_max, batches):
    """Small bounds and ids from a small range: repeats within a batch, hits on the pages about
    to be forgotten, batches longer than the bound."""
    from collections import deque

    cache = _cache()
    cache._computed_max = computed_max
    computed, order = set(), deque()
    for hashes in batches:
        assert cache._count_computed(hashes) == _count_page_by_page(computed, order, computed_max, hashes)
        assert cache._computed == computed and list(cache._computed_order) == list(order)


@pytest.mark.parametrize("host_pages", [0, 16])
@pytest.mark.parametrize("chain_pages", [0, 2, 4, 6])
def test_a_given_chain_names_the_pages_as_hashing_them_does(host_pages, chain_pages):
    """The pages within the first `chain_pages` of a request's `PageChain` take its digests (the
    same objects, not hashed again); the others are hashed; the tree, the events and the
    recompute counts are the same."""
    full = extend_chain(PageChain([], []), _data(TOKENS), 4 * PAGE, 0)
    results = []
    for supplied in (None, full):
        cache = _cache(host_pages=host_pages, emit_events=True)
        last, _ = cache.insert_run(cache.root, _data(TOKENS[:4]), supplied, chain_pages)  # pages 0-1
        cache.release(last, 0.0)
        cache.evict_gpu(1 if host_pages else 2)
        gpu, _ = cache.match(_data(TOKENS), 6)  # with a host tier, page 1 is host only: computed again
        cache.lock(gpu)
        parent = gpu[-1] if gpu else cache.root
        last, recomputed = cache.insert_run(parent, _data(TOKENS)[4 * PAGE * parent.end :], supplied, chain_pages)
        digests = []
        node = last
        while node is not cache.root:
            digests[:0] = node.digests
            node = node.parent
        results.append((recomputed, cache.drain_events(), cache.cached_hashes(), digests))
        if supplied is not None:
            assert all((a is b) == (i < chain_pages) for i, (a, b) in enumerate(zip(digests, full.digests)))
    assert results[0] == results[1]
    assert results[0][3] == full.digests


def test_a_chain_that_does_not_continue_the_path_is_not_used():
    cache = _cache()
    other = extend_chain(PageChain([], []), _data([99, 98, *TOKENS[2:]]), 4 * PAGE, 0)
    first, _ = cache.insert_run(cache.root, _data(TOKENS[:2]))
    last, _ = cache.insert_run(first, _data(TOKENS[2:]), other, 6)  # its page 0 is not `first`
    assert [digest_to_int64(d) for d in first.digests + last.digests] == page_hashes(TOKENS, PAGE)


def test_extending_a_chain_grows_it_in_place_only_past_what_it_held():
    data = _data(TOKENS)
    chain = extend_chain(PageChain([], []), data[: 8 * PAGE], 4 * PAGE, 0)  # pages 0-1
    digests = list(chain.digests)
    grown = extend_chain(chain, data, 4 * PAGE, 2)
    assert grown is chain and [digest_to_int64(d) for d in grown.digests] == page_hashes(TOKENS, PAGE)
    other = _data([*TOKENS[:6], 99, 99])
    forked = extend_chain(grown, other, 4 * PAGE, 3)
    assert forked is not grown and forked.hashes == page_hashes([*TOKENS[:6], 99, 99], PAGE)
    assert grown.digests[:2] == digests and len(grown.digests) == 6  # the holder's pages are untouched
