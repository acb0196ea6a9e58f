"""Paged KV pool with a radix prefix cache over full pages and an optional HiCache host tier.

Model (what it keeps and why):

* The GPU pool has `total_pages` pages of `page_size` tokens. A page is either a node of the
  prefix tree (a *full* page, shareable, like SGLang with page_size > 1) or the private,
  partially filled tail page of one request (never shared). `private_pages` counts the tails.
* The tree has one node per full page, keyed by the page's token bytes (4-byte little-endian
  ids) under its parent. A node lives on the GPU, on the host tier, or both. Invariants: a GPU
  node's parent is on the GPU; a host-only node's parent is on the GPU or the host; a node with
  neither copy is removed (with its subtree).
* `ref` counts the requests holding a node. Unreferenced GPU nodes are *evictable*; eviction is
  LRU over GPU leaves (nodes with no GPU child), so a prefix is evicted from its end, as in
  SGLang's radix cache. A lazy heap keyed by (last access, tick) finds the victim; stale
  entries are skipped when popped.
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
from token ids for the router.
"""

from __future__ import annotations

import hashlib
import heapq
import struct
import sys
from array import array
from collections import deque
from typing import Iterable, Sequence

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


_INT64_BE = struct.Struct(">q").unpack_from


def digest_to_int64(digest: bytes) -> int:
    """First 8 bytes of the digest, big-endian, as a signed int64."""
    return _INT64_BE(digest)[0]


