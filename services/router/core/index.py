"""Soft prefix index: which replica probably holds which prefix of a prompt.

Blocks are keyed by their chained id (hashing.py), so one id names one whole prefix: the
radix tree of Dynamo's indexer collapses into a map `block id -> replicas holding it`, and a
lookup walks the query's ids from the root, narrowing the candidate set, until the first
block nobody left holds. A replica's score is the number of leading blocks it holds
(a contiguous prefix; a hole ends its match even if deeper blocks are present).

Two feeds fill it:
- `KvEventIndex`: the workers' KV events (BlockStored / BlockRemoved / AllBlocksCleared). The
  engine's own block ids are used only to find a replica's blocks again (parents, removals);
  the index re-hashes the event's token ids itself, so it works with any engine hash rule.
- `RoutingHistoryIndex`: no events; the router records each of its own routing decisions and
  forgets it `ttl_s` later (re-routing the same prefix refreshes it). Its records are whole
  chains, so what a replica holds is the union of its live records' chains: kept as those
  chains in sorted order (`hashing.chains_prefix`), with no entry per block.

Memory is bounded per replica: past `max_blocks_per_worker` the least recently stored blocks
are pruned (deepest first within one insertion, so prefixes outlive their extensions) down to
`prune_target_ratio` of the bound.
"""

from __future__ import annotations

from bisect import insort
from collections import OrderedDict, deque
from typing import Collection, Generic, Iterable, Sequence, TypeVar

from services.common.sglang.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from services.router.core.events import EventOutcome
from services.router.core.hashing import chains_position, chains_prefix, digest_to_block_id, page_digests
from services.router.core.types import Replica

_Entry = TypeVar("_Entry")


class _BlockIndex(Generic[_Entry]):
    """Holder sets per block id plus, per replica, its blocks in least-recently-stored order."""

    def __init__(self, *, max_blocks_per_worker: int, prune_target_ratio: float) -> None:
        if max_blocks_per_worker < 1 or not 0 < prune_target_ratio <= 1:
            raise ValueError("max_blocks_per_worker >= 1 and 0 < prune_target_ratio <= 1")
        self._max_blocks = max_blocks_per_worker
        self._prune_to = int(max_blocks_per_worker * prune_target_ratio)
        self._holders: dict[int, set[Replica]] = {}
        self._blocks: dict[Replica, OrderedDict[int, _Entry]] = {}
        self.pruned_blocks_total = 0

    # -- queries ---------------------------------------------------------------------------

    def _match(self, block_hashes: Sequence[int]) -> dict[Replica, int]:
        scores: dict[Replica, int] = {}
        candidates: set[Replica] | None = None
        matched = 0
        for block_id in block_hashes:
            holders = self._holders.get(block_id)
            if not holders:
                break
            if candidates is None:
                candidates = set(holders)
            elif not candidates <= holders:
                for dropped in candidates - holders:
                    scores[dropped] = matched
                candidates &= holders
                if not candidates:
                    break
            matched += 1
        for replica in candidates or ():
            scores[replica] = matched
        return scores

    def tree_size(self, replica: Replica) -> int:
        """Blocks the index holds for `replica` (the temperature-0 tie-break)."""
        blocks = self._blocks.get(replica)
        return len(blocks) if blocks else 0

    def replicas(self) -> list[Replica]:
        return list(self._blocks)

    def holds(self, replica: Replica, block_id: int) -> bool:
        blocks = self._blocks.get(replica)
        return blocks is not None and block_id in blocks

    # -- mutation --------------------------------------------------------------------------

    def remove_worker(self, replica: Replica) -> int:
        """Forget everything about `replica`. Returns the number of blocks dropped."""
        blocks = self._blocks.pop(replica, None)
        if not blocks:
            return 0
        for block_id in blocks:
            self._release_holder(replica, block_id)
        self._on_replica_removed(replica)
        return len(blocks)

    def _put(self, replica: Replica, block_id: int, entry: _Entry) -> None:
        blocks = self._blocks.get(replica)
        if blocks is None:
            blocks = self._blocks[replica] = OrderedDict()
        if block_id in blocks:
            blocks.move_to_end(block_id)
        else:
            self._holders.setdefault(block_id, set()).add(replica)
        blocks[block_id] = entry

    def _drop(self, replica: Replica, block_id: int) -> None:
        blocks = self._blocks[replica]
        del blocks[block_id]
        self._release_holder(replica, block_id)

    def _release_holder(self, replica: Replica, block_id: int) -> None:
        holders = self._holders[block_id]
        holders.discard(replica)
        if not holders:
            del self._holders[block_id]
            self._on_block_gone(block_id)

    def _prune(self, replica: Replica) -> None:
        blocks = self._blocks.get(replica)
        if blocks is None or len(blocks) <= self._max_blocks:
            return
        while len(blocks) > self._prune_to:
            block_id, entry = blocks.popitem(last=False)
            self._release_holder(replica, block_id)
            self._on_entry_dropped(replica, entry)
            self.pruned_blocks_total += 1

    # hooks for the subclasses' side tables
    def _on_block_gone(self, block_id: int) -> None:
        pass

    def _on_entry_dropped(self, replica: Replica, entry: _Entry) -> None:
        pass

    def _on_replica_removed(self, replica: Replica) -> None:
        pass


