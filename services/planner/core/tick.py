"""One planner tick, pure: observation -> decision (lease + replica target, with provenance).

    observe (shell) -> proposals (PROPOSE) -> batch policy at publication time
      -> merge: PROPOSE (load, throughput, programs)
                RECONCILE (min/max replicas, batch floor AT_LEAST, idle target SET)
                CONSTRAIN (GPU budget, power budget: applied last, they outrank the floor)
      -> start-up guard (a reduction of in-progress start-up needs sustained explicit evidence)
      -> no-op suppression -> lease projection (fail closed)

Fail-closed rules (reference §3.7) that live here, each named in `TickDecision.fail_closed`:
`pipeline_failed` / `tick_timeout` / `merge_rejected` (zero lease, no scaling),
`policy_safety_pause` (the policy paused: a missing job snapshot, unknown capacity, stale or
missing traffic, a stale/invalid/mismatched job), `floor_blocked_by_budget` (the final budgets
leave fewer replicas than the batch floor, including a clamp to a no-op). A cap of zero with no
active job (`no_active_jobs`) or a configured cap of 0 is a pause but not a failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from services.planner.core.batch_policy import BatchPlan, BatchPolicyConfig, plan_batch_schedule
from services.planner.core.merge import MergeStep, merge
from services.planner.core.scaling import (
    LoadScalingConfig,
    ProgramScalingConfig,
    ProgramWindows,
    ThroughputScalingConfig,
    load_proposal,
    program_proposal,
    throughput_proposal,
)
from services.planner.core.throughput import EngineRate
from services.planner.core.types import Inventory, LeaseDecision, Observation, Opinion, Stage, TargetKind


@dataclass(frozen=True)
class Budgets:
    gpus_per_replica: float = 1.0
    max_gpu_budget: float = -1.0
    """GPUs the pool may use; negative = no GPU budget."""
    watts_per_replica: float = 0.0
    total_power_limit_w: float = -1.0
    """Watts the pool may draw; negative = no power budget."""

    def opinions(self) -> list[Opinion]:
        out = []
        if self.max_gpu_budget >= 0 and self.gpus_per_replica > 0:
            out.append(
                Opinion(
                    "native_gpu_budget",
                    Stage.CONSTRAIN,
                    TargetKind.AT_MOST,
                    int(math.floor(self.max_gpu_budget / self.gpus_per_replica + 1e-9)),
                    f"max_gpu_budget={self.max_gpu_budget:g}",
                )
            )
        if self.total_power_limit_w >= 0 and self.watts_per_replica > 0:
            out.append(
                Opinion(
                    "native_power_budget",
                    Stage.CONSTRAIN,
                    TargetKind.AT_MOST,
                    int(math.floor(self.total_power_limit_w / self.watts_per_replica + 1e-9)),
                    f"total_power_limit_w={self.total_power_limit_w:g}",
                )
            )
        return out


@dataclass(frozen=True)
class TickSettings:
    batch: BatchPolicyConfig = field(default_factory=BatchPolicyConfig)
    """Also carries the pool's min/max replicas."""
    load: LoadScalingConfig = field(default_factory=LoadScalingConfig)
    throughput: ThroughputScalingConfig = field(default_factory=ThroughputScalingConfig)
    programs: ProgramScalingConfig = field(default_factory=ProgramScalingConfig)
    engine: EngineRate | None = None
    budgets: Budgets = field(default_factory=Budgets)
    startup_reduction_window_s: float = 30.0


@dataclass(frozen=True)
class TickState:
    """What a tick carries to the next: replayable results and evidence windows."""

    throughput_opinion: Opinion | None = None
    throughput_at_s: float | None = None
    program_windows: ProgramWindows = ProgramWindows()
    startup_candidate: tuple | None = None
    startup_since_s: float | None = None


