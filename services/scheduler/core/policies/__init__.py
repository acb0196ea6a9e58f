"""Pause policies, registered explicitly here and nowhere else.

To add a policy: write `policies/<name>.py` with a params dataclass, a policy class implementing
`PausePolicy.plan` (and, optionally, the `WorkingSetHooks` of policies/base.py), a factory, the
formula in its docstring and a table test; then add one line to `PAUSE_POLICIES`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from services.common.settings.errors import ConfigError
from services.scheduler.core.policies.base import PauseContext, PausePlan, PausePolicy, WorkingSetHooks
from services.scheduler.core.policies.cost_aware import (
    CostAwarePauseParams,
    CostAwarePausePolicy,
    make_cost_aware_policy,
)
from services.scheduler.core.policies.threshold import (
    ThresholdPauseParams,
    ThresholdPausePolicy,
    make_threshold_policy,
)


class PolicyEntry(NamedTuple):
    params_type: type
    factory: Callable[[Any], PausePolicy]


PAUSE_POLICIES: dict[str, PolicyEntry] = {
    "threshold": PolicyEntry(ThresholdPauseParams, make_threshold_policy),
    "cost_aware": PolicyEntry(CostAwarePauseParams, make_cost_aware_policy),
}

DEFAULT_PAUSE_POLICY = "threshold"


def make_pause_policy(name: str = DEFAULT_PAUSE_POLICY, params: Any = None) -> PausePolicy:
    entry = PAUSE_POLICIES.get(name)
    if entry is None:
        raise ConfigError("pause_policy", name, f"pause_policy must be one of {', '.join(sorted(PAUSE_POLICIES))}")
    if params is not None and not isinstance(params, entry.params_type):
        raise ConfigError("pause_policy", name, f"params must be {entry.params_type.__name__}")
    return entry.factory(params)


__all__ = [
    "CostAwarePauseParams",
    "CostAwarePausePolicy",
    "DEFAULT_PAUSE_POLICY",
    "PAUSE_POLICIES",
    "PauseContext",
    "PausePlan",
    "PausePolicy",
    "ThresholdPauseParams",
    "ThresholdPausePolicy",
    "WorkingSetHooks",
    "make_cost_aware_policy",
    "make_pause_policy",
    "make_threshold_policy",
]
