"""Scaling proposals (PROPOSE stage): reactive load, predictive throughput, and program-aware.

Each proposer is a pure function of the observation (and, for the windowed ones, an explicit
state it returns updated). Each returns an `Opinion` or None with the reason it had none.

* load (reactive, reference §2.3 "easy mode"): +1 if any engine's KV usage is above
  `scale_up_kv_usage` or it queues at least `scale_up_queued` requests; -1 if every engine is
  below `scale_down_kv_usage` with an empty queue and there is more than one replica. No opinion
  while the fleet is changing, without load data, or when the engines counted disagree with the
  ready replicas.
* throughput (reference §2.2): ceil(online offered rps / engine rps) where engine rps comes from
  the worker's timing profile (`core.throughput`). A lower bound (AT_LEAST) when load scaling is
  on, else a SET.
* programs (ours): the scheduler's view. Programs paused longer than `pause_window_s`, or mean
  retention utilisation at or above `scale_up_utilization` for `utilization_window_s`, propose
  +1; utilisation below `scale_down_utilization` for the window, with nothing paused, proposes
  -1 only if the consolidated utilisation u*N/(N-1) stays below `scale_up_utilization`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from services.planner.core.throughput import EngineRate
from services.planner.core.types import Observation, Opinion, Stage, TargetKind


@dataclass(frozen=True)
class LoadScalingConfig:
    enabled: bool = True
    scale_up_kv_usage: float = 0.9
    scale_down_kv_usage: float = 0.3
    scale_up_queued: int = 4


@dataclass(frozen=True)
class ThroughputScalingConfig:
    enabled: bool = False
    interval_s: float = 60.0
    as_lower_bound: bool = True


@dataclass(frozen=True)
class ProgramScalingConfig:
    enabled: bool = True
    pause_window_s: float = 30.0
    utilization_window_s: float = 30.0
    scale_up_utilization: float = 0.95
    scale_down_utilization: float = 0.5


@dataclass(frozen=True)
class ProgramWindows:
    """When the current high / low utilisation streak started (monotonic s), None = no streak."""

    high_since_s: float | None = None
    low_since_s: float | None = None


def load_proposal(obs: Observation, cfg: LoadScalingConfig, desired: int | None) -> tuple[Opinion | None, str]:
    if not cfg.enabled:
        return None, "disabled"
    inv = obs.inventory
    if inv is None:
        return None, "no_inventory"
    if inv.scaling_in_progress or inv.pending > 0 or inv.expected is None or desired is None:
        return None, "scaling_in_progress"
    if obs.loads is None:
        return None, "no_load_data"
    if len(obs.loads) != inv.ready:
        return None, "worker_count_mismatch"
    if inv.ready == 0:
        return None, "no_workers"
    if any(
        load.token_usage > cfg.scale_up_kv_usage or load.queued_requests >= cfg.scale_up_queued for load in obs.loads
    ):
        return Opinion("load", Stage.PROPOSE, TargetKind.SET, desired + 1, "scale_up", priority=10), "scale_up"
    if inv.ready > 1 and all(
        load.token_usage < cfg.scale_down_kv_usage and load.queued_requests == 0 for load in obs.loads
    ):
        return Opinion("load", Stage.PROPOSE, TargetKind.SET, desired - 1, "scale_down", priority=10), "scale_down"
    return None, "no_change"


def throughput_proposal(
    obs: Observation, cfg: ThroughputScalingConfig, engine: EngineRate | None
) -> tuple[Opinion | None, str]:
    if not cfg.enabled:
        return None, "disabled"
    if engine is None or engine.rps <= 0:
        return None, "model_not_ready"
    if obs.traffic is None:
        return None, "no_traffic"
    replicas = max(1, math.ceil(obs.traffic.offered_rps / engine.rps - 1e-9)) if obs.traffic.offered_rps > 0 else 0
    kind = TargetKind.AT_LEAST if cfg.as_lower_bound else TargetKind.SET
    reason = "set_lower_bound" if cfg.as_lower_bound else "scale"
    return Opinion("throughput", Stage.PROPOSE, kind, replicas, reason, priority=20), reason


def program_proposal(
    obs: Observation, cfg: ProgramScalingConfig, windows: ProgramWindows, desired: int | None
) -> tuple[Opinion | None, str, ProgramWindows]:
    if not cfg.enabled:
        return None, "disabled", ProgramWindows()
    sig = obs.programs
    if sig is None or desired is None:
        return None, "no_program_signal", ProgramWindows()
    now = obs.now_s
    util = sig.utilization
    high = util is not None and util >= cfg.scale_up_utilization
    low = util is not None and util < cfg.scale_down_utilization and sig.paused_programs == 0
    windows = ProgramWindows(
        high_since_s=(windows.high_since_s if windows.high_since_s is not None else now) if high else None,
        low_since_s=(windows.low_since_s if windows.low_since_s is not None else now) if low else None,
    )
    inv = obs.inventory
    changing = inv is None or inv.scaling_in_progress or inv.pending > 0
    if sig.paused_programs > 0 and sig.longest_pause_s is not None and sig.longest_pause_s >= cfg.pause_window_s:
        if changing:
            return None, "scaling_in_progress", windows
        return (
            Opinion("programs", Stage.PROPOSE, TargetKind.SET, desired + 1, "programs_paused_too_long", priority=5),
            "programs_paused_too_long",
            windows,
        )
    if high and now - windows.high_since_s >= cfg.utilization_window_s:  # type: ignore[operator]
        if changing:
            return None, "scaling_in_progress", windows
        return (
            Opinion("programs", Stage.PROPOSE, TargetKind.SET, desired + 1, "retention_pressure_sustained", priority=5),
            "retention_pressure_sustained",
            replace(windows, high_since_s=now),
        )
    if low and now - windows.low_since_s >= cfg.utilization_window_s:  # type: ignore[operator]
        if changing or desired <= 1:
            return None, "no_change", windows
        consolidated = util * desired / (desired - 1)  # type: ignore[operator]
        if consolidated >= cfg.scale_up_utilization:
            return None, "scale_down_refused_consolidation", windows
        return (
            Opinion("programs", Stage.PROPOSE, TargetKind.SET, desired - 1, "retention_slack_sustained", priority=5),
            "retention_slack_sustained",
            replace(windows, low_since_s=now),
        )
    return None, "no_change", windows
