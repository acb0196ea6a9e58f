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
  chains, so what a replica holds is closed under prefixes and a match is a bisection
  (`hashing.held_prefix`) rather than a walk.

Memory is bounded per replica: past `max_blocks_per_worker` the least recently stored blocks
are pruned (deepest first within one insertion, so prefixes outlive their extensions) down to
`prune_target_ratio` of the bound.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import islice, repeat
from typing import Generic, Iterable, Sequence, TypeVar

from services.common.sglang.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from services.router.core.events import EventOutcome
from services.router.core.hashing import digest_to_block_id, held_prefix, page_digests
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

    def find_matches(self, block_hashes: Sequence[int], now: float = 0.0) -> dict[Replica, int]:
        """`{replica: leading blocks held}` for replicas holding at least the first block."""
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


class _Record:
    """One recording: its chain and its number, which the next recording of a chain extending
    this one takes over (the record is renumbered instead of renaming every block it owns)."""

    __slots__ = ("number", "chain")

    def __init__(self, number: int, chain: Sequence[int]) -> None:
        self.number = number
        self.chain = chain  # every block this record owns is in its chain


class _History:
    """One replica's routing history: block id -> the record that last named it."""

    __slots__ = ("record_of", "records")

    def __init__(self) -> None:
        self.record_of: dict[int, _Record] = {}
        # (record number, expiry, record) oldest first. An entry whose record has been renumbered
        # since is stale: the later entry owns its blocks.
        self.records: deque[tuple[int, float, _Record]] = deque()