class _Held:
    """One block a replica holds according to its events."""

    __slots__ = ("external_id", "media")

    def __init__(self, external_id: int, media: int) -> None:
        self.external_id = external_id
        self.media = media  # bit mask over storage media (GPU, host, ...)


class KvEventIndex(_BlockIndex[_Held]):
    """Prefix index fed by KV events.

    A block counts as held while any medium (GPU or the HiCache host tier) holds it: both serve
    the prefix without recomputation (the classic cost model does not distinguish them).
    """

    def __init__(self, *, block_size: int, max_blocks_per_worker: int, prune_target_ratio: float) -> None:
        super().__init__(max_blocks_per_worker=max_blocks_per_worker, prune_target_ratio=prune_target_ratio)
        self.block_size = block_size
        self._digests: dict[int, bytes] = {}  # block id -> full digest, to chain children
        self._by_external: dict[Replica, dict[int, int]] = {}
        self._medium_bits: dict[str, int] = {}

    def find_matches(
        self, block_hashes: Sequence[int], now: float = 0.0, replicas: Collection[Replica] | None = None
    ) -> dict[Replica, int]:
        """`{replica: leading blocks held}` for replicas holding at least the first block (all of
        them: `replicas`, the ones the caller will read, saves nothing here)."""
        return self._match(block_hashes)

    def apply(self, replica: Replica, event: KvEvent) -> EventOutcome:
        if isinstance(event, BlockStored):
            return self._store(replica, event)
        if isinstance(event, BlockRemoved):
            return self._remove(replica, event)
        if isinstance(event, AllBlocksCleared):
            self.remove_worker(replica)
            return EventOutcome.APPLIED
        return EventOutcome.MALFORMED

    def apply_all(self, replica: Replica, events: Iterable[KvEvent]) -> list[EventOutcome]:
        return [self.apply(replica, e) for e in events]

    def _medium_bit(self, medium: str) -> int:
        bit = self._medium_bits.get(medium)
        if bit is None:
            bit = self._medium_bits[medium] = 1 << len(self._medium_bits)
        return bit

    def _lookup_external(self, replica: Replica, external_id: int) -> int | None:
        by_external = self._by_external.get(replica)
        if not by_external:
            return None
        block_id = by_external.get(external_id)
        if block_id is None:
            return None
        if not self.holds(replica, block_id):  # stale alias (the block left under another id)
            del by_external[external_id]
            return None
        return block_id

    def _store(self, replica: Replica, event: BlockStored) -> EventOutcome:
        if event.block_size != self.block_size:
            return EventOutcome.BLOCK_SIZE_MISMATCH
        if not event.block_hashes or len(event.token_ids) != len(event.block_hashes) * self.block_size:
            return EventOutcome.MALFORMED
        parent_digest = b""
        if event.parent_block_hash is not None:
            parent_id = self._lookup_external(replica, event.parent_block_hash)
            if parent_id is None:
                return EventOutcome.PARENT_NOT_FOUND
            parent_digest = self._digests[parent_id]
        try:
            digests = page_digests(event.token_ids, self.block_size, parent_digest)
        except OverflowError:
            return EventOutcome.MALFORMED
        bit = self._medium_bit(event.medium)
        by_external = self._by_external.setdefault(replica, {})
        blocks = self._blocks.get(replica)
        # Deepest first, so that LRU pruning drops extensions before their prefixes.
        for external_id, digest in zip(reversed(event.block_hashes), reversed(digests)):
            block_id = digest_to_block_id(digest)
            held = blocks.get(block_id) if blocks is not None else None
            if held is None:
                held = _Held(external_id, bit)
                self._digests.setdefault(block_id, digest)
            else:
                held.media |= bit
                held.external_id = external_id
            self._put(replica, block_id, held)
            blocks = self._blocks[replica]
            by_external[external_id] = block_id
        self._prune(replica)
        return EventOutcome.APPLIED

    def _remove(self, replica: Replica, event: BlockRemoved) -> EventOutcome:
        bit = self._medium_bit(event.medium)
        outcome = EventOutcome.APPLIED
        for external_id in event.block_hashes:
            block_id = self._lookup_external(replica, external_id)
            if block_id is None:
                outcome = EventOutcome.BLOCK_NOT_FOUND
                continue
            held = self._blocks[replica][block_id]
            held.media &= ~bit
            if held.media == 0:
                self._drop(replica, block_id)
                del self._by_external[replica][external_id]
        return outcome

    def _on_block_gone(self, block_id: int) -> None:
        self._digests.pop(block_id, None)

    def _on_entry_dropped(self, replica: Replica, entry: _Held) -> None:
        by_external = self._by_external.get(replica)
        if by_external is not None:
            by_external.pop(entry.external_id, None)

    def _on_replica_removed(self, replica: Replica) -> None:
        self._by_external.pop(replica, None)


