"""The pause policies' parameters: validated, immutable settings, kept apart from the policies'
hot code so that the policy modules can be compiled (docs/scheduler.md, "The compiled core") while
these stay ordinary Python dataclasses (a compiled class keeps none of a dataclass's class-level
defaults, and validation with a nested function is beyond the compiler)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.common.settings.errors import ConfigError


@dataclass(frozen=True)
class ThresholdPauseParams:
    mark_all_reasoning: bool = False
    """Mark every unmarked REASONING program once pausing ACTING ones was not enough (upstream),
    instead of just enough of them (default; upstream's sticky broad marks are a known bug)."""


@dataclass(frozen=True)
class CostAwarePauseParams:
    prefill_tokens_per_s: float = 18_000.0
    """Prior prefill rate rho0 (tokens/s) until time-to-first-token observations arrive
    (GLM-4.5-FP8 on 8x H200 at short context, shared/traces/TIMING.md)."""
    prefill_quadratic_tokens: float = 77_000.0
    """K: context length at which attention doubles the linear prefill cost."""
    tool_seconds: float = 2.0
    """Prior mean tool time m0 (s) until tool times are observed."""
    stall_share: float = 1.0
    """sigma: share of the replica's budget counted as waiting while a context is recomputed
    (0: only the program's own KV, the paper's c^2 space-time; 1: the whole batch stalls). 1 is
    what an engine with chunked prefill mixed into decode steps (SGLang, vLLM) does: every
    decoding request waits for the recompute's chunks, so evicting costs C * r(T) KV
    token-seconds against T * m for holding, and a context is held iff r(T) >= (T / C) * m
    (docs/policy-study.md, "Calibrated estimates and sigma")."""
    prior_observations: float = 8.0
    """n0: weight of the static defaults, in observations."""
    half_life_observations: float = 200.0
    """Observations after which an observation counts half (tracks workload drift)."""
    min_hold_fraction: float = 1.0
    """phi_min: a context with phi below this is let go entirely (weight 0): the engine manages it
    as plain KV-aware routing would, and it is never paused or held. The default 1 makes the rule
    binary (hold iff E >= H), which beat smooth weights in the policy study: a replica mixing
    partly-held contexts paid both the pauses and the thrashing."""
    scale_reasoning: bool = True
    """Weigh REASONING programs by phi too: a context not worth holding is not worth reserving
    room for either; its turns queue in the engine (at step granularity) rather than in the
    paused queue (at tick granularity)."""
    mark_all_reasoning: bool = False
    """As in the threshold policy."""

    def __post_init__(self) -> None:
        def finite(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(name, value, f"{name} must be a finite number")
            return value

        for name, rule in (
            ("prefill_tokens_per_s", "> 0"),
            ("prefill_quadratic_tokens", "> 0"),
            ("tool_seconds", "> 0"),
            ("half_life_observations", "> 0"),
        ):
            if not finite(name) > 0:
                raise ConfigError(name, getattr(self, name), f"{name} {rule}")
        if not 0 <= finite("stall_share") <= 1:
            raise ConfigError("stall_share", self.stall_share, "0 <= stall_share <= 1")
        if not 0 <= finite("min_hold_fraction") <= 1:
            raise ConfigError("min_hold_fraction", self.min_hold_fraction, "0 <= min_hold_fraction <= 1")
        if not finite("prior_observations") > 0:
            raise ConfigError("prior_observations", self.prior_observations, "prior_observations > 0")