class RoutingHistoryIndex:
    """Prefix index fed by the router's own decisions; each entry expires `ttl_s` after its
    last recording. Time is passed in; nothing reads a clock.

    Every recording names a whole chain (the prompt's ids from its first block), and a chained
    id names its whole prefix, so what a replica holds is closed under prefixes: expiry and
    pruning drop a record's blocks deepest first, and an ancestor is always named by every
    record that names a descendant. Along a chain the owning records therefore grow older with
    depth, and a record owns a contiguous run of its chain ending at the chain's deepest held
    block. So a replica's leading match is a bisection (O(log n) lookups), forgetting a record
    is two bisections plus its own blocks, and recording a chain that extends an earlier
    recording (an agent's next turn) renumbers that record and names only the new blocks and
    the shallow ones newer records had taken (a shared system prompt): O(new blocks), not
    O(prompt), for prompts of tens of thousands of tokens. Same public surface as `KvEventIndex`."""

    def __init__(self, *, ttl_s: float, max_blocks_per_worker: int, prune_target_ratio: float) -> None:
        if max_blocks_per_worker < 1 or not 0 < prune_target_ratio <= 1:
            raise ValueError("max_blocks_per_worker >= 1 and 0 < prune_target_ratio <= 1")
        if not ttl_s > 0:
            raise ValueError("ttl_s > 0")
        self.ttl_s = ttl_s
        self._max_blocks = max_blocks_per_worker
        self._prune_to = int(max_blocks_per_worker * prune_target_ratio)
        self._replicas: dict[Replica, _History] = {}
        self._records = 0
        self.expired_blocks_total = 0
        self.pruned_blocks_total = 0

    # -- queries ---------------------------------------------------------------------------

    def find_matches(self, block_hashes: Sequence[int], now: float) -> dict[Replica, int]:
        """`{replica: leading blocks held}` after expiring what is older than the TTL at `now`."""
        self.expire(now)
        scores: dict[Replica, int] = {}
        if not block_hashes:
            return scores
        first = block_hashes[0]
        for replica, history in self._replicas.items():
            if first in history.record_of:
                scores[replica] = held_prefix(block_hashes, history.record_of)
        return scores

    def tree_size(self, replica: Replica) -> int:
        """Blocks the index holds for `replica` (the temperature-0 tie-break)."""
        history = self._replicas.get(replica)
        return len(history.record_of) if history else 0

    def replicas(self) -> list[Replica]:
        return list(self._replicas)

    def holds(self, replica: Replica, block_id: int) -> bool:
        history = self._replicas.get(replica)
        return history is not None and block_id in history.record_of

    # -- mutation --------------------------------------------------------------------------

    def record(self, replica: Replica, block_hashes: Sequence[int], now: float) -> None:
        """Remember that `replica` now holds this prefix (a whole chain), until `now + ttl_s`."""
        if not block_hashes:
            return
        history = self._replicas.get(replica)
        if history is None:
            history = self._replicas[replica] = _History()
        self._records += 1
        number = self._records
        held = history.record_of
        size = len(block_hashes)
        depth = held_prefix(block_hashes, held)
        record = held[block_hashes[depth - 1]] if depth else None
        if record is not None:
            chain = record.chain
            if len(chain) > size or block_hashes[len(chain) - 1] != chain[-1]:
                record = None  # its blocks are not all in this chain: it keeps them
        if record is None:
            record = _Record(number, block_hashes)
            # One pass over the pairs (a dict built first and merged is twice the hashing).
            held.update(zip(block_hashes, repeat(record)))
        else:
            # `record` owns block_hashes[shallow:depth]; newer records own the blocks before.
            shallow = _first_owned(block_hashes, held, record, depth)
            record.number = number
            record.chain = block_hashes
            if shallow:
                held.update(zip(islice(block_hashes, shallow), repeat(record)))
            if depth < size:
                held.update(zip(islice(block_hashes, depth, None), repeat(record)))
        history.records.append((number, now + self.ttl_s, record))
        if len(held) > self._max_blocks:
            self._prune(replica, history)

    def expire(self, now: float) -> int:
        """Drop every entry whose expiry is <= now. Returns how many were dropped.

        Records share one TTL, so the oldest is first and the scan stops at the first live one
        (amortised O(expired))."""
        dropped = 0
        for replica in list(self._replicas):
            history = self._replicas[replica]
            records = history.records
            while records and records[0][1] <= now:
                number, _, record = records.popleft()
                dropped += self._forget(history, number, record, None)
            if not records:
                del self._replicas[replica]
        self.expired_blocks_total += dropped
        return dropped

    def remove_worker(self, replica: Replica) -> int:
        """Forget everything about `replica`. Returns the number of blocks dropped."""
        history = self._replicas.pop(replica, None)
        return len(history.record_of) if history else 0

    @staticmethod
    def _forget(history: _History, number: int, record: _Record, limit: int | None) -> int:
        """Drop up to `limit` (None: all) of the blocks the oldest live record owns, deepest
        first. Nothing if the entry is stale (the record was renumbered since)."""
        if record.number != number:
            return 0
        held = history.record_of
        chain = record.chain
        depth = held_prefix(chain, held)
        if not depth or held[chain[depth - 1]] is not record:
            return 0  # later records named all it had
        shallow = _first_owned(chain, held, record, depth)
        if limit is not None:
            shallow = max(shallow, depth - limit)
        for block_id in islice(chain, shallow, depth):
            del held[block_id]
        return depth - shallow

    def _prune(self, replica: Replica, history: _History) -> None:
        """Past the bound: drop least recently recorded blocks (oldest record first, deepest
        first within it) down to the prune target."""
        records = history.records
        while records and len(history.record_of) > self._prune_to:
            number, _, record = records[0]
            excess = len(history.record_of) - self._prune_to
            self.pruned_blocks_total += self._forget(history, number, record, excess)
            if len(history.record_of) > self._prune_to:
                records.popleft()  # every block it still owned is gone
        if not history.record_of:
            del self._replicas[replica]


def _first_owned(chain: Sequence[int], held: dict[int, _Record], record: _Record, depth: int) -> int:
    """Where `record`'s run starts in `chain`, given that it owns `chain[depth - 1]`: the blocks
    before it are owned by newer records (owners grow older with depth), so a bisection."""
    low, high = 0, depth - 1  # chain[high] is owned by `record`; chain[:low] is not
    while low < high:
        mid = (low + high) // 2
        if held[chain[mid]] is record:
            high = mid
        else:
            low = mid + 1
    return low
