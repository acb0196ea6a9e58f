"""Paged KV pool with a radix prefix cache over full pages and an optional HiCache host tier.

Model (what it keeps and why):

* The GPU pool has `total_pages` pages of `page_size` tokens. A page is either a node of the
  prefix tree (a *full* page, shareable, like SGLang with page_size > 1) or the private,
  partially filled tail page of one request (never shared). `private_pages` counts the tails.
* The model is a tree of full pages, each keyed by its token bytes (4-byte little-endian ids)
  under its parent. A page lives on the GPU, on the host tier, or both. Invariants: a GPU
  page's parent is on the GPU; a host-only page's parent is on the GPU or the host; a page
  with neither copy is removed (with its subtree).
* Stored run-length, as SGLang's radix tree: a node holds a run of consecutive pages whose
  state is the same (references, last access, copies, hits) and is split where a match or an
  insert ends inside it. Every operation behaves as on one node per page, in the same order;
  only the walks take a step per run. With a host tier every node is one page.
* `ref` counts the requests holding a page. Unreferenced GPU pages are *evictable*; eviction
  is LRU over GPU leaves (pages with no GPU child), so a prefix is evicted from its end, as in
  SGLang's radix cache. A lazy heap keyed by (last access, tick) finds the victim; stale
  entries are skipped when popped. Pages of equal last access go in the order they became
  leaves: a run loses its pages together unless another leaf has its stamp, and then in turn.
* Host tier (HiCache): `write_back` copies a page to the host when it leaves the GPU;
  `write_through` copies every page when it is computed (the host mirrors the GPU, and host
  capacity counts both); `write_through_selective` copies a page once it has been hit twice
  (SGLang's write-through threshold of 2). Only host-only pages (not also on the GPU) are
  evicted from the host, LRU over host leaves; when the host has no room a copy is skipped.
* Every change emits SGLang-shaped KV events: `BlockStored` per page (medium "GPU" or
  "CPU_PINNED"), `BlockRemoved` per page, `AllBlocksCleared` on flush.

Page hash (SGLang's newer rule, `sglang/srt/mem_cache/utils.py`): a SHA-256 chain per page,
``digest_i = sha256(digest_{i-1} || token ids as 4-byte little-endian u32)`` with no prefix for
the first page, published as the first 8 bytes of the digest read big-endian as a signed
int64 (= SGLang's first 16 hex characters as int64). `page_hashes` computes the same values
from token ids for the router. A request may bring its prompt's `PageChain` (the simulator's
conversations extend one per program): its pages' digests are then taken from it, not hashed.
"""

from __future__ import annotations

import hashlib
import heapq
import struct
import sys
from array import array
from collections import deque
from itertools import islice, repeat, starmap
from typing import Iterable, NamedTuple, Sequence

from services.common.sglang.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

GPU = "GPU"
HOST = "CPU_PINNED"
_SELECTIVE_THRESHOLD = 2


