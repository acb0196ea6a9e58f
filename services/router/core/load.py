"""Active load per replica, as the router itself caused it (Dynamo's "active sequences").

Per replica:
- prefill load: `Σ new_tokens(r)` over requests `r` not yet past their first token, where
  `new_tokens = max(isl - cached, 0)`; a request leaves this term at its first token;
- decode load: the distinct prompt blocks of the replica's active requests (a block shared by
  several requests counts once), plus, with output tracking, one block per `block_size`
  generated tokens. When a request gave an expected output length, every block only it
  references counts `max(0, 1 - generated / expected)` instead of 1 (it is about to leave).

With router replica sync, `peers` (peer_loads.py) holds the other routers' loads: `potential` and
`load` add them (their prefill tokens and decode blocks as counts: peers' blocks are not deduplicated
against ours); `own_loads` is what this router reports, its own count only.

Requests are added when routed, marked at their first token and freed at the end; every
operation is keyed by request id and freeing is idempotent. Requests older than
`request_expiry_s` are force-freed by `expire` (a safety net against a lost `free`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from services.router.core.hashing import chains_position, chains_prefix, held_prefix
from services.router.core.types import Replica


@dataclass(frozen=True)
class ReplicaLoad:
    active_requests: int
    active_prefill_tokens: int
    active_decode_blocks: int


class PeerView(Protocol):
    """Other routers' summed load per replica (peer_loads.PeerLoads)."""

    def get(self, replica: Replica) -> ReplicaLoad | None: ...


class _Request:
    __slots__ = (
        "replica",
        "chain",
        "distinct",
        "isl_tokens",
        "prefill_tokens",
        "expected_output_tokens",
        "output_tokens",
        "output_blocks",
        "added_at",
    )

    def __init__(
        self,
        replica: Replica,
        block_hashes: Sequence[int],
        isl_tokens: int,
        prefill_tokens: int,
        expected_output_tokens: int | None,
        added_at: float,
        chain: bool,
    ) -> None:
        self.replica = replica
        # A chain as a tuple (its ids are distinct), or other block lists as their distinct blocks.
        self.chain: tuple[int, ...] | None = tuple(block_hashes) if chain else None
        self.distinct: frozenset[int] | None = None if chain else frozenset(block_hashes)
        self.isl_tokens = isl_tokens
        self.prefill_tokens = prefill_tokens  # 0 once the first token arrived
        self.expected_output_tokens = expected_output_tokens
        self.output_tokens = 0
        self.output_blocks = 0
        self.added_at = added_at

    @property
    def block_set(self) -> frozenset[int]:
        return self.distinct if self.distinct is not None else frozenset(self.chain or ())

    @property
    def block_count(self) -> int:
        return len(self.distinct) if self.distinct is not None else len(self.chain or ())

    def decay_fraction(self) -> float:
        """Weight of this request's exclusive blocks; 1 unless it announced its output length."""
        if self.expected_output_tokens is None:
            return 1.0
        return max(0.0, 1.0 - self.output_tokens / max(self.expected_output_tokens, 1))


