"""Plain data the selection core passes around."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Replica(NamedTuple):
    """One schedulable unit: a worker and one of its data-parallel ranks (capacity's `Replica`)."""

    worker_id: str
    dp_rank: int = 0


@dataclass(frozen=True)
class WorkerView:
    """A routable worker as the capacity service last described it (HEALTHY, with replicas)."""

    worker_id: str
    url: str
    model_name: str
    page_size: int
    replicas: tuple[Replica, ...]
    context_length: int = 0  # the card's; 0 = not published


@dataclass(frozen=True)
class Prompt:
    """A prompt as the index and the load tracker see it.

    `block_hashes` are chained ids of the prompt's complete blocks (token pages, or text chunks
    in the tokenizer-free approximation); equal ids mean equal prefixes up to and including that
    block. `tokens_per_block` says how many prompt tokens one entry stands for, so that an
    overlap counted in entries converts to cached tokens.
    """

    block_hashes: tuple[int, ...]
    isl_tokens: int
    tokens_per_block: float

    def cached_tokens(self, overlap_blocks: int) -> int:
        """Prompt tokens a worker holding the first `overlap_blocks` entries would not prefill."""
        return min(self.isl_tokens, int(overlap_blocks * self.tokens_per_block))
