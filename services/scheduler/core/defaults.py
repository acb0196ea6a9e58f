"""What the scheduler service runs with no flags: its control-law defaults and the KvRouter settings it forwards.

The service's flags (services/scheduler/config.py `CONTROL_SETTINGS`) read their defaults from here, and
the offline simulator (harness/simlib) builds its control plane from here, so both run one table.

    service_control_params()                    # the service's control law under cost_aware
    service_control_params("threshold")         # ... under the reference policy (the reference bands)
    policy_control_defaults("cost_aware", 0.9)  # the band defaults that follow --pause-policy
    KvRouterConfig()                            # the KvRouter settings forwarded to routers
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.common.settings import kv_router_flags
from services.common.settings.config import require
from services.scheduler.core.params import ControlParams
from services.scheduler.core.policies import PAUSE_POLICIES, CostAwarePauseParams

# The service runs the cost-aware policy unless told otherwise: it equals the reference ("threshold")
# wherever every context is worth holding and stops pausing where recompute is cheaper than holding
# (docs/policy-study.md). The pure core's own default stays the reference policy.
SERVICE_DEFAULT_PAUSE_POLICY = "cost_aware"

# The control defaults that do not depend on --pause-policy (the seed's, plus resume aging and soft
# pinning, which are ours).
CONTROL_DEFAULTS: dict[str, float | bool] = {
    "resume_priority_boost": 1.0,
    "resume_timeout_seconds": 1800.0,
    "scheduler_interval_seconds": 5.0,
    "soft_demote_priority_jump": -2.0,
    "acting_token_weight": 1.0,
    "acting_decay_tau_seconds": 1.0,
    "program_idle_ttl_seconds": 900.0,
    "soft_pinning": True,
    "resume_aging_seconds": 300.0,
}

# The defaults of the policy-dependent control settings. `threshold` keeps the reference's control
# law exactly. The program-aware law (every other policy) drives the GPU pool toward full rather
# than toward 80%: a pause cycle starts only when the working set reaches the whole budget (1.0,
# where the engine itself would begin to evict) and stops 5% below it, the room the resident
# programs' next turns take (a turn adds its answer and the next observation, about 1-1.5K tokens
# on SWE-agent programs, for the 4-6 programs that share a 128K worker); a resume needs only 3%
# of headroom on top of the program itself. The reference's 20% margin kept a fifth of the pool
# idle and decoded with 60% of it (docs/scheduler.md, "Program-aware bands").
REFERENCE_BANDS = {
    "pause_threshold": 0.95,
    "soft_demote_threshold": 0.80,
    "pause_target": 0.80,
    "resume_hysteresis": 0.10,
    "tail_protection_quantile": 0.0,
    "calibrate_token_estimates": False,
    "resume_wait_discount_seconds": 0.0,
    "pause_margin_quantile": 0.0,
}
PROGRAM_AWARE_PAUSE_THRESHOLD = 1.0
PROGRAM_AWARE_GROWTH_MARGIN = 0.05
"""Pause target and soft-demote start, below the pause threshold: the room the resident programs'
next turns take."""
PROGRAM_AWARE_RESUME_HYSTERESIS = 0.03
PROGRAM_AWARE_TAIL_QUANTILE = 0.75
PROGRAM_AWARE_PAUSE_MARGIN_QUANTILE = 1.0
"""A pause cycle leaves room for this quantile of the growth measured between ticks (at most
PROGRAM_AWARE_GROWTH_MARGIN): 1, the largest growth of the window, so that the bursts fit; a fleet
whose programs grow little then sheds what its growth needs, not a margin that the next tick's
resumes refill (docs/scheduler.md, "The pause margin")."""
PROGRAM_AWARE_RESUME_WAIT_DISCOUNT_SECONDS = 60.0
"""In the resume order a paused program that waited this long counts half its size (chosen on the
tuning split among smallest-first, first-come-first-served and 60 s: docs/policy-study.md)."""


def policy_control_defaults(pause_policy: str, pause_threshold: float | None = None) -> dict[str, float | bool]:
    """The control defaults that depend on the pause policy: the reference's bands under
    `threshold`; otherwise the program-aware bands, whose target and soft-demote start sit
    PROGRAM_AWARE_GROWTH_MARGIN below the pause threshold (the given one, or 1.0), whose working
    set is measured in the workers' tokens (calibrated estimates) and whose resume order discounts
    a paused program's size by its wait."""
    if pause_policy == "threshold":
        return dict(REFERENCE_BANDS)
    threshold = PROGRAM_AWARE_PAUSE_THRESHOLD if pause_threshold is None else pause_threshold
    below = max(0.0, threshold - PROGRAM_AWARE_GROWTH_MARGIN)
    return {
        "pause_threshold": threshold,
        "soft_demote_threshold": below,
        "pause_target": below,
        "resume_hysteresis": min(PROGRAM_AWARE_RESUME_HYSTERESIS, max(0.0, threshold)),
        "tail_protection_quantile": PROGRAM_AWARE_TAIL_QUANTILE,
        "calibrate_token_estimates": True,
        "resume_wait_discount_seconds": PROGRAM_AWARE_RESUME_WAIT_DISCOUNT_SECONDS,
        "pause_margin_quantile": PROGRAM_AWARE_PAUSE_MARGIN_QUANTILE,
    }