class _ReplicaState:
    """The distinct active prompt blocks of one replica.

    While every active request is a chain (`general == 0`; hashing.py: each id names its whole
    prefix), their blocks form a tree of prefixes and nothing per block is kept: `chains` holds
    the active chains in sorted order, and a chain shares with the others exactly its longest
    common prefix with its two sorted neighbours (the longest with any of them), so adding or
    freeing one is a bisection and two prefix comparisons, O(log) lookups however long the
    prompt; `chain_blocks` is their union's size.

    Once a request gives arbitrary blocks (`general > 0`), the union is kept as a set, plus the
    extra holders of shared blocks: a block held by k >= 1 active requests is in `blocks`, and
    when k >= 2, `extra[block] = k - 1` (built from the chains when the first such request
    comes, dropped when the last leaves)."""

    __slots__ = (
        "chains",
        "chain_blocks",
        "blocks",
        "extra",
        "general",
        "prefill_tokens",
        "request_ids",
        "output_blocks",
        "decayed",
    )

    def __init__(self) -> None:
        self.chains: list[tuple[int, ...]] = []  # sorted; every active chain request's blocks
        self.chain_blocks = 0  # distinct blocks of `chains`
        self.blocks: set[int] = set()  # with general > 0 only
        self.extra: dict[int, int] = {}  # with general > 0 only
        self.general = 0  # active requests whose blocks were not given as a chain
        self.prefill_tokens = 0
        self.request_ids: set[str] = set()
        self.output_blocks = 0
        self.decayed: set[str] = set()  # requests whose blocks weigh < 1

    def distinct_blocks(self) -> int:
        return len(self.blocks) if self.general else self.chain_blocks

    def held_prefix(self, chain: Sequence[int]) -> int:
        """How many leading blocks of `chain` some active request holds."""
        if self.general:
            return held_prefix(chain, self.blocks)
        return chains_prefix(self.chains, tuple(chain), exclude_self=False)

    def add_chain(self, chain: tuple[int, ...]) -> None:
        at, shared = chains_position(self.chains, chain, exclude_self=False)
        self.chain_blocks += len(chain) - shared
        self.chains.insert(at, chain)
        if self.general:
            self.add_set(frozenset(chain))

    def free_chain(self, chain: tuple[int, ...]) -> None:
        at, shared = chains_position(self.chains, chain, exclude_self=True)
        self.chain_blocks -= len(chain) - shared
        del self.chains[at]  # an equal chain: any copy will do
        if self.general:
            self.free_set(frozenset(chain))

    def add_set(self, block_set: frozenset[int]) -> None:
        extra = self.extra
        for block_id in self.blocks.intersection(block_set):
            extra[block_id] = extra.get(block_id, 0) + 1
        self.blocks |= block_set

    def free_set(self, block_set: frozenset[int]) -> None:
        extra = self.extra
        shared = block_set.intersection(extra) if extra else ()
        for block_id in shared:
            holders = extra[block_id] - 1
            if holders:
                extra[block_id] = holders
            else:
                del extra[block_id]
        # Its blocks leave, then the ones other requests still hold (few: the system prompt)
        # come back: no difference set of the whole prompt is built.
        self.blocks -= block_set
        if shared:
            self.blocks.update(shared)

    def shared_blocks(self, request: _Request) -> int:
        """How many of an active request's blocks another active request holds too."""
        if self.general:
            return len(request.block_set.intersection(self.extra))
        assert request.chain is not None  # no set: every active request is a chain
        return chains_prefix(self.chains, request.chain, exclude_self=True)


