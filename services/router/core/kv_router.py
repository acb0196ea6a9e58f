"""The router's KV-aware selection core: one object the async shell drives.

    prompt = core.prompt_from_tokens(token_ids, session)   # or prompt_from_text(text, isl_tokens, session)
    p = core.pick(prompt, candidates, now, pinned=...)     # filter -> score -> pick; no state change
    core.commit(request_id, p, now)                        # count its load (approx mode: remember it)
    core.first_token(request_id)                           # prefill done
    core.output_progress(request_id, output_tokens)        # optional, per chunk
    core.finish(request_id)                                # in `finally`; idempotent

    core.apply_kv_event(replica, event)                    # event-driven mode, from the ZMQ feed
    core.remove_worker(replica)                            # the replica left the capacity snapshot
    core.sweep(now)                                        # periodically: stale requests, expired history

Not thread-safe: the shell calls it from its event loop only. Pure: no clock reads, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from services.common.sglang.kv_events import KvEvent
from services.router.core.cost import make_cost_policy
from services.router.core.events import EventOutcome
from services.router.core.hashing import text_chunk_hashes, token_block_hashes
from services.router.core.index import KvEventIndex, RoutingHistoryIndex
from services.router.core.load import ActiveLoad
from services.router.core.params import KvRouterParams, RouterOverride
from services.router.core.peer_loads import PeerLoads
from services.router.core.select import (
    Candidate,
    NoWorkerAvailable,
    Pick,
    PickReason,
    PinOutcome,
    RandomSource,
    filter_candidates,
    pick,
    score_candidates,
)
from services.router.core.session_chains import SessionChains
from services.router.core.types import Prompt, Replica


@dataclass(frozen=True)
class SweepResult:
    expired_requests: tuple[str, ...]
    expired_blocks: int


class KvRouterCore:
    def __init__(self, params: KvRouterParams, rng: RandomSource, peers: PeerLoads | None = None) -> None:
        self.params = params
        self._rng = rng
        self._policy = make_cost_policy(params.cost_policy)
        self.chains = SessionChains(params.session_chain_bytes)
        self.index: KvEventIndex | RoutingHistoryIndex
        if params.use_kv_events:
            self.index = KvEventIndex(
                block_size=params.block_size,
                max_blocks_per_worker=params.max_blocks_per_worker,
                prune_target_ratio=params.prune_target_ratio,
            )
        else:
            self.index = RoutingHistoryIndex(
                ttl_s=params.router_ttl_s,
                max_blocks_per_worker=params.max_blocks_per_worker,
                prune_target_ratio=params.prune_target_ratio,
            )
        self.load = ActiveLoad(
            block_size=params.block_size,
            track_output_blocks=params.router_track_output_blocks,
            request_expiry_s=params.request_expiry_s,
            track_active_blocks=params.router_track_active_blocks,
            track_prefill_tokens=params.router_track_prefill_tokens,
            peers=peers,
        )

    # -- prompts ---------------------------------------------------------------------------

    def prompt_from_tokens(self, token_ids: Sequence[int], session: str = "") -> Prompt:
        """Exact: one entry per complete `block_size`-token page (SGLang's event hash rule). With a
        `session`, the pages it shares with that session's previous prompt are not hashed again."""
        bs = self.params.block_size
        ids = self.chains.token_ids(session, token_ids, bs) if session else tuple(token_block_hashes(token_ids, bs))
        return Prompt(ids, len(token_ids), float(bs))

    def prompt_from_text(self, text: str, isl_tokens: int, session: str = "") -> Prompt:
        """Approximate, for prompts the router cannot tokenize: one entry per `text_chunk_chars`
        characters; an overlap converts to tokens by this prompt's own tokens-per-character
        ratio (`isl_tokens` is the caller's estimate). Only a routing-history index matches
        these ids; an event-driven index holds token pages and reports no overlap for them."""
        if isl_tokens < 0:
            raise ValueError("isl_tokens >= 0")
        chunk = self.params.text_chunk_chars
        tokens_per_chunk = isl_tokens * chunk / len(text) if text else 0.0
        ids = self.chains.text_ids(session, text, chunk) if session else tuple(text_chunk_hashes(text, chunk))
        return Prompt(ids, isl_tokens, tokens_per_chunk)

    # -- the decision ----------------------------------------------------------------------

    def pick(
        self,
        prompt: Prompt,
        candidates: Iterable[Candidate],
        now: float,
        *,
        pinned: Replica | None = None,
        override: RouterOverride | None = None,
    ) -> Pick:
        """Choose a replica for `prompt`. Changes no load (call `commit` for a real route);
        may expire routing history older than the TTL. Raises NoWorkerAvailable."""
        replicas, pin = filter_candidates(candidates, pinned)
        if not replicas:
            raise NoWorkerAvailable("no healthy worker")
        weight = self.params.kv_overlap_score_weight
        temperature = self.params.router_temperature
        if override is not None:
            weight = weight if override.kv_overlap_score_weight is None else override.kv_overlap_score_weight
            temperature = temperature if override.router_temperature is None else override.router_temperature
        # Weight 0: overlap cannot change any cost; skip the lookup (and its hashing cost upstream).
        # Only the candidates' overlaps are read (a pinned pick: one replica's).
        overlaps = (
            self.index.find_matches(prompt.block_hashes, now, replicas)
            if weight > 0 or pin is PinOutcome.HONOURED
            else {}
        )
        tree_sizes = {r: self.index.tree_size(r) for r in replicas}
        scores = score_candidates(
            replicas, prompt, overlaps, tree_sizes, self.load, self._policy, weight, self.params.block_size
        )
        if pin is PinOutcome.HONOURED:
            chosen, reason = scores[0], PickReason.PINNED
        else:
            chosen, reason = pick(scores, temperature, self._rng)
        return Pick(chosen.replica, reason, pin, prompt, tuple(scores), temperature)

    def commit(self, request_id: str, decision: Pick, now: float, expected_output_tokens: int | None = None) -> bool:
        """The request was sent to `decision.replica`: count its load. False for a known id."""
        chosen = decision.chosen
        added = self.load.add_request(
            request_id,
            chosen.replica,
            decision.prompt.block_hashes,
            decision.prompt.isl_tokens,
            chosen.cached_tokens,
            now,
            expected_output_tokens,
            chain=True,  # a prompt's block ids are a chain (hashing.py)
        )
        if added and isinstance(self.index, RoutingHistoryIndex):
            self.index.record(chosen.replica, decision.prompt.block_hashes, now)
        return added

    # -- request lifecycle -----------------------------------------------------------------

    def first_token(self, request_id: str) -> bool:
        return self.load.mark_prefill_completed(request_id)

    def output_progress(self, request_id: str, output_tokens: int) -> None:
        self.load.observe_output(request_id, output_tokens)

    def finish(self, request_id: str) -> bool:
        return self.load.free(request_id)

    # -- worker and index maintenance ------------------------------------------------------

    def apply_kv_event(self, replica: Replica, event: KvEvent) -> EventOutcome:
        """Apply one KV event of `replica`. Only meaningful in event-driven mode."""
        if not isinstance(self.index, KvEventIndex):
            raise RuntimeError("KV events need use_kv_events=True")
        return self.index.apply(replica, event)

    def remove_worker(self, replica: Replica) -> list[str]:
        """The replica left: drop its index entries and its load. Returns its request ids."""
        self.index.remove_worker(replica)
        return self.load.remove_worker(replica)

    def sweep(self, now: float) -> SweepResult:
        expired_blocks = self.index.expire(now) if isinstance(self.index, RoutingHistoryIndex) else 0
        return SweepResult(tuple(self.load.expire(now)), expired_blocks)
