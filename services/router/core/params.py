"""Parameters of the KV-aware selection core, with the defaults of Dynamo's classic `KvRouterConfig`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.common.settings.config import require

COST_POLICY_NAMES = ("classic", "lmetric")  # kept in step with cost.COST_POLICIES (tested)


@dataclass(frozen=True)
class SchedulerKvSettings:
    """The KvRouter settings the scheduler forwards (its GetRouterConfig), as the router uses them:
    a flag the router was given wins over these, and these over the core's defaults."""

    router_temperature: float
    kv_overlap_score_weight: float
    use_kv_events: bool
    router_track_active_blocks: bool
    router_track_output_blocks: bool
    router_track_prefill_tokens: bool
    router_ttl_secs: float  # 0 = not set
    router_block_size: int  # <= 1 = not set


@dataclass(frozen=True)
class KvRouterParams:
    """How the router scores workers. Invalid values raise `ConfigError` naming the rule."""

    router_temperature: float = 0.0
    """Softmax temperature relative to the observed cost spread; 0 = argmin (ties: smallest
    indexed tree, then uniform random)."""

    kv_overlap_score_weight: float = 1.0
    """Weight of the prefill term; larger favours cache hits (TTFT), smaller load balance (ITL).
    0 = pure decode-block balancing, and KV events are not needed."""

    use_kv_events: bool = True
    """Index fed by the workers' KV events; False = the router's own routing history with a TTL."""

    router_track_active_blocks: bool = True
    """Count the active requests' prompt blocks in a replica's decode load. False: a candidate's
    decode term is only the new prompt's blocks (the same on every replica), so decode load does
    not steer the pick and output blocks are not counted either."""

    router_track_output_blocks: bool = False
    """Count generated tokens as decode blocks while a request runs (decayed by the expected
    output length when the request gives one)."""

    router_track_prefill_tokens: bool = True
    """Count the uncached prompt tokens of requests still in prefill in a replica's prefill load.
    False: a candidate's prefill term is only the new prompt's own uncached tokens."""

    block_size: int = 16
    """KV page size in tokens; must equal the workers' SGLang `--page-size` (events with another
    page size are dropped). Not in Dynamo's config table: Dynamo takes it from the worker card."""

    router_ttl_s: float = 120.0
    """Approximate mode: a routing decision is remembered this long (re-routing refreshes it)."""

    max_blocks_per_worker: int = 1 << 18
    """Memory bound of the index per replica (2**18 pages = 4 Mi tokens at 16-token pages); the
    least recently stored blocks are pruned past it."""

    prune_target_ratio: float = 0.8
    """After exceeding the bound, prune down to this fraction of it (amortises pruning)."""

    text_chunk_chars: int = 64
    """Approximate hashing of rendered prompt text: characters per chunk. Choose about
    block_size x characters per token (~4 for English and code) so one chunk stands for a page."""

    session_chain_bytes: int = 64 << 20
    """Memory for each session's last prompt and its block digests, so that a turn hashes only what it
    adds to its session's previous prompt (core/session_chains.py); least recently used sessions are
    dropped past it, and their next turn hashes its prompt whole. 0 keeps nothing."""

    request_expiry_s: float = 300.0
    """Active-load safety net: a request still tracked this long after it was added is freed
    at the next sweep (Dynamo's EXPIRY_DURATION)."""

    cost_policy: str = "classic"
    """Cost formula: `classic` (Dynamo A.5) or `lmetric` (prefill x (decode + 1))."""

    def __post_init__(self) -> None:
        t = self.router_temperature
        require(
            isinstance(t, (int, float)) and math.isfinite(t) and t >= 0,
            "router_temperature",
            t,
            "router_temperature >= 0 and finite",
        )
        w = self.kv_overlap_score_weight
        require(
            isinstance(w, (int, float)) and math.isfinite(w) and w >= 0,
            "kv_overlap_score_weight",
            w,
            "kv_overlap_score_weight >= 0 and finite",
        )
        require(
            isinstance(self.block_size, int) and self.block_size > 1,
            "block_size",
            self.block_size,
            "block_size > 1 (SGLang --page-size must be > 1 for KV routing)",
        )
        require(
            math.isfinite(self.router_ttl_s) and self.router_ttl_s > 0,
            "router_ttl_s",
            self.router_ttl_s,
            "router_ttl_s > 0",
        )
        require(
            isinstance(self.max_blocks_per_worker, int) and self.max_blocks_per_worker >= 1,
            "max_blocks_per_worker",
            self.max_blocks_per_worker,
            "max_blocks_per_worker >= 1",
        )
        require(
            0 < self.prune_target_ratio <= 1,
            "prune_target_ratio",
            self.prune_target_ratio,
            "0 < prune_target_ratio <= 1",
        )
        require(
            isinstance(self.text_chunk_chars, int) and self.text_chunk_chars >= 1,
            "text_chunk_chars",
            self.text_chunk_chars,
            "text_chunk_chars >= 1",
        )
        require(
            isinstance(self.session_chain_bytes, int) and self.session_chain_bytes >= 0,
            "session_chain_bytes",
            self.session_chain_bytes,
            "session_chain_bytes >= 0",
        )
        require(
            math.isfinite(self.request_expiry_s) and self.request_expiry_s > 0,
            "request_expiry_s",
            self.request_expiry_s,
            "request_expiry_s > 0",
        )
        require(
            self.cost_policy in COST_POLICY_NAMES,
            "cost_policy",
            self.cost_policy,
            f"cost_policy in {{{', '.join(COST_POLICY_NAMES)}}}",
        )

    @property
    def subscribes_to_kv_events(self) -> bool:
        """Whether the shell should consume KV events (Dynamo: use_kv_events and weight > 0)."""
        return self.use_kv_events and self.kv_overlap_score_weight > 0


@dataclass(frozen=True)
class RouterOverride:
    """Per-request overrides (Dynamo's `router_config_override`); None keeps the configured value."""

    kv_overlap_score_weight: float | None = None
    router_temperature: float | None = None

    def __post_init__(self) -> None:
        w = self.kv_overlap_score_weight
        require(
            w is None or (math.isfinite(w) and w >= 0),
            "kv_overlap_score_weight",
            w,
            "kv_overlap_score_weight >= 0 and finite",
        )
        t = self.router_temperature
        require(
            t is None or (math.isfinite(t) and t >= 0), "router_temperature", t, "router_temperature >= 0 and finite"
        )