def page_hashes(token_ids: Sequence[int], page_size: int) -> list[int]:
    """Published hashes of the full pages of `token_ids` (the partial tail is not hashed)."""
    data = token_bytes(token_ids)
    width = 4 * page_size
    out: list[int] = []
    digest = b""
    for start in range(0, (len(token_ids) // page_size) * width, width):
        digest = chain_digest(digest, data[start : start + width])
        out.append(digest_to_int64(digest))
    return out


class PageNode:
    __slots__ = (
        "parent",
        "key",
        "children",
        "digest",
        "hash",
        "ref",
        "last_access",
        "on_gpu",
        "on_host",
        "gpu_children",
        "host_children",
        "hits",
    )

    def __init__(self, parent: PageNode | None, key: bytes, digest: bytes) -> None:
        # None only for the root, whose parent is never read (the root is never stored, written or evicted);
        # typed as a node so the hot paths need no None checks.
        self.parent: PageNode = parent  # type: ignore[assignment]
        self.key = key
        self.children: dict[bytes, PageNode] = {}
        self.digest = digest
        self.hash = _INT64_BE(digest)[0] if digest else 0
        self.ref = 0
        self.last_access = 0.0
        self.on_gpu = False
        self.on_host = False
        self.gpu_children = 0
        self.host_children = 0
        self.hits = 0


class RadixCache:
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
        self.root = PageNode(None, b"", b"")
        self.root.on_gpu = True
        self.root.ref = 1  # never evicted
        self.gpu_pages = 0  # tree nodes on the GPU
        self.private_pages = 0  # request tail pages
        self.evictable_pages = 0  # GPU nodes with ref == 0
        self.host_used = 0
        self.events: list[KvEvent] = []
        self.emit_events = emit_events  # False: nobody subscribes, skip building events
        self._gpu_heap: list[tuple[float, int, PageNode]] = []
        self._host_heap: list[tuple[float, int, PageNode]] = []
        self._tick = 0
        # Bounded memory of page hashes ever computed here, to tell recompute from first compute.
        self._computed: set[int] = set()
        self._computed_order: deque[int] = deque()  # oldest first, to forget beyond the bound
        self._computed_max = max(65_536, computed_memory_pages or 2 * (total_pages + host_pages))
        self.evicted_pages_total = 0
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

    def match(
        self, data: bytes, max_pages: int, known: tuple[int, list[PageNode], list[PageNode]] | None = None
    ) -> tuple[list[PageNode], list[PageNode]]:
        """Longest cached prefix of `data` (token bytes): (GPU nodes, then host-only nodes).

        `known` = (generation, gpu, host) from an earlier match of the same data: when it had
        no host part, matching resumes after the part of its GPU pages still cached instead of
        from the root (a request blocked at the head of the queue is matched again every step,
        and loses its deepest cached pages to eviction meanwhile)."""
        width = 4 * self.page_size
        node = self.root
        gpu: list[PageNode] = []
        host: list[PageNode] = []
        first = 0
        if known is not None and known[0] == self.generation and not known[2] and known[1]:
            # Dropped subtrees lose their children dicts, so an attached GPU node implies its
            # whole path is still cached on the GPU: what is left of the earlier match is a
            # prefix of it (eviction takes its deepest pages first while the request waits),
            # found by bisection.
            path = known[1]
            lo, hi = 0, min(len(path), max_pages)
            deepest = path[hi - 1]
            if deepest.on_gpu and deepest.parent.children.get(deepest.key) is deepest:
                lo = hi  # all of it (the common case: one check)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                deepest = path[mid - 1]
                if deepest.on_gpu and deepest.parent.children.get(deepest.key) is deepest:
                    lo = mid
                else:
                    hi = mid - 1
            if lo:
                gpu = path[:lo]
                node = gpu[-1]
                first = lo
        # GPU pages first: a GPU node's parent is always on the GPU, so the walk can only pass
        # from GPU to host-only pages, never back.
        append = gpu.append
        on_gpu = True
        for start in range(first * width, max_pages * width, width):
            child = node.children.get(data[start : start + width])
            if child is None:
                break
            if on_gpu and not child.on_gpu:
                on_gpu = False
                append = host.append
            append(child)
            node = child
        return gpu, host

    def lock(self, nodes: Sequence[PageNode], hit: bool = True) -> None:
        """Take a reference on each node; `hit` = a prefix match (counts toward selective writes)."""
        policy_selective = hit and self.write_policy == "write_through_selective" and self.host_pages > 0
        for node in nodes:
            if node.ref == 0 and node.on_gpu:
                self.evictable_pages -= 1
            node.ref += 1
            if not hit:
                continue
            node.hits += 1
            if policy_selective and node.hits >= _SELECTIVE_THRESHOLD and node.on_gpu and not node.on_host:
                self._write_host(node)

    def release(self, nodes: Sequence[PageNode], now: float) -> None:
        for node in reversed(nodes):
            node.ref -= 1
            node.last_access = now
            if node.ref == 0:
                if node.on_gpu:
                    self.evictable_pages += 1
                    if node.gpu_children == 0:
                        self._push_gpu(node)
                elif node.host_children == 0:
                    self._push_host(node)

    def _push_gpu(self, node: PageNode) -> None:
        self._tick += 1
        heapq.heappush(self._gpu_heap, (node.last_access, self._tick, node))

    def _push_host(self, node: PageNode) -> None:
        self._tick += 1
        heapq.heappush(self._host_heap, (node.last_access, self._tick, node))

    # -- computing and loading pages ---------------------------------------------------------

    def insert_run(self, parent: PageNode, data: bytes, nodes: list[PageNode]) -> int:
        """Record consecutive pages just computed on the GPU (`data` = their token bytes) under
        `parent`, each held by the request that computed it, appending their nodes to `nodes`;
        the caller must have a free page for each (or be turning its private tail into one).
        Returns how many were recomputed (computed here before). A page already on the GPU
        (computed twice concurrently: SGLang frees the duplicate at insert) is shared. Pages go
        straight to held, never through the evictable state; one loop, so that long prefills
        cost a few microseconds per page."""
        width = 4 * self.page_size
        computed = self._computed
        order = self._computed_order
        computed_max = self._computed_max
        host_copy = self.host_pages > 0 and self.write_policy == "write_through"
        events = self.emit_events
        sha256 = hashlib.sha256
        append = nodes.append
        recomputed = 0
        added = 0
        for start in range(0, len(data), width):
            key = data[start : start + width]
            node = parent.children.get(key)
            if node is not None and node.on_gpu:
                if node.ref == 0:
                    self.evictable_pages -= 1
                node.ref += 1
                recomputed += 1
                append(node)
                parent = node
                continue
            if node is None:
                node = PageNode(parent, key, sha256(parent.digest + key).digest())
                parent.children[key] = node
            page_hash = node.hash
            if page_hash in computed:
                recomputed += 1
            else:
                computed.add(page_hash)
                order.append(page_hash)
                if len(order) > computed_max:
                    computed.discard(order.popleft())
            node.ref += 1
            node.on_gpu = True
            added += 1
            parent.gpu_children += 1
            if events:
                self.events.append(
                    BlockStored(
                        (page_hash,),
                        parent.hash if parent is not self.root else None,
                        self._ids_of(key),
                        self.page_size,
                        GPU,
                    )
                )
            if host_copy and not node.on_host:
                self._write_host(node)
            append(node)
            parent = node
        self.gpu_pages += added
        return recomputed

    def load_back(self, node: PageNode) -> None:
        """Copy a host-only page back to the GPU (the caller holds a free page and a ref)."""
        self._to_gpu(node)

    def _to_gpu(self, node: PageNode) -> None:
        node.on_gpu = True
        self.gpu_pages += 1
        node.parent.gpu_children += 1
        if node.ref == 0:
            self.evictable_pages += 1
            self._push_gpu(node)
        if self.emit_events:
            self.events.append(
                BlockStored(
                    (node.hash,),
                    node.parent.hash if node.parent is not self.root else None,
                    self._ids_of(node.key),
                    self.page_size,
                    GPU,
                )
            )

    def _write_host(self, node: PageNode) -> bool:
        if self.host_used >= self.host_pages and not self._evict_host(1):
            return False  # no room: SGLang skips the backup
        node.on_host = True
        self.host_used += 1
        node.parent.host_children += 1
        if self.emit_events:
            self.events.append(
                BlockStored(
                    (node.hash,),
                    node.parent.hash if node.parent is not self.root else None,
                    self._ids_of(node.key),
                    self.page_size,
                    HOST,
                )
            )
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
        # No host tier and no event subscriber: `_evict_one_gpu` reduced to what it does then,
        # in one loop (evicting is most of what a thrashing engine does).
        done = 0
        heap = self._gpu_heap
        heappop, heappush = heapq.heappop, heapq.heappush
        root = self.root
        tick = self._tick
        while done < pages and heap:
            stamp, _, node = heappop(heap)
            if not node.on_gpu or node.ref or node.gpu_children or node.last_access != stamp:
                continue  # stale entry
            parent = node.parent
            node.on_gpu = False
            parent.gpu_children -= 1
            del parent.children[node.key]  # no host copy: the node is gone (its subtree
            if node.children:  # can only be host-only, i.e. empty here)
                self._drop_children(node)
            if parent is not root and parent.on_gpu and parent.ref == 0 and parent.gpu_children == 0:
                tick += 1
                heappush(heap, (parent.last_access, tick, parent))
            done += 1
        self._tick = tick
        self.gpu_pages -= done
        self.evictable_pages -= done
        self.evicted_pages_total += done
        return done

    def _evict_gpu_general(self, pages: int) -> int:
        done = 0
        heap = self._gpu_heap
        while done < pages and heap:
            stamp, _, node = heapq.heappop(heap)
            if not node.on_gpu or node.ref or node.gpu_children or node.last_access != stamp:
                continue  # stale entry
            self._evict_one_gpu(node)
            done += 1
        return done

    def _evict_one_gpu(self, node: PageNode) -> None:
        parent = node.parent
        node.on_gpu = False
        self.gpu_pages -= 1
        self.evictable_pages -= 1
        self.evicted_pages_total += 1
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
            stamp, _, node = heapq.heappop(heap)
            if not node.on_host or node.on_gpu or node.ref or node.host_children or node.last_access != stamp:
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
        del node.parent.children[node.key]
        if node.children:
            self._drop_children(node)

    def _drop_children(self, node: PageNode) -> None:
        stack = list(node.children.values())
        node.children = {}
        while stack:
            child = stack.pop()
            if child.on_host:
                child.on_host = False
                self.host_used -= 1
                if self.emit_events:
                    self.events.append(BlockRemoved((child.hash,), HOST))
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
            if node.on_gpu:
                gpu.add(node.hash)
            if node.on_host:
                host.add(node.hash)
            stack.extend(node.children.values())
        return gpu, host
