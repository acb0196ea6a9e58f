"""How long a turn that has sent nothing to its client may wait for its worker before the router asks
whether the worker is alive, pure (no clock reads, no I/O).

    deadline_s = min(cap_s, floor_s + uncached_tokens / prefill_tokens_per_s)

`floor_s` covers what every turn pays (connection, queueing behind a step, the first decode step);
`uncached_tokens` is the part of the prompt the chosen worker must prefill (the pick's prediction);
`prefill_tokens_per_s` is the worker's observed prefill rate (`PrefillRates`), or the prior until its
streamed turns measured it. `cap_s` is the hard bound (streamed: the first-token timeout).

Past the deadline the shell probes the worker: one that does not answer is taken for frozen and the turn
fails over (turns.py). A worker that answers is only slow (a queue, a long prefill): the turn keeps
waiting, probing again every `floor_s`, up to `cap_s`.

A rate is learnt from streamed turns only (a non-streamed answer has no first-token time): each sample
is `uncached prompt tokens / time to first token` of a turn that had at least `min_sample_tokens` to
prefill (below it the fixed costs dominate and the "rate" says nothing about prefill). The time to first
token includes any queueing, so a sample underestimates the engine's rate: the deadline errs long,
never short. Samples are smoothed (EWMA, weight `alpha` for the newest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class DeadlineParams:
    floor_s: float = 2.0
    """Deadline of a turn with nothing to prefill."""
    prior_prefill_tokens_per_s: float = 4000.0
    """A worker's prefill rate until its own streamed turns measured it (deliberately slow: errs long)."""
    min_sample_tokens: int = 256
    """Streamed turns with fewer uncached prompt tokens teach no rate."""
    alpha: float = 0.2
    """EWMA weight of the newest rate sample."""

    def __post_init__(self) -> None:
        if not self.floor_s > 0:
            raise ValueError("floor_s > 0")
        if not self.prior_prefill_tokens_per_s > 0:
            raise ValueError("prior_prefill_tokens_per_s > 0")
        if not 0 < self.alpha <= 1:
            raise ValueError("0 < alpha <= 1")


def answer_deadline_s(params: DeadlineParams, uncached_tokens: int, prefill_tokens_per_s: float, cap_s: float) -> float:
    """floor + uncached / rate, at most `cap_s` (a non-positive rate counts as the prior)."""
    rate = prefill_tokens_per_s if prefill_tokens_per_s > 0 else params.prior_prefill_tokens_per_s
    return min(cap_s, params.floor_s + max(0, uncached_tokens) / rate)


class PrefillRates:
    """Each worker's observed prefill rate (tokens/s), from its streamed turns."""

    def __init__(self, params: DeadlineParams) -> None:
        self.params = params
        self._rates: dict[str, float] = {}

    def rate(self, worker_id: str) -> float:
        return self._rates.get(worker_id, self.params.prior_prefill_tokens_per_s)

    def observe(self, worker_id: str, uncached_tokens: int, ttft_s: float) -> bool:
        """Take one streamed turn's sample; False when it teaches nothing (too small, no time)."""
        if uncached_tokens < self.params.min_sample_tokens or ttft_s <= 0:
            return False
        sample = uncached_tokens / ttft_s
        old = self._rates.get(worker_id)
        self._rates[worker_id] = sample if old is None else old + self.params.alpha * (sample - old)
        return True

    def deadline_s(self, worker_id: str, uncached_tokens: int, cap_s: float) -> float:
        return answer_deadline_s(self.params, uncached_tokens, self.rate(worker_id), cap_s)

    def forget(self, live: Iterable[str]) -> None:
        """Drop the rates of workers that left the fleet (a worker that comes back is measured anew)."""
        keep = set(live)
        for worker_id in [w for w in self._rates if w not in keep]:
            del self._rates[worker_id]
