"""Token-estimate calibration: the router's prompt estimates, corrected by what the workers report.

A turn's size reaches the scheduler twice. At `Admit` the router sends an estimate (without a
tokenizer: `len(text) // 4`, the usual rule of thumb for English; with `--tokenizer`: the exact
count). At `Complete` the worker reports the prompt tokens it actually held. The working set of a
REASONING program is its estimate, so a biased estimate biases every band: an estimate 25% high
(the simulated workers' tokenizer makes about five characters a token) pauses programs while a
fifth of the pool is still free, and one 25% low (code under a real BPE tokenizer, nearer three
characters a token) lets the pool overflow into evictions.

So the scheduler learns the ratio and applies it:

    ratio    = (n0 + sum of decayed reported prompt tokens) / (n0 + sum of decayed estimates)
    charged  = round(estimate * ratio)

over turns whose worker reported a prompt (an estimate of 0, "unknown", is never scaled). n0 =
PRIOR_TOKENS pseudo-tokens at ratio 1 keep the first turns at the estimate; each observation's
weight halves after HALF_LIFE_OBSERVATIONS more, so the ratio follows a change of workload or
model; and the ratio stays within [1 / MAX_RATIO, MAX_RATIO], so one broken report cannot blow
the working set up or wipe it out. Exact estimates (a router with a tokenizer) give ratio 1.
"""

from __future__ import annotations

import math

PRIOR_TOKENS = 32_768.0
HALF_LIFE_OBSERVATIONS = 200.0
MAX_RATIO = 4.0


class DecayedRatio:
    """(prior numerator + sum of decayed a) / (prior denominator + sum of decayed b) over observed
    pairs (a, b), each observation's weight halving after `half_life` more. A decayed mean is the
    ratio with b = 1 (the cost-aware policy's tool time); the calibration below is one of sizes."""

    __slots__ = ("_keep", "_prior_num", "_prior_den", "_num", "_den", "observations")

    def __init__(self, prior_num: float, prior_den: float, half_life: float) -> None:
        self._keep = 2.0 ** (-1.0 / half_life)
        self._prior_num = prior_num
        self._prior_den = prior_den
        self._num = self._den = 0.0
        self.observations = 0

    def observe(self, a: float, b: float) -> None:
        self._num = self._num * self._keep + a
        self._den = self._den * self._keep + b
        self.observations += 1

    @property
    def value(self) -> float:
        return (self._prior_num + self._num) / (self._prior_den + self._den)


class EstimateCalibration:
    """The learnt ratio of reported prompt tokens to the router's estimates (pure, no clock)."""

    __slots__ = ("_ratio",)

    def __init__(self) -> None:
        self._ratio = DecayedRatio(PRIOR_TOKENS, PRIOR_TOKENS, HALF_LIFE_OBSERVATIONS)

    @property
    def observations(self) -> int:
        return self._ratio.observations

    @property
    def ratio(self) -> float:
        return min(MAX_RATIO, max(1.0 / MAX_RATIO, self._ratio.value))

    def observe(self, estimate: int, reported: int) -> None:
        """A turn admitted with `estimate` tokens whose worker reported `reported` prompt tokens."""
        if estimate > 0 and reported > 0:
            self._ratio.observe(float(reported), float(estimate))

    def apply(self, estimate: int) -> int:
        """The estimate in the workers' tokens (0 stays 0: no estimate)."""
        if estimate <= 0:
            return 0
        return max(1, math.floor(estimate * self.ratio + 0.5))