def service_control_params(pause_policy: str = SERVICE_DEFAULT_PAUSE_POLICY, **overrides: float) -> ControlParams:
    """The control law the scheduler service runs with no flags and no environment under
    `pause_policy` (its defaults, which add resume aging to the seed's and, under any policy but
    threshold, the program-aware bands), with `overrides` applied."""
    values: dict[str, Any] = dict(CONTROL_DEFAULTS)
    values.update(policy_control_defaults(pause_policy, overrides.get("pause_threshold")))
    values.update(overrides)
    return ControlParams(**values)


_KV = kv_router_flags.BY_NAME


@dataclass(frozen=True)
class KvRouterConfig:
    """KvRouter settings accepted by the scheduler and forwarded to the router unchanged (defaults and rules:
    services/common/settings/kv_router_flags.py)."""

    router_temperature: float = _KV["router_temperature"].default
    kv_overlap_score_weight: float = _KV["kv_overlap_score_weight"].default
    use_kv_events: bool = _KV["use_kv_events"].default
    router_track_active_blocks: bool = _KV["router_track_active_blocks"].default
    router_track_output_blocks: bool = _KV["router_track_output_blocks"].default
    router_track_prefill_tokens: bool = _KV["router_track_prefill_tokens"].default
    router_ttl_secs: float = _KV["router_ttl_secs"].default
    router_block_size: int = _KV["router_block_size"].default

    def __post_init__(self) -> None:
        kv_router_flags.validate(self.as_dict())
        require(
            not self.router_track_output_blocks or self.router_track_active_blocks,
            "router_track_output_blocks",
            self.router_track_output_blocks,
            "router_track_output_blocks requires router_track_active_blocks",
        )

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def check_policy_settings(control: Any, pause_policy: str, cost_aware: Any) -> None:
    """The control law, pause policy and cost-aware settings a scheduler runs with (the service's
    config and the simulator's scenario both check them here). Raises ConfigError naming the rule."""
    require(isinstance(control, ControlParams), "control", control, "control must be ControlParams")
    require(
        pause_policy in PAUSE_POLICIES,
        "pause_policy",
        pause_policy,
        f"pause_policy in {{{', '.join(sorted(PAUSE_POLICIES))}}}",
    )
    require(
        isinstance(cost_aware, CostAwarePauseParams),
        "cost_aware",
        cost_aware,
        "cost_aware must be CostAwarePauseParams",
    )
