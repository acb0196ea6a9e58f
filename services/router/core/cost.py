"""Cost policies: what one candidate replica would cost if the request landed there (lower wins).

Each policy is a pure function of `CostInputs`; they are registered explicitly in
`COST_POLICIES`, and `make_cost_policy` builds the configured one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from services.common.settings.errors import ConfigError


@dataclass(frozen=True)
class CostInputs:
    """Everything a cost formula may look at for one candidate."""

    potential_prefill_tokens: int  # active prefill of the replica + this prompt's uncached tokens
    potential_decode_blocks: int  # active decode blocks of the replica + this prompt's new blocks
    block_size: int  # tokens per block
    overlap_weight: float  # kv_overlap_score_weight (possibly overridden per request)


class CostPolicy(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, inputs: CostInputs) -> float: ...


@dataclass(frozen=True)
class ClassicCost:
    """Dynamo's classic KV router logit (reference §A.5):

        potential_prefill_blocks = (active_prefill_tokens + max(isl - overlap_blocks * B, 0)) / B
        potential_decode_blocks  = active_decode_blocks + prompt blocks not active on the replica
        cost = overlap_weight * potential_prefill_blocks + potential_decode_blocks

    The prefill term is a float (not rounded); the overlap lowers it, so the weight trades cache
    hits (TTFT) against decode balance (ITL).
    """

    name: str = "classic"

    def __call__(self, inputs: CostInputs) -> float:
        prefill_blocks = inputs.potential_prefill_tokens / inputs.block_size
        return inputs.overlap_weight * prefill_blocks + inputs.potential_decode_blocks


@dataclass(frozen=True)
class LMetricCost:
    """Dynamo's `lmetric` selection policy (reference §A.6), with the default overlap credit:

        cost = overlap_weight * potential_prefill_blocks * (potential_decode_blocks + 1)

    A product instead of a sum: an idle replica (few decode blocks) makes even a large prefill
    cheap, and a fully cached prompt on a busy replica is not free. The weight scales the
    prefill factor as `prefill_load_scale` does upstream (0 makes every replica cost 0, i.e.
    ties broken by tree size then at random).
    """

    name: str = "lmetric"

    def __call__(self, inputs: CostInputs) -> float:
        prefill_blocks = inputs.overlap_weight * inputs.potential_prefill_tokens / inputs.block_size
        return prefill_blocks * (inputs.potential_decode_blocks + 1)


COST_POLICIES: dict[str, Callable[[], CostPolicy]] = {
    "classic": ClassicCost,
    "lmetric": LMetricCost,
}


def make_cost_policy(name: str) -> CostPolicy:
    factory = COST_POLICIES.get(name)
    if factory is None:
        raise ConfigError("cost_policy", name, f"cost_policy in {{{', '.join(COST_POLICIES)}}}")
    return factory()
