"""RadixCache.match resuming from an earlier match: always the same nodes as a match from the root."""

import struct

import pytest

from services.simworker.core.radix import RadixCache

PAGE = 2


def _data(tokens):
    return struct.pack(f"<{len(tokens)}I", *tokens)


def _cache(host_pages=0):
    return RadixCache(PAGE, total_pages=16, host_pages=host_pages, emit_events=False)


def _insert(cache, tokens, now=0.0):
    """Compute `tokens` as one request would, then release them (evictable, stamped `now`)."""
    nodes = []
    cache.insert_run(cache.root, _data(tokens), nodes)
    cache.release(nodes, now)
    return nodes


def _same(a, b):
    return [id(n) for n in a[0]] == [id(n) for n in b[0]] and [id(n) for n in a[1]] == [id(n) for n in b[1]]


TOKENS = list(range(1, 13))  # 6 pages


@pytest.mark.parametrize("evicted", [0, 1, 2, 5, 6])
def test_resuming_after_eviction_of_the_deepest_pages_matches_from_the_root(evicted):
    cache = _cache()
    _insert(cache, TOKENS)
    data = _data(TOKENS)
    gpu, host = cache.match(data, 6)
    assert len(gpu) == 6 and not host
    known = (cache.generation, gpu, host)
    assert cache.evict_gpu(evicted) == evicted  # least recently used leaves first: the deepest pages
    resumed = cache.match(data, 6, known)
    assert _same(resumed, cache.match(data, 6))
    assert len(resumed[0]) == 6 - evicted


def test_pages_computed_again_after_eviction_are_the_new_nodes():
    cache = _cache()
    _insert(cache, TOKENS)
    data = _data(TOKENS)
    known = (cache.generation, *cache.match(data, 6))
    old_deepest = known[1][-1]
    cache.evict_gpu(3)
    _insert(cache, TOKENS, now=1.0)  # the evicted pages again, as new nodes under the kept prefix
    resumed = cache.match(data, 6, known)
    assert _same(resumed, cache.match(data, 6)) and len(resumed[0]) == 6
    assert resumed[0][-1] is not old_deepest


@pytest.mark.parametrize("max_pages", [1, 3, 6])
def test_a_shorter_limit_and_a_host_tier(max_pages):
    cache = _cache(host_pages=16)
    _insert(cache, TOKENS)
    data = _data(TOKENS)
    known = (cache.generation, *cache.match(data, 6))
    cache.evict_gpu(4)  # to the host tier: the pages stay in the tree, host only
    resumed = cache.match(data, max_pages, known)
    assert _same(resumed, cache.match(data, max_pages))
    assert len(resumed[0]) + len(resumed[1]) == max_pages


class _Node:
    def __init__(self, ref):
        self.ref = ref


@pytest.mark.parametrize("refs", [[], [0], [1], [0, 0, 1, 0], [1, 1, 0, 0, 0], [2, 0, 1, 0, 0, 0, 3]])
@pytest.mark.parametrize("limit", [-2, -1, 0, 1, 2, 3, 10])
def test_counting_unreferenced_pages_stops_early_with_the_same_answer(refs, limit):
    from services.simworker.core.engine import _more_unreferenced

    nodes = [_Node(ref) for ref in refs]
    assert _more_unreferenced(nodes, limit) == (sum(1 for n in nodes if n.ref == 0) > limit)
