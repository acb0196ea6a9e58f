"""Worker selection: filter -> score -> pick.

    filter  healthy candidates; a pinned replica, when healthy, is the only candidate
    score   cost(replica) for every remaining candidate (cost.py), from its prefix overlap
            (index.py) and the load it would carry (load.py)
    pick    temperature 0: lowest cost; ties -> smallest indexed tree -> uniform random
            temperature T > 0: p_i ∝ exp(-(c_i - c_min) / ((c_max - c_min) · T)), so T is
            relative to the observed spread (T = 1: the worst is e^-1 as likely as the best);
            all costs equal -> uniform

Randomness comes from an injected source, so a pick is deterministic given its seed.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, Sequence

from services.router.core.cost import CostInputs, CostPolicy
from services.router.core.load import ActiveLoad
from services.router.core.types import Prompt, Replica

# Costs closer than this are a tie (they are sums of token counts / block size).
COST_TIE_TOLERANCE = 1e-6


class RandomSource(Protocol):
    def random(self) -> float:
        """Uniform in [0, 1)."""


class NoWorkerAvailable(Exception):
    """No healthy candidate replica (HTTP 503 / gRPC UNAVAILABLE at the edge)."""


class PickReason(enum.Enum):
    """Why this replica won. The value is a span attribute and metric label."""

    PINNED = "pinned"
    ONLY_CANDIDATE = "only_candidate"
    LOWEST_COST = "lowest_cost"
    TIE_SMALLEST_TREE = "tie_smallest_tree"
    TIE_RANDOM = "tie_random"
    SAMPLED = "sampled"


class PinOutcome(enum.Enum):
    NOT_PINNED = "not_pinned"
    HONOURED = "honoured"
    UNAVAILABLE = "unavailable"  # pinned replica not among the healthy candidates: chose by cost


@dataclass(frozen=True)
class Candidate:
    replica: Replica
    healthy: bool = True


@dataclass(frozen=True)
class WorkerScore:
    replica: Replica
    overlap_blocks: int
    cached_tokens: int
    prefill_tokens: int  # potential, incl. this prompt
    decode_blocks: int  # potential, incl. this prompt
    tree_size: int
    cost: float


@dataclass(frozen=True)
class Pick:
    """The decision and its explanation (for the `router.pick` span and DEBUG log)."""

    replica: Replica
    reason: PickReason
    pin: PinOutcome
    prompt: Prompt
    scores: tuple[WorkerScore, ...]  # every scored candidate, in replica order
    temperature: float

    @property
    def chosen(self) -> WorkerScore:
        return next(s for s in self.scores if s.replica == self.replica)

    @property
    def overlap_blocks(self) -> int:
        return self.chosen.overlap_blocks

    @property
    def cached_tokens(self) -> int:
        return self.chosen.cached_tokens

    def span_attributes(self) -> dict[str, str | int | float]:
        """A few bounded attributes; per-candidate detail stays in `scores`."""
        chosen = self.chosen
        return {
            "router.worker_id": self.replica.worker_id,
            "router.dp_rank": self.replica.dp_rank,
            "router.reason": self.reason.value,
            "router.pin": self.pin.value,
            "router.candidates": len(self.scores),
            "router.isl_tokens": self.prompt.isl_tokens,
            "router.overlap_blocks": chosen.overlap_blocks,
            "router.cached_tokens": chosen.cached_tokens,
            "router.cost": chosen.cost,
        }


def filter_candidates(candidates: Iterable[Candidate], pinned: Replica | None) -> tuple[list[Replica], PinOutcome]:
    healthy = sorted({c.replica for c in candidates if c.healthy})
    if pinned is None:
        return healthy, PinOutcome.NOT_PINNED
    if pinned in healthy:
        return [pinned], PinOutcome.HONOURED
    return healthy, PinOutcome.UNAVAILABLE


def score_candidates(
    replicas: Sequence[Replica],
    prompt: Prompt,
    overlaps: Mapping[Replica, int],
    tree_sizes: Mapping[Replica, int],
    load: ActiveLoad,
    policy: CostPolicy,
    overlap_weight: float,
    block_size: int,
) -> list[WorkerScore]:
    scores = []
    for replica in replicas:
        overlap = overlaps.get(replica, 0)
        cached = prompt.cached_tokens(overlap)
        prefill_tokens, decode_blocks = load.potential(replica, prompt.block_hashes, prompt.isl_tokens, cached)
        cost = policy(CostInputs(prefill_tokens, decode_blocks, block_size, overlap_weight))
        scores.append(
            WorkerScore(replica, overlap, cached, prefill_tokens, decode_blocks, tree_sizes.get(replica, 0), cost)
        )
    return scores


def _uniform_index(n: int, rng: RandomSource) -> int:
    return min(int(rng.random() * n), n - 1)


def pick_lowest(scores: Sequence[WorkerScore], rng: RandomSource) -> tuple[WorkerScore, PickReason]:
    """Temperature 0: lowest cost; ties -> smallest tree; still tied -> uniform random."""
    if len(scores) == 1:
        return scores[0], PickReason.ONLY_CANDIDATE
    best_cost = min(s.cost for s in scores)
    best = [s for s in scores if s.cost - best_cost <= COST_TIE_TOLERANCE]
    if len(best) == 1:
        return best[0], PickReason.LOWEST_COST
    smallest_tree = min(s.tree_size for s in best)
    best = [s for s in best if s.tree_size == smallest_tree]
    if len(best) == 1:
        return best[0], PickReason.TIE_SMALLEST_TREE
    return best[_uniform_index(len(best), rng)], PickReason.TIE_RANDOM


def softmax_probabilities(costs: Sequence[float], temperature: float) -> list[float]:
    """p_i ∝ exp(-(c_i - c_min) / ((c_max - c_min) · T)); uniform when all costs are equal."""
    if temperature <= 0:
        raise ValueError("temperature > 0")
    low, high = min(costs), max(costs)
    spread = high - low
    if spread <= COST_TIE_TOLERANCE:
        return [1.0 / len(costs)] * len(costs)
    weights = [math.exp(-(c - low) / (spread * temperature)) for c in costs]
    total = sum(weights)
    return [w / total for w in weights]


def pick_sampled(
    scores: Sequence[WorkerScore], temperature: float, rng: RandomSource
) -> tuple[WorkerScore, PickReason]:
    if len(scores) == 1:
        return scores[0], PickReason.ONLY_CANDIDATE
    probabilities = softmax_probabilities([s.cost for s in scores], temperature)
    u = rng.random()
    cumulative = 0.0
    for score, p in zip(scores, probabilities):
        cumulative += p
        if cumulative >= u:
            return score, PickReason.SAMPLED
    return scores[-1], PickReason.SAMPLED  # rounding left the total a hair below u


def pick(scores: Sequence[WorkerScore], temperature: float, rng: RandomSource) -> tuple[WorkerScore, PickReason]:
    return pick_lowest(scores, rng) if temperature == 0 else pick_sampled(scores, temperature, rng)