class ActiveLoad:
    def __init__(
        self,
        *,
        block_size: int,
        track_output_blocks: bool,
        request_expiry_s: float,
        track_active_blocks: bool = True,
        track_prefill_tokens: bool = True,
        peers: PeerView | None = None,
    ) -> None:
        self.block_size = block_size
        self.track_output_blocks = track_output_blocks
        # Off: the bookkeeping still runs (the replica of a request, expiry), only the load reads 0.
        self.track_active_blocks = track_active_blocks
        self.track_prefill_tokens = track_prefill_tokens
        self.request_expiry_s = request_expiry_s
        self.peers = peers  # other routers' loads (router replica sync); None: this router's count only
        self._requests: dict[str, _Request] = {}
        self._replicas: dict[Replica, _ReplicaState] = {}

    # -- queries (the selection hot path) --------------------------------------------------

    def potential(
        self, replica: Replica, prompt_blocks: Sequence[int], isl_tokens: int, cached_tokens: int
    ) -> tuple[int, int]:
        """(prefill tokens, decode blocks) `replica` would carry if this prompt landed there.

        `prompt_blocks` is the prompt's chain of block ids (hashing.py: each id names its whole
        prefix). Every active request holds a whole chain too, so the prompt blocks already
        active on the replica are a prefix of the prompt's chain: found by bisection, not
        counted twice."""
        new_tokens = max(isl_tokens - cached_tokens, 0)
        state = self._replicas.get(replica)
        if state is None:
            prefill, decode = new_tokens, len(prompt_blocks)
        else:
            prefill = self._prefill_tokens(state) + new_tokens
            if self.track_active_blocks:
                shared = state.held_prefix(prompt_blocks)
                decode = self._decode_blocks(state) + len(prompt_blocks) - shared
            else:
                decode = len(prompt_blocks)
        if self.peers is not None:
            peer = self.peers.get(replica)
            if peer is not None:
                prefill += peer.active_prefill_tokens if self.track_prefill_tokens else 0
                decode += peer.active_decode_blocks if self.track_active_blocks else 0
        return prefill, decode

    def load(self, replica: Replica) -> ReplicaLoad:
        """This router's load on `replica` plus its peers' (router replica sync)."""
        own = self.own_load(replica)
        peer = self.peers.get(replica) if self.peers is not None else None
        if peer is None:
            return own
        return ReplicaLoad(
            own.active_requests + peer.active_requests,
            own.active_prefill_tokens + (peer.active_prefill_tokens if self.track_prefill_tokens else 0),
            own.active_decode_blocks + (peer.active_decode_blocks if self.track_active_blocks else 0),
        )

    def own_load(self, replica: Replica) -> ReplicaLoad:
        state = self._replicas.get(replica)
        if state is None:
            return ReplicaLoad(0, 0, 0)
        return ReplicaLoad(len(state.request_ids), self._prefill_tokens(state), self._decode_blocks(state))

    def own_loads(self) -> dict[Replica, ReplicaLoad]:
        """This router's own load on every replica it has active requests on (what it reports)."""
        return {replica: self.own_load(replica) for replica in self._replicas}

    def replica_of(self, request_id: str) -> Replica | None:
        request = self._requests.get(request_id)
        return request.replica if request else None

    def __len__(self) -> int:
        return len(self._requests)

    def _prefill_tokens(self, state: _ReplicaState) -> int:
        return state.prefill_tokens if self.track_prefill_tokens else 0

    def _decode_blocks(self, state: _ReplicaState) -> int:
        if not self.track_active_blocks:
            return 0
        blocks = float(state.distinct_blocks() + state.output_blocks)
        for request_id in state.decayed:  # only requests with an expected length and output
            request = self._requests[request_id]
            # Its exclusive blocks: the ones no other active request holds.
            exclusive = request.block_count - state.shared_blocks(request)
            blocks -= (1.0 - request.decay_fraction()) * (exclusive + request.output_blocks)
        return round(blocks)

    # -- lifecycle -------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        replica: Replica,
        block_hashes: Sequence[int],
        isl_tokens: int,
        cached_tokens: int,
        now: float,
        expected_output_tokens: int | None = None,
        *,
        chain: bool = False,
    ) -> bool:
        """Count a routed request on `replica`. False (and nothing changes) for a known id.

        `chain`: `block_hashes` is a prompt's chain of block ids (hashing.py: each names its
        whole prefix, so they are distinct and any union of chains is closed under prefixes);
        the accounting is the same, only cheaper. Otherwise any list of block ids."""
        if request_id in self._requests:
            return False
        new_tokens = max(isl_tokens - cached_tokens, 0)
        request = _Request(replica, block_hashes, isl_tokens, new_tokens, expected_output_tokens, now, chain)
        self._requests[request_id] = request
        state = self._replicas.get(replica)
        if state is None:
            state = self._replicas[replica] = _ReplicaState()
        state.request_ids.add(request_id)
        state.prefill_tokens += new_tokens
        if request.chain is not None:
            state.add_chain(request.chain)
            return True
        if not state.general:  # the first request with arbitrary blocks: the chains as a set
            for held in state.chains:
                state.add_set(frozenset(held))
        state.general += 1
        state.add_set(request.block_set)
        return True

    def mark_prefill_completed(self, request_id: str) -> bool:
        """First token arrived: the prompt leaves the prefill term. False if unknown or already done."""
        request = self._requests.get(request_id)
        if request is None or request.prefill_tokens == 0:
            return False
        self._replicas[request.replica].prefill_tokens -= request.prefill_tokens
        request.prefill_tokens = 0
        return True

    def observe_output(self, request_id: str, output_tokens: int) -> None:
        """Cumulative generated tokens of a request (call when a chunk arrives; cheap, O(1)).

        Output blocks are counted only with `track_output_blocks`; a request crosses into a new
        block whenever ceil((isl + output) / block_size) grows."""
        if not self.track_output_blocks:
            return
        request = self._requests.get(request_id)
        if request is None or output_tokens <= request.output_tokens:
            return
        request.output_tokens = output_tokens
        state = self._replicas[request.replica]
        bs = self.block_size
        prompt_blocks = -(-request.isl_tokens // bs)
        blocks = -(-(request.isl_tokens + output_tokens) // bs) - prompt_blocks
        if blocks > request.output_blocks:
            state.output_blocks += blocks - request.output_blocks
            request.output_blocks = blocks
        if request.expected_output_tokens is not None:
            state.decayed.add(request_id)

    def free(self, request_id: str) -> bool:
        """The request ended (finished, failed or cancelled). Idempotent: False if unknown."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return False
        state = self._replicas[request.replica]
        state.prefill_tokens -= request.prefill_tokens
        state.output_blocks -= request.output_blocks
        state.request_ids.discard(request_id)
        state.decayed.discard(request_id)
        if request.chain is not None:
            state.free_chain(request.chain)
        else:
            state.free_set(request.block_set)
            state.general -= 1
            if not state.general:  # only chains are left: no set needed
                state.blocks, state.extra = set(), {}
        if not state.request_ids:
            del self._replicas[request.replica]
        return True

    def remove_worker(self, replica: Replica) -> list[str]:
        """Drop a replica that left; returns the ids of the requests it still carried."""
        state = self._replicas.pop(replica, None)
        if state is None:
            return []
        for request_id in state.request_ids:
            del self._requests[request_id]
        return sorted(state.request_ids)

    def expire(self, now: float) -> list[str]:
        """Force-free requests added at least `request_expiry_s` before `now`."""
        stale = [rid for rid, r in self._requests.items() if now - r.added_at >= self.request_expiry_s]
        for request_id in stale:
            self.free(request_id)
        return stale