def token_bytes(token_ids: Iterable[int]) -> bytes:
    """Token ids as consecutive 4-byte little-endian unsigned ints (the hashed representation)."""
    arr = array("I", token_ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def chain_digest(parent_digest: bytes, page: bytes) -> bytes:
    """SHA-256 of the parent page's digest (empty for the first page) and this page's bytes."""
    return hashlib.sha256(parent_digest + page).digest()


def chain_digests(parent_digest: bytes, data: bytes | memoryview, start: int, stop: int, width: int) -> list[bytes]:
    """The chained digests of the `width`-byte pages of `data[start:stop]`, continuing `parent_digest`
    (`chain_digest` page by page, in one loop)."""
    sha256 = hashlib.sha256
    out: list[bytes] = []
    append = out.append
    digest = parent_digest
    for offset in range(start, stop - width + 1, width):
        digest = sha256(digest + data[offset : offset + width]).digest()
        append(digest)
    return out


_INT64_BE = struct.Struct(">q").unpack_from


def digest_to_int64(digest: bytes) -> int:
    """First 8 bytes of the digest, big-endian, as a signed int64."""
    return _INT64_BE(digest)[0]


_DIGEST_INT64S = 256 // 64


def published_hashes(digests: Sequence[bytes]) -> array:
    """`digest_to_int64` of each digest, in one pass over their bytes (native int64s, byte-swapped
    on little-endian machines to read big-endian, then every fourth: each digest's first 8 bytes)."""
    words = array("q", b"".join(digests))
    if sys.byteorder == "little":
        words.byteswap()
    return words[::_DIGEST_INT64S]


class PageChain(NamedTuple):
    """The chain of a token sequence's complete pages, page by page from the first: each page's
    digest (`chain_digest` of its parent's and its bytes) and its published hash
    (`digest_to_int64`). A caller that already has it (the simulator extends one per program,
    turn by turn) gives it with a request, and the cache takes a computed page's digest from it
    instead of hashing the page again."""

    digests: list[bytes]
    hashes: list[int]


def extend_chain(chain: PageChain, data: bytes | memoryview, width: int, known_pages: int) -> PageChain:
    """The chain of the complete `width`-byte pages of `data` whose first `known_pages` pages are
    those of `chain` (the rest is hashed, continuing from the last of them). When they are all of
    `chain`, its lists grow in place (pages are only ever added after what a holder of the chain
    has seen; a caller that gave the chain away bounds it, as the engine does); else new lists
    are made."""
    if known_pages == len(chain.digests):
        digests, hashes = chain
    else:
        digests, hashes = chain.digests[:known_pages], chain.hashes[:known_pages]
    new = chain_digests(digests[-1] if digests else b"", data, known_pages * width, len(data), width)
    if new:
        digests += new
        hashes += published_hashes(new).tolist()
    return chain if digests is chain.digests else PageChain(digests, hashes)


def page_hashes(token_ids: Sequence[int], page_size: int) -> list[int]:
    """Published hashes of the full pages of `token_ids` (the partial tail is not hashed)."""
    data = token_bytes(token_ids)
    width = 4 * page_size
    return [digest_to_int64(d) for d in chain_digests(b"", data, 0, (len(token_ids) // page_size) * width, width)]


class PageNode:
    """A run of consecutive full pages (`n` >= 1) whose per-page state is uniform: the same
    references, last access, copies and hits. Each page keeps its own chain digest; the node's
    `key` starts with its pages' token bytes (it may run longer after eviction took pages from
    its end: only the first `n` pages count)."""

    __slots__ = (
        "parent",
        "key",
        "n",
        "end",
        "children",
        "digests",
        "ref",
        "last_access",
        "on_gpu",
        "on_host",
        "gpu_children",
        "host_children",
        "hits",
    )

    def __init__(self, parent: PageNode | None, key: bytes, digests: list[bytes], end: int) -> None:
        # None only for the root, whose parent is never read (the root is never stored, written or evicted);
        # typed as a node so the hot paths need no None checks.
        self.parent: PageNode = parent  # type: ignore[assignment]
        self.key = key
        self.n = len(digests)
        self.end = end  # pages from the root through this node's last page: names its last page
        self.children: dict[bytes, PageNode] = {}  # keyed by the child's first page
        self.digests = digests
        self.ref = 0
        self.last_access = 0.0
        self.on_gpu = False
        self.on_host = False
        self.gpu_children = 0  # children on the GPU (of the last page: the others' child is the next page)
        self.host_children = 0
        self.hits = 0

    @property
    def digest(self) -> bytes:
        """The last page's chain digest (empty for the root)."""
        return self.digests[-1] if self.digests else b""

    @property
    def hash(self) -> int:
        """The last page's published hash (0 for the root)."""
        return _INT64_BE(self.digests[-1])[0] if self.digests else 0


def path_pages(nodes: Sequence[PageNode]) -> int:
    """Pages in a sequence of nodes."""
    return sum(node.n for node in nodes)


class RadixCache:
    """The prefix tree with run-length nodes (as SGLang's radix tree): a node holds a run of
    pages and is split where a match or an insert diverges inside it, so that every page of a
    node always has the same state. The observable behaviour is that of one node per page:
    the same matches, the same LRU order of eviction page by page (ties by the order pages
    became evictable leaves), the same events; only the walks take a step per run instead of
    per page. With a host tier every node is one page (pages move between tiers one by one)."""

    def __init__(
        self,
        page_size: int,
        total_pages: int,
        host_pages: int = 0,
        write_policy: str = "write_through",
        computed_memory_pages: int = 0,
        emit_events: bool = True,
    ) -> None:
        self.page_size = page_size
        self.total_pages = total_pages
        self.host_pages = host_pages
        self.write_policy = write_policy
        self.root = PageNode(None, b"", [], 0)
        self.root.on_gpu = True
        self.root.ref = 1  # never evicted
        self.gpu_pages = 0  # tree pages on the GPU
        self.private_pages = 0  # request tail pages
        self.evictable_pages = 0  # GPU pages with ref == 0
        self.host_used = 0
        self.events: list[KvEvent] = []
        self.emit_events = emit_events  # False: nobody subscribes, skip building events
        # Heap entries (last access, tick, node, node.end when pushed): an entry names the node's
        # last page then; it is stale once that page is gone or the node is no evictable leaf.
        self._gpu_heap: list[tuple[float, int, PageNode, int]] = []
        self._host_heap: list[tuple[float, int, PageNode, int]] = []
        self._tick = 0
        # Bounded memory of page hashes ever computed here, to tell recompute from first compute.
        self._computed: set[int] = set()
        self._computed_order: deque[int] = deque()  # oldest first, to forget beyond the bound
        self._computed_max = max(65_536, computed_memory_pages or 2 * (total_pages + host_pages))
        self.evicted_pages_total = 0
        self._width = 4 * page_size
        self._ids_of = struct.Struct(f"<{page_size}I").unpack  # page bytes -> token ids
        self.generation = 0  # bumped by flush: earlier matches are void

    # -- accounting --------------------------------------------------------------------------

    @property
    def free_pages(self) -> int:
        return self.total_pages - self.gpu_pages - self.private_pages

    @property
    def available_pages(self) -> int:
        return self.free_pages + self.evictable_pages

    # -- lookup and locking ------------------------------------------------------------------

    def _common_pages(self, node: PageNode, data: bytes, pos: int, limit: int) -> int:
        """Pages of `node` that `data[pos:limit]` continues with, given that its first page does."""
        width = self._width
        klen = node.n * width
        if pos + klen <= limit:
            key = node.key
            if data.startswith(key if len(key) == klen else memoryview(key)[:klen], pos):
                return node.n
        key = node.key
        upto = min(klen, limit - pos)
        m = width
        while m < upto and data[pos + m : pos + m + width] == key[m : m + width]:
            m += width
        return m // width

    def _split(self, node: PageNode, pages: int) -> PageNode:
        """Split `node` after its first `pages` pages; returns the new node holding them (the
        parent of `node`, which keeps the rest and its identity: heap entries name its last page)."""
        width = self._width
        cut = pages * width
        key = node.key
        head = PageNode(node.parent, key[:cut], node.digests[:pages], node.end - node.n + pages)
        head.ref = node.ref
        head.last_access = node.last_access
        head.on_gpu = node.on_gpu
        head.on_host = node.on_host
        head.hits = node.hits
        head.gpu_children = 1 if node.on_gpu else 0
        head.host_children = 1 if node.on_host else 0
        node.parent.children[key[:width]] = head
        node.key = key[cut : node.n * width]
        del node.digests[:pages]
        node.n -= pages
        node.parent = head
        head.children[node.key[:width]] = node
        return head

    def match(self, data: bytes, max_pages: int) -> tuple[list[PageNode], list[PageNode]]:
        """Longest cached prefix of `data` (token bytes), at most `max_pages` pages: (GPU nodes,
        then host-only nodes), the last node split where the prefix ends."""
        width = self._width
        node = self.root
        gpu: list[PageNode] = []
        host: list[PageNode] = []
        # GPU pages first: a GPU node's parent is always on the GPU, so the walk can only pass
        # from GPU to host-only pages, never back.
        append = gpu.append
        on_gpu = True
        limit = max_pages * width
        pos = 0
        children = node.children
        while pos < limit:
            child = children.get(data[pos : pos + width])
            if child is None:
                break
            pages = self._common_pages(child, data, pos, limit)
            if pages < child.n:
                child = self._split(child, pages)
            if on_gpu and not child.on_gpu:
                on_gpu = False
                append = host.append
            append(child)
            pos += pages * width
            children = child.children
        return gpu, host

    def lock(self, nodes: Sequence[PageNode], hit: bool = True) -> None:
        """Take a reference on each node; `hit` = a prefix match (counts toward selective writes)."""
        policy_selective = hit and self.write_policy == "write_through_selective" and self.host_pages > 0
        for node in nodes:
            if node.ref == 0 and node.on_gpu:
                self.evictable_pages -= node.n
            node.ref += 1
            if not hit:
                continue
            node.hits += 1
            if policy_selective and node.hits >= _SELECTIVE_THRESHOLD and node.on_gpu and not node.on_host:
                self._write_host(node)

    def release(self, last: PageNode, now: float) -> None:
        """Drop a request's reference on the path from the root to `last` (deepest first)."""
        root = self.root
        node = last
        while node is not root:
            node.ref -= 1
            node.last_access = now
            if node.ref == 0:
                if node.on_gpu:
                    self.evictable_pages += node.n
                    if node.gpu_children == 0:
                        self._push_gpu(node)
                elif node.host_children == 0:
                    self._push_host(node)
            node = node.parent

    def _push_gpu(self, node: PageNode) -> None:
        self._tick += 1
        heapq.heappush(self._gpu_heap, (node.last_access, self._tick, node, node.end))

    def _push_host(self, node: PageNode) -> None:
        self._tick += 1
        heapq.heappush(self._host_heap, (node.last_access, self._tick, node, node.end))

    # -- computing and loading pages ---------------------------------------------------------

    def insert_run(
        self, parent: PageNode, data: bytes, chain: PageChain | None = None, chain_pages: int = 0
    ) -> tuple[PageNode, int]:
        """Record consecutive pages just computed on the GPU (`data` = their token bytes) under
        `parent`, held by the request that computed them (which holds `parent`'s path); the
        caller must have a free page for each (or be turning its private tail into one).
        `chain`, if given, is the `PageChain` of the request's sequence from the root (or of a
        prefix of it): the digests of its first `chain_pages` pages are taken from it, not hashed.
        Returns the deepest node and how many pages were recomputed (computed here before). A
        page already on the GPU (computed twice concurrently: SGLang frees the duplicate at
        insert) is shared. Pages go straight to held, never through the evictable state; the
        new pages form one node (one per page with a host tier)."""
        width = self._width
        recomputed = 0
        pos = 0
        size = len(data)
        while pos < size:
            child = parent.children.get(data[pos : pos + width])
            if child is None:
                break
            pages = self._common_pages(child, data, pos, size)
            if pages < child.n:
                child = self._split(child, pages)
            if child.on_gpu:
                if child.ref == 0:
                    self.evictable_pages -= child.n
                child.ref += 1
                recomputed += child.n
            else:  # a host-only page (one page: host tier), computed again on the GPU
                recomputed += self._computed_now(parent, child)
                if self.host_pages > 0 and self.write_policy == "write_through" and not child.on_host:
                    self._write_host(child)
            parent = child
            pos += pages * width
        if pos == size:
            return parent, recomputed
        if self.host_pages > 0:
            host_copy = self.write_policy == "write_through"
            for start in range(pos, size, width):
                parent, again = self._new_node(parent, data, start, start + width, chain, chain_pages)
                recomputed += again
                if host_copy and not parent.on_host:
                    self._write_host(parent)
            return parent, recomputed
        parent, again = self._new_node(parent, data, pos, size, chain, chain_pages)
        return parent, recomputed + again

    def insert_page(self, parent: PageNode, page: bytes) -> PageNode:
        """`insert_run(parent, page)[0]` for one page that decoding filled (no chain: its tokens
        were generated): a decode step's page, the commonest insert, without the run machinery.
        The general path serves a page already under `parent`, a host tier and KV events."""
        children = parent.children
        if page in children or self.host_pages > 0 or self.emit_events:
            return self.insert_run(parent, page)[0]
        parent_digests = parent.digests
        digest = hashlib.sha256(parent_digests[-1] + page if parent_digests else page).digest()
        # `_count_computed` of the one page, by its page-by-page rule.
        page_hash = _INT64_BE(digest)[0]
        computed = self._computed
        if page_hash not in computed:
            computed.add(page_hash)
            order = self._computed_order
            order.append(page_hash)
            if len(order) > self._computed_max:
                computed.discard(order.popleft())
        node = PageNode(parent, page, [digest], parent.end + 1)
        node.ref = 1
        node.on_gpu = True
        children[page] = node
        parent.gpu_children += 1
        self.gpu_pages += 1
        return node

    def _new_node(
        self, parent: PageNode, data: bytes, start: int, stop: int, chain: PageChain | None = None, chain_pages: int = 0
    ) -> tuple[PageNode, int]:
        """A held GPU node under `parent` for the pages `data[start:stop]`, hashed (or taken from
        the first `chain_pages` of `chain`, which names pages by their depth from the root) and
        counted one by one in order;
        returns it and how many of its pages were computed here before."""
        width = self._width
        first = parent.end  # the depth of the node's first page
        count = (stop - start) // width
        digests: list[bytes] = []
        hashes: Sequence[int] = ()
        known = 0
        if chain is not None:
            known = max(0, min(first + count, chain_pages, len(chain.digests)) - first)
            # The chain must continue the parent's path (it does when it is the request's own).
            if known and first and chain.digests[first - 1] != parent.digest:
                known = 0
            if known:
                digests = chain.digests[first : first + known]
                hashes = chain.hashes[first : first + known]
        if count == 1 and not known:  # one page (a decode step's, or with a host tier): no bulk machinery
            digest = hashlib.sha256(parent.digest + data[start:stop]).digest()
            digests = [digest]
            hashes = (_INT64_BE(digest)[0],)
        elif known < count:
            new = chain_digests(digests[-1] if digests else parent.digest, data, start + known * width, stop, width)
            if known:
                digests += new
                hashes = [*hashes, *published_hashes(new)]
            else:
                digests = new
                hashes = published_hashes(new)
        recomputed = self._count_computed(hashes)
        if self.emit_events:
            parent_hash = parent.hash if parent is not self.root else None
            for page_hash, offset in zip(hashes, range(start, stop, width)):
                self.events.append(
                    BlockStored(
                        (page_hash,), parent_hash, self._ids_of(data[offset : offset + width]), self.page_size, GPU
                    )
                )
                parent_hash = page_hash
        node = PageNode(parent, data[start:stop], digests, parent.end + len(digests))
        node.ref = 1
        node.on_gpu = True
        parent.children[data[start : start + width]] = node
        parent.gpu_children += 1
        self.gpu_pages += node.n
        return node, recomputed

    def _count_computed(self, hashes: Sequence[int]) -> int:
        """Remember pages computed now (in order) in the bounded memory; how many it already had.

        Page by page: a hash already remembered counts, a new one is remembered and, past the
        bound, the oldest is forgotten. In bulk (set operations) when that gives the same answer:
        no page repeats within `hashes` and none of the hashes forgotten meanwhile is one of
        them (it would have been forgotten before being looked up)."""
        computed = self._computed
        order = self._computed_order
        if len(hashes) == 1:  # one page (every decode page): the page-by-page rule, directly
            page_hash = hashes[0]
            if page_hash in computed:
                return 1
            computed.add(page_hash)
            order.append(page_hash)
            if len(order) > self._computed_max:
                computed.discard(order.popleft())
            return 0
        # The pages not computed before, in order: one lookup per page in C (`intersection`),
        # then the few known ones (recomputed pages) filtered out of a small set.
        known = computed.intersection(hashes)
        new = [page_hash for page_hash in hashes if page_hash not in known] if known else hashes
        excess = len(order) + len(new) - self._computed_max  # how many to forget
        if excess <= len(order) and (
            excess <= 0 or len(new) == len(hashes) or set(hashes).isdisjoint(islice(order, excess))
        ):
            before = len(computed)
            computed.update(new)
            if len(computed) - before == len(new):
                order.extend(new)
                if excess > 0:
                    computed.difference_update(starmap(order.popleft, repeat((), excess)))
                return len(hashes) - len(new)
            computed.difference_update(new)  # a page repeats: the page-by-page rule below
        recomputed = 0
        computed_max = self._computed_max
        for page_hash in hashes:
            if page_hash in computed:
                recomputed += 1
            else:
                computed.add(page_hash)
                order.append(page_hash)
                if len(order) > computed_max:
                    computed.discard(order.popleft())
        return recomputed

    def _computed_now(self, parent: PageNode, node: PageNode) -> int:
        """A host-only page computed again on the GPU: held, on the GPU; 1 if computed before."""
        page_hash = node.hash
        recomputed = self._count_computed((page_hash,))
        node.ref += 1
        node.on_gpu = True
        self.gpu_pages += 1
        parent.gpu_children += 1
        if self.emit_events:
            self.events.append(
                BlockStored(
                    (page_hash,),
                    parent.hash if parent is not self.root else None,
                    self._ids_of(node.key[: self._width]),
                    self.page_size,
                    GPU,
                )
            )
        return recomputed

    def load_back(self, node: PageNode) -> None:
        """Copy a host-only page back to the GPU (the caller holds a free page and a ref)."""
        self._to_gpu(node)

    def _to_gpu(self, node: PageNode) -> None:
        node.on_gpu = True
        self.gpu_pages += node.n
        node.parent.gpu_children += 1
        if node.ref == 0:
            self.evictable_pages += node.n
            self._push_gpu(node)
        if self.emit_events:
            self._stored_events(node, GPU)

    def _stored_events(self, node: PageNode, medium: str) -> None:
        parent_hash = node.parent.hash if node.parent is not self.root else None
        width = self._width
        for i, digest in enumerate(node.digests):
            page_hash = _INT64_BE(digest)[0]
            page = node.key[i * width : (i + 1) * width]
            self.events.append(BlockStored((page_hash,), parent_hash, self._ids_of(page), self.page_size, medium))
            parent_hash = page_hash

    def _write_host(self, node: PageNode) -> bool:
        if self.host_used >= self.host_pages and not self._evict_host(1):
            return False  # no room: SGLang skips the backup
        node.on_host = True
        self.host_used += node.n
        node.parent.host_children += 1
        if self.emit_events:
            self._stored_events(node, HOST)
        return True

    # -- eviction ----------------------------------------------------------------------------

    def ensure_free(self, pages: int) -> bool:
        """Evict unreferenced GPU pages until `pages` are free. False if that is impossible."""
        short = pages - self.free_pages
        if short <= 0:
            return True
        if short > self.evictable_pages:
            return False
        self.evict_gpu(short)
        return self.free_pages >= pages

    def evict_gpu(self, pages: int) -> int:
        if self.host_pages > 0 or self.emit_events:
            return self._evict_gpu_general(pages)
        # No host tier and no event subscriber: page-by-page LRU eviction, a run at a time. The
        # popped page's parent (the page before it in the node) becomes an evictable leaf with
        # the same last access and would be pushed and popped next unless another entry has
        # that stamp too: then the node's pages go together, else one page at a time (pushed
        # again behind the entries with its stamp, as a page of its own would be). A node's parent
        # that becomes an evictable leaf older than every entry would be pushed and popped straight
        # back: it is taken next without the trip through the heap.
        done = 0
        heap = self._gpu_heap
        heappop, heappush = heapq.heappop, heapq.heappush
        root = self.root
        tick = self._tick
        width = self._width
        node: PageNode | None = None  # the next leaf, when it skipped the heap
        while done < pages:
            if node is not None:
                stamp, end = node.last_access, node.end
            elif heap:
                stamp, _, node, end = heappop(heap)
                if node.end != end or not node.on_gpu or node.ref or node.gpu_children or node.last_access != stamp:
                    node = None
                    continue  # stale entry
            else:
                break
            n = node.n
            if heap and heap[0][0] <= stamp:
                take = 1
            else:
                take = min(n, pages - done)
            done += take
            if take < n:
                node.n = n - take
                node.end = end - take
                del node.digests[-take:]
                tick += 1
                heappush(heap, (stamp, tick, node, end - take))
                node = None
                continue
            parent = node.parent
            node.on_gpu = False
            parent.gpu_children -= 1
            del parent.children[node.key[:width]]  # no host copy: the node is gone (its subtree
            if node.children:  # can only be host-only, i.e. empty here)
                self._drop_children(node)
            node = None
            if parent is not root and parent.on_gpu and parent.ref == 0 and parent.gpu_children == 0:
                tick += 1
                if done < pages and (not heap or parent.last_access < heap[0][0]):
                    node = parent  # its entry would be the heap's first (the newest tick loses ties)
                else:
                    heappush(heap, (parent.last_access, tick, parent, parent.end))
        self._tick = tick
        self.gpu_pages -= done
        self.evictable_pages -= done
        self.evicted_pages_total += done
        return done

    def _evict_gpu_general(self, pages: int) -> int:
        done = 0
        heap = self._gpu_heap
        while done < pages and heap:
            stamp, _, node, end = heapq.heappop(heap)
            if node.end != end or not node.on_gpu or node.ref or node.gpu_children or node.last_access != stamp:
                continue  # stale entry
            self._evict_one_gpu(node)
            done += 1
        return done

    def _evict_one_gpu(self, node: PageNode) -> None:
        """Evict the node's last page."""
        self.gpu_pages -= 1
        self.evictable_pages -= 1
        self.evicted_pages_total += 1
        if node.n > 1:  # no host tier (its nodes are single pages): the page before becomes the leaf
            digest = node.digests.pop()
            node.n -= 1
            node.end -= 1
            if self.emit_events:
                self.events.append(BlockRemoved((_INT64_BE(digest)[0],), GPU))
            self._push_gpu(node)
            return
        parent = node.parent
        node.on_gpu = False
        parent.gpu_children -= 1
        if self.emit_events:
            self.events.append(BlockRemoved((node.hash,), GPU))
        if self.host_pages > 0 and not node.on_host and self.write_policy == "write_back":
            self._write_host(node)
        if node.on_host:
            if node.host_children == 0:
                self._push_host(node)
        else:
            self._drop(node)
        if parent is not self.root and parent.on_gpu and parent.ref == 0 and parent.gpu_children == 0:
            self._push_gpu(parent)

    def _evict_host(self, pages: int) -> int:
        done = 0
        heap = self._host_heap
        while done < pages and heap:
            stamp, _, node, end = heapq.heappop(heap)
            if (
                node.end != end
                or not node.on_host
                or node.on_gpu
                or node.ref
                or node.host_children
                or node.last_access != stamp
            ):
                continue
            parent = node.parent
            node.on_host = False
            self.host_used -= 1
            parent.host_children -= 1
            if self.emit_events:
                self.events.append(BlockRemoved((node.hash,), HOST))
            self._drop(node)
            if (
                parent is not self.root
                and parent.on_host
                and not parent.on_gpu
                and parent.ref == 0
                and parent.host_children == 0
            ):
                self._push_host(parent)
            done += 1
        return done

    def _drop(self, node: PageNode) -> None:
        """Remove a node that has no copy left, with its (host-only) subtree."""
        del node.parent.children[node.key[: self._width]]
        if node.children:
            self._drop_children(node)

    def _drop_children(self, node: PageNode) -> None:
        stack = list(node.children.values())
        node.children = {}
        while stack:
            child = stack.pop()
            if child.on_host:
                child.on_host = False
                self.host_used -= child.n
                if self.emit_events:
                    for digest in reversed(child.digests):
                        self.events.append(BlockRemoved((_INT64_BE(digest)[0],), HOST))
            stack.extend(child.children.values())
            child.children = {}
        node.host_children = 0

    # -- flush and inspection ----------------------------------------------------------------

    def flush(self) -> None:
        """Drop every page (GPU and host). Only valid when no request holds a node."""
        self.generation += 1
        self.root.children = {}
        self.root.gpu_children = self.root.host_children = 0
        self.gpu_pages = self.evictable_pages = self.host_used = 0
        self._gpu_heap.clear()
        self._host_heap.clear()
        if self.emit_events:
            self.events.append(AllBlocksCleared())

    def drain_events(self) -> tuple[KvEvent, ...]:
        events = tuple(self.events)
        self.events.clear()
        return events

    def cached_hashes(self) -> tuple[set[int], set[int]]:
        """(GPU page hashes, host page hashes) currently held; for tests and debugging."""
        gpu: set[int] = set()
        host: set[int] = set()
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            hashes = [_INT64_BE(digest)[0] for digest in node.digests]
            if node.on_gpu:
                gpu.update(hashes)
            if node.on_host:
                host.update(hashes)
            stack.extend(node.children.values())
        return gpu, host