@dataclass(frozen=True)
class TickDecision:
    decision_id: str
    decided_at_s: float
    decided_at_wall_s: float
    lease: LeaseDecision
    scale_to: int | None
    """The replica count to actuate; None = no change."""
    target: int | None
    """The merged target before no-op suppression (None = no opinion)."""
    desired: int | None
    """The verified desired count the target is compared with (None = unknown)."""
    action: str
    plan: BatchPlan
    opinions: tuple[Opinion, ...] = ()
    steps: tuple[MergeStep, ...] = ()
    fail_closed: tuple[str, ...] = ()
    reasons: dict = field(default_factory=dict)
    audit: tuple[str, ...] = ()


def verified_desired(inv: Inventory | None) -> int | None:
    if inv is None or inv.ready < 0:
        return None
    if inv.expected is not None:
        return inv.expected
    if inv.pending > 0:
        return inv.ready + inv.pending
    if inv.scaling_in_progress:
        return None
    return inv.ready


def _proposals(
    obs: Observation, settings: TickSettings, state: TickState, desired: int | None
) -> tuple[list[Opinion], dict, TickState]:
    reasons: dict[str, str] = {}
    opinions: list[Opinion] = []
    op, reasons["load"] = load_proposal(obs, settings.load, desired)
    if op:
        opinions.append(op)
    due = settings.throughput.enabled and (
        state.throughput_at_s is None or obs.now_s - state.throughput_at_s >= settings.throughput.interval_s
    )
    if due:
        op, reasons["throughput"] = throughput_proposal(obs, settings.throughput, settings.engine)
        state = replace(state, throughput_opinion=op, throughput_at_s=obs.now_s)
        if op:
            opinions.append(op)
    elif state.throughput_opinion is not None:
        # Held over between evaluations (HOLD_LAST); a replay is not fresh evidence.
        opinions.append(replace(state.throughput_opinion, replayed=True))
        reasons["throughput"] = "replayed"
    op, reasons["programs"], windows = program_proposal(obs, settings.programs, state.program_windows, desired)
    state = replace(state, program_windows=windows)
    if op:
        opinions.append(op)
    return opinions, reasons, state


def _zero(plan: BatchPlan, pool_id: str) -> LeaseDecision:
    return LeaseDecision(pool_id, 0.0, plan.lease_duration_s, plan.decision_id)