class _History:
    """One replica's routing history: its live records, as chains.

    What the replica holds is the union of its live records' chains, closed under prefixes, so
    it is kept as those chains in sorted order and the union's size (`hashing.chains_prefix`
    gives a chain's overlap with the others), with no entry per block."""

    __slots__ = ("chains", "records", "blocks")

    def __init__(self) -> None:
        self.chains: list[tuple[int, ...]] = []  # every live record's chain, sorted
        # [expiry, chain] oldest first (pruning shortens the oldest's chain in place).
        self.records: deque[list] = deque()
        self.blocks = 0  # distinct blocks of `chains`

    def add(self, chain: tuple[int, ...]) -> None:
        at, shared = chains_position(self.chains, chain, exclude_self=False)
        self.blocks += len(chain) - shared
        self.chains.insert(at, chain)

    def pop(self, chain: tuple[int, ...]) -> int:
        """Delete a live record's chain (an equal chain: any copy will do) and return how many of
        its blocks no other live record names; `blocks` is the caller's to lower."""
        at, shared = chains_position(self.chains, chain, exclude_self=True)
        del self.chains[at]
        return len(chain) - shared


class RoutingHistoryIndex:
    """Prefix index fed by the router's own decisions; each entry expires `ttl_s` after its
    last recording. Time is passed in; nothing reads a clock.

    Every recording names a whole chain (the prompt's ids from its first block), and a chained
    id names its whole prefix. A block is held while the last record naming it is live, i.e.
    while any live record names it (records expire in order), so what a replica holds is the
    union of its live records' chains: kept as those chains, sorted (`_History`). Recording,
    expiring and matching are each a bisection and two prefix comparisons, O(log n) lookups
    for prompts of tens of thousands of tokens, whatever they share. Expiry and pruning drop a
    record's blocks that no later record names, deepest first. Same public surface as
    `KvEventIndex`."""

    def __init__(self, *, ttl_s: float, max_blocks_per_worker: int, prune_target_ratio: float) -> None:
        if max_blocks_per_worker < 1 or not 0 < prune_target_ratio <= 1:
            raise ValueError("max_blocks_per_worker >= 1 and 0 < prune_target_ratio <= 1")
        if not ttl_s > 0:
            raise ValueError("ttl_s > 0")
        self.ttl_s = ttl_s
        self._max_blocks = max_blocks_per_worker
        self._prune_to = int(max_blocks_per_worker * prune_target_ratio)
        self._replicas: dict[Replica, _History] = {}
        self.expired_blocks_total = 0
        self.pruned_blocks_total = 0

    # -- queries ---------------------------------------------------------------------------

    def find_matches(
        self, block_hashes: Sequence[int], now: float, replicas: Collection[Replica] | None = None
    ) -> dict[Replica, int]:
        """`{replica: leading blocks held}` after expiring what is older than the TTL at `now`; only
        for `replicas` if given (a pinned pick reads one replica's: the others' bisections are
        skipped)."""
        self.expire(now)
        scores: dict[Replica, int] = {}
        if not block_hashes:
            return scores
        chain = tuple(block_hashes)
        histories = self._replicas
        for replica in histories if replicas is None else replicas:
            history = histories.get(replica)
            if history is None:
                continue
            held = chains_prefix(history.chains, chain, exclude_self=False)
            if held:
                scores[replica] = held
        return scores

    def tree_size(self, replica: Replica) -> int:
        """Blocks the index holds for `replica` (the temperature-0 tie-break)."""
        history = self._replicas.get(replica)
        return history.blocks if history else 0

    def replicas(self) -> list[Replica]:
        return list(self._replicas)

    def holds(self, replica: Replica, block_id: int) -> bool:
        """For tests and debugging: O(blocks recorded) (a block's depth is not known)."""
        history = self._replicas.get(replica)
        return history is not None and any(block_id in chain for chain in history.chains)

    # -- mutation --------------------------------------------------------------------------

    def record(self, replica: Replica, block_hashes: Sequence[int], now: float) -> None:
        """Remember that `replica` now holds this prefix (a whole chain), until `now + ttl_s`."""
        if not block_hashes:
            return
        history = self._replicas.get(replica)
        if history is None:
            history = self._replicas[replica] = _History()
        chain = tuple(block_hashes)
        history.add(chain)
        history.records.append([now + self.ttl_s, chain])
        if history.blocks > self._max_blocks:
            self._prune(replica, history)

    def expire(self, now: float) -> int:
        """Drop every entry whose expiry is <= now. Returns how many were dropped.

        Records share one TTL, so the oldest is first and the scan stops at the first live one
        (amortised O(expired))."""
        dropped = 0
        for replica in list(self._replicas):
            history = self._replicas[replica]
            records = history.records
            while records and records[0][0] <= now:
                chain = records.popleft()[1]
                owned = history.pop(chain)
                history.blocks -= owned
                dropped += owned
            if not records:
                del self._replicas[replica]
        self.expired_blocks_total += dropped
        return dropped

    def remove_worker(self, replica: Replica) -> int:
        """Forget everything about `replica`. Returns the number of blocks dropped."""
        history = self._replicas.pop(replica, None)
        return history.blocks if history else 0

    def _prune(self, replica: Replica, history: _History) -> None:
        """Past the bound: drop least recently recorded blocks (oldest record first, deepest
        first within it) down to the prune target. A record that loses all it owned stays
        (owning nothing) unless the bound needs the next one."""
        records = history.records
        while records and history.blocks > self._prune_to:
            entry = records[0]
            chain = entry[1]
            dropped = min(history.pop(chain), history.blocks - self._prune_to)
            history.blocks -= dropped
            self.pruned_blocks_total += dropped
            if history.blocks > self._prune_to:
                records.popleft()  # every block it still owned is gone
            else:
                entry[1] = chain[: len(chain) - dropped]  # what it still names
                insort(history.chains, entry[1])
        if not history.blocks:
            del self._replicas[replica]