def decide(
    obs: Observation,
    settings: TickSettings,
    state: TickState,
    decision_id: str,
    *,
    now_s: float | None = None,
    now_wall_s: float | None = None,
    pipeline_error: str | None = None,
) -> tuple[TickDecision, TickState]:
    """`now_s`/`now_wall_s` are the publication time (default: the observation's). The batch
    policy judges freshness and stamps the lease there, so observations that went stale while
    the tick ran pause admission instead of publishing a decision derived from old data."""
    now = obs.now_s if now_s is None else max(now_s, obs.now_s)
    wall = obs.now_wall_s if now_wall_s is None else now_wall_s
    cfg = settings.batch
    pool = cfg.pool_id
    plan = plan_batch_schedule(obs, cfg, decision_id, now_s=now, now_wall_s=wall)
    desired = verified_desired(obs.inventory)
    audit: list[str] = []
    fail: list[str] = []

    def finish(
        action: str,
        lease: LeaseDecision,
        scale_to: int | None,
        target: int | None,
        opinions=(),
        steps=(),
        reasons=None,
        new_state: TickState = state,
    ) -> tuple[TickDecision, TickState]:
        line = (
            f"batch_decision action={action} pool_id={pool} replica_floor={plan.replica_floor} "
            f"idle_target={plan.idle_replica_target} max_admission_rps={lease.max_admission_rps:g} "
            f"scale_to={scale_to} decision_id={decision_id}"
        )
        audit.append(line)
        return TickDecision(
            decision_id,
            now,
            wall,
            lease,
            scale_to,
            target,
            desired,
            action,
            plan,
            tuple(opinions),
            tuple(steps),
            tuple(fail),
            dict(reasons or {}),
            tuple(audit),
        ), new_state

    if pipeline_error is not None:
        fail.append("tick_timeout" if pipeline_error == "tick_timeout" else "pipeline_failed")
        audit.append(f"batch_drain_limit_safety_pause:pipeline_action={pipeline_error}:pool_id={pool}")
        return finish(pipeline_error, _zero(plan, pool), None, None)
    try:
        opinions, reasons, new_state = _proposals(obs, settings, state, desired)
    except Exception as exc:  # a proposer bug must not publish a positive lease
        fail.append("pipeline_failed")
        audit.append(f"batch_drain_limit_safety_pause:pipeline_action=pipeline_failed:{type(exc).__name__}")
        return finish("pipeline_failed", _zero(plan, pool), None, None)

    opinions.append(
        Opinion("native_min_replicas", Stage.RECONCILE, TargetKind.AT_LEAST, cfg.min_replicas, "min_replicas")
    )
    opinions.append(
        Opinion("native_max_replicas", Stage.RECONCILE, TargetKind.AT_MOST, cfg.max_replicas, "max_replicas")
    )
    floor = plan.replica_floor
    if plan.idle_replica_target is not None:
        opinions.append(
            Opinion(
                "native_batch_idle_target",
                Stage.RECONCILE,
                TargetKind.SET,
                plan.idle_replica_target,
                "authoritatively_idle",
                priority=0,
            )
        )
    if floor is not None:
        opinions.append(
            Opinion("native_batch_policy", Stage.RECONCILE, TargetKind.AT_LEAST, floor, "batch_floor_needed")
        )
    opinions.extend(settings.budgets.opinions())
    outcome = merge(opinions, desired)
    if outcome.action == "skip_short_circuit":
        fail.append("merge_rejected")
        audit.append(f"batch_drain_limit_safety_pause:pipeline_action=skip_short_circuit:{outcome.reject_reason}")
        return finish("skip_short_circuit", _zero(plan, pool), None, None, opinions, outcome.steps, reasons, new_state)

    target = outcome.replicas
    inv = obs.inventory
    scale_to: int | None = target
    action = "apply"
    # Start-up in progress: never cut pending capacity on a whim.
    if inv is not None and inv.pending > 0 and desired is not None and target is not None and target < desired:
        explicit = any(
            o.stage is Stage.PROPOSE
            and not o.replayed
            and o.kind in (TargetKind.SET, TargetKind.AT_MOST)
            and o.replicas is not None
            and o.replicas <= inv.ready
            for o in opinions
        )
        candidate = (target, inv.signature, floor)
        if not explicit:
            scale_to, action = None, "startup_hold"
            new_state = replace(new_state, startup_candidate=None, startup_since_s=None)
        elif new_state.startup_candidate != candidate:
            scale_to, action = None, "startup_window_started"
            new_state = replace(new_state, startup_candidate=candidate, startup_since_s=now)
        elif now - (new_state.startup_since_s or now) < settings.startup_reduction_window_s:
            scale_to, action = None, "startup_window_pending"
        else:
            action = "startup_reduction"
    else:
        new_state = replace(new_state, startup_candidate=None, startup_since_s=None)
    if scale_to is not None and desired is not None and scale_to == desired:
        scale_to = None
    if (
        scale_to is not None
        and desired is None
        and inv is not None
        and scale_to == inv.ready
        and not inv.scaling_in_progress
    ):
        scale_to = None
    if action == "apply" and not any(o.stage is Stage.PROPOSE for o in opinions) and scale_to is None:
        action = "no_change"

    effective = scale_to if scale_to is not None else desired
    lease = LeaseDecision(pool, plan.max_admission_rps, plan.lease_duration_s, decision_id)
    if floor is not None and (effective is None or effective < floor):
        fail.append("floor_blocked_by_budget")
        audit.append(
            f"batch_floor_blocked_by_final_budget:pool_id={pool}:replica_floor={floor}:"
            f"effective={effective}:decision_id={decision_id}"
        )
        lease = _zero(plan, pool)
    elif plan.diagnostics.safety_paused:
        fail.append("policy_safety_pause")
        audit.append(
            "batch_drain_limit_safety_pause:reason=policy_safety_pause:policy_reasons="
            + ",".join(plan.diagnostics.infeasible_reasons)
            + f":pool_id={pool}"
        )
    return finish(action, lease, scale_to, target, opinions, outcome.steps, reasons, new_state)
