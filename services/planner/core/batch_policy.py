"""The batch policy: from one observation, a replica floor (or an exact idle target) and a drain cap.

Pure and deterministic (reference/planner.md §3.3). With S = safe rps per ready replica and
O = online offered rps:

    desired  = expected, else ready + pending (verified start-up), else unknown while scaling, else ready
    usable   = min(ready, desired)                      pending replicas never count for admission
    required = max_k  C_k / (deadline_k - now - cold_start - finalization)   (EDF over deadline jobs,
               C_k the cumulative remaining requests of the k earliest deadlines; inf if a window is <= 0)
    floor    = min(max, max(min, from_zero, ceil((O + min(required, cap)) / S)))
    drain    = min(max(0, usable*S - O), cap, max(0, floor*S - O))   and the floor is raised to sustain it

A drain cap is only positive when every input is fresh and valid (fail closed): otherwise the
policy pauses (cap 0) and holds the current replica count as the floor. With no active job the
cap is 0 and, only when every signal is authoritatively idle, the pool gets an exact warm target
(`idle_replica_target = min_replicas`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from services.planner.core.types import DispatcherFeedback, Inventory, JobDemand, Observation, OnlineTraffic


@dataclass(frozen=True)
class BatchPolicyConfig:
    pool_id: str = "default"
    work_class: str = "default"
    safe_rps_per_ready_replica: float = 1.0
    """S: the batch + online request rate one ready replica sustains safely."""
    cold_start_margin_s: float = 0.0
    finalization_margin_s: float = 0.0
    max_observation_age_s: float = 60.0
    drain_lease_duration_s: float = 60.0
    min_replicas: int = 0
    """Floor while work is active; the exact warm target when everything is idle."""
    max_replicas: int = 1
    scale_from_zero_replicas: int = 1
    max_batch_admission_rps: float | None = None
    """None = no cap; 0 = always paused."""

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"{name}={getattr(self, name)!r}: {rule}")

        if not self.pool_id or not self.work_class:
            raise ValueError("pool_id and work_class must be non-empty")
        if not (math.isfinite(self.safe_rps_per_ready_replica) and self.safe_rps_per_ready_replica > 0):
            raise bad("safe_rps_per_ready_replica", "must be finite and > 0")
        for name in ("cold_start_margin_s", "finalization_margin_s", "max_observation_age_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise bad(name, "must be finite and >= 0")
        if not (math.isfinite(self.drain_lease_duration_s) and self.drain_lease_duration_s > 0):
            raise bad("drain_lease_duration_s", "must be finite and > 0")
        if self.min_replicas < 0:
            raise bad("min_replicas", "must be >= 0")
        if self.max_replicas < self.min_replicas:
            raise bad("max_replicas", "must be >= min_replicas")
        if not 1 <= self.scale_from_zero_replicas <= self.max_replicas:
            raise bad("scale_from_zero_replicas", "must be in [1, max_replicas]")
        cap = self.max_batch_admission_rps
        if cap is not None and not (math.isfinite(cap) and cap >= 0):
            raise bad("max_batch_admission_rps", "must be finite and >= 0")


@dataclass(frozen=True)
class BatchDiagnostics:
    required_batch_rps: float = 0.0
    current_safe_headroom_rps: float | None = None
    planned_batch_capacity_rps: float | None = None
    predicted_finish_wall_s: float | None = None
    minimum_deadline_slack_s: float | None = None
    infeasible: bool = False
    infeasible_reasons: tuple[str, ...] = ()
    safety_paused: bool = False
    active_job_count: int = 0
    remaining_requests: int = 0
    ready_replicas: int | None = None
    desired_replicas: int | None = None
    required_replica_floor: int | None = None
    online_offered_rps: float | None = None
    online_age_s: float | None = None
    oldest_job_age_s: float | None = None
    dispatcher_age_s: float | None = None
    capacity_stale: bool = False
    online_stale: bool = False
    job_stale: bool = False
    dispatcher_stale: bool = False
    actual_dispatch_rps: float | None = None
    applied_max_admission_rps: float | None = None


@dataclass(frozen=True)
class BatchPlan:
    replica_floor: int | None
    """An absolute lower bound on replicas (None = no opinion)."""
    max_admission_rps: float
    decision_id: str
    lease_duration_s: float
    idle_replica_target: int | None = None
    """An exact warm target, set only when everything is authoritatively idle."""
    diagnostics: BatchDiagnostics = field(default_factory=BatchDiagnostics)


@dataclass(frozen=True)
class _Capacity:
    ready: int | None
    desired: int | None
    usable: int | None
    stable: bool


def _capacity(inv: Inventory | None) -> _Capacity:
    if inv is None or inv.ready < 0:
        return _Capacity(None, None, None, False)
    if inv.expected is not None:
        desired = inv.expected
    elif inv.pending > 0:
        desired = inv.ready + inv.pending
    elif inv.scaling_in_progress:
        return _Capacity(inv.ready, None, None, False)
    else:
        desired = inv.ready
    stable = desired == inv.ready and not inv.scaling_in_progress and inv.pending == 0
    return _Capacity(inv.ready, desired, min(inv.ready, desired), stable)


def _age(observed_at_s: float, now_s: float) -> float | None:
    age = now_s - observed_at_s
    return age if math.isfinite(age) else None


def _fresh(observed_at_s: float | None, now_s: float, max_age_s: float) -> bool:
    if observed_at_s is None:
        return False
    age = _age(observed_at_s, now_s)
    return age is not None and 0 <= age <= max_age_s


def _latest_jobs(jobs: tuple[JobDemand, ...], pool_id: str) -> list[JobDemand]:
    by_id: dict[str, JobDemand] = {}
    for job in jobs:
        if job.pool_id != pool_id:
            continue
        seen = by_id.get(job.job_id)
        if seen is None or job.observed_at_s >= seen.observed_at_s:
            by_id[job.job_id] = job
    return sorted(by_id.values(), key=lambda j: j.job_id)


def plan_batch_schedule(
    obs: Observation,
    cfg: BatchPolicyConfig,
    decision_id: str,
    *,
    now_s: float | None = None,
    now_wall_s: float | None = None,
) -> BatchPlan:
    """The plan for one tick. `now_s`/`now_wall_s` default to the observation's (pass the
    publication time to judge freshness when the lease is stamped)."""
    if not decision_id:
        raise ValueError("decision_id is required")
    now = obs.now_s if now_s is None else now_s
    wall = obs.now_wall_s if now_wall_s is None else now_wall_s
    S = cfg.safe_rps_per_ready_replica
    cap_rps = cfg.max_batch_admission_rps
    max_age = cfg.max_observation_age_s
    lease = cfg.drain_lease_duration_s

    capacity = _capacity(obs.inventory)
    hold_floor = None if capacity.desired is None else min(cfg.max_replicas, max(cfg.min_replicas, capacity.desired))
    traffic: OnlineTraffic | None = obs.traffic
    feedback: DispatcherFeedback | None = obs.feedback
    online_fresh = traffic is not None and _fresh(traffic.observed_at_s, now, max_age)
    feedback_fresh = feedback is not None and _fresh(feedback.observed_at_s, now, max_age)
    base: dict[str, Any] = dict(  # BatchDiagnostics fields of several types
        ready_replicas=capacity.ready,
        desired_replicas=capacity.desired,
        online_offered_rps=traffic.offered_rps if traffic else None,
        online_age_s=_age(traffic.observed_at_s, now) if traffic else None,
        dispatcher_age_s=_age(feedback.observed_at_s, now) if feedback else None,
        capacity_stale=capacity.desired is None,
        online_stale=not online_fresh,
        dispatcher_stale=not feedback_fresh,
        actual_dispatch_rps=feedback.actual_dispatch_rps if feedback else None,
        applied_max_admission_rps=feedback.applied_max_admission_rps if feedback else None,
    )

    # No job snapshot at all: pause and hold what is there.
    if obs.jobs is None:
        diag = BatchDiagnostics(
            safety_paused=True, infeasible=True, infeasible_reasons=("batch_observation_missing",), **base
        )
        return BatchPlan(hold_floor, 0.0, decision_id, lease, None, diag)

    jobs = _latest_jobs(obs.jobs, cfg.pool_id)
    active = [j for j in jobs if j.active]
    remaining = sum(max(0, j.remaining_requests) for j in active)
    oldest_age = max((_age(j.observed_at_s, now) or math.inf for j in active), default=None)

    # Idle / no active work: cap 0 (not a pause); an exact warm target only when all is idle.
    if not active:
        idle = (
            capacity.stable
            and online_fresh
            and traffic is not None
            and traffic.offered_rps == 0
            and traffic.active_requests == 0
            and feedback_fresh
            and feedback is not None
            and feedback.queued_requests == 0
            and feedback.inflight_requests == 0
        )
        diag = BatchDiagnostics(required_batch_rps=0.0, **base)
        if idle:
            return BatchPlan(None, 0.0, decision_id, lease, cfg.min_replicas, diag)
        # Hold the current count while batch state is busy or unknown (the dispatcher still has
        # work, or says nothing fresh). Unlike the reference, once batch work is authoritatively
        # drained the policy has no opinion even with online traffic or a moving fleet: the load
        # and program scalers own online capacity here, and a hold floor would veto their
        # scale-downs and every start-up reversal.
        drained = (
            feedback_fresh
            and feedback is not None
            and feedback.queued_requests == 0
            and feedback.inflight_requests == 0
        )
        floor = None if capacity.desired is None or drained else min(cfg.max_replicas, capacity.desired)
        return BatchPlan(floor, 0.0, decision_id, lease, None, diag)

    # Safety gate.
    reasons: list[str] = []
    if capacity.desired is None:
        reasons.append("capacity_observation_missing_or_invalid")
    if traffic is None:
        reasons.append("online_traffic_observation_missing")
    elif not online_fresh:
        reasons.append("online_traffic_observation_stale_or_invalid")
    jobs_ok = True
    if any(not _fresh(j.observed_at_s, now, max_age) for j in active):
        reasons.append("active_job_observation_stale_or_invalid")
        jobs_ok = False
    for j in active:
        if j.remaining_requests < 0 or (j.deadline_wall_s is not None and not math.isfinite(j.deadline_wall_s)):
            reasons.append(f"active_job_invalid:{j.job_id}")
            jobs_ok = False
    for j in active:
        if j.work_class != cfg.work_class:
            reasons.append(f"work_class_mismatch:{j.job_id}:{j.work_class}")
            jobs_ok = False
    from_zero = (
        cfg.scale_from_zero_replicas if capacity.desired == 0 and (cap_rps is None or cap_rps > 0) and jobs_ok else 0
    )
    counts: dict[str, Any] = dict(
        active_job_count=len(active), remaining_requests=remaining, oldest_job_age_s=oldest_age, job_stale=not jobs_ok
    )
    if reasons:
        floor = None if hold_floor is None else max(hold_floor, from_zero)
        diag = BatchDiagnostics(
            safety_paused=True,
            infeasible=True,
            infeasible_reasons=tuple(dict.fromkeys(reasons)),
            required_replica_floor=from_zero or None,
            **counts,
            **base,
        )
        return BatchPlan(floor, 0.0, decision_id, lease, None, diag)

    assert traffic is not None and capacity.usable is not None
    O = traffic.offered_rps  # noqa: E741 -- the symbol of the formula in the module docstring
    # EDF demand bound.
    required = 0.0
    deadline_jobs = sorted(
        (j for j in active if j.deadline_wall_s is not None), key=lambda j: (j.deadline_wall_s, j.job_id)
    )
    cumulative = 0
    prefix: list[tuple[JobDemand, int]] = []
    for j in deadline_jobs:
        cumulative += j.remaining_requests
        prefix.append((j, cumulative))
        window = j.deadline_wall_s - wall - cfg.cold_start_margin_s - cfg.finalization_margin_s  # type: ignore[operator]
        if window <= 0:
            required = math.inf
            reasons.append(f"deadline_window_exhausted:{j.job_id}")
        else:
            required = max(required, cumulative / window)

    uncapped_floor = max(
        cfg.min_replicas,
        from_zero,
        cfg.max_replicas + 1 if math.isinf(required) else math.ceil((O + required) / S - 1e-9),
    )
    if uncapped_floor > cfg.max_replicas:
        reasons.append("required_replica_floor_exceeds_max_replicas")
    actionable = required if cap_rps is None else min(required, cap_rps)
    if cap_rps is not None and required > cap_rps:
        reasons.append("batch_cap_below_required_rps")
    if math.isinf(actionable):
        floor = cfg.max_replicas
    else:
        floor = min(cfg.max_replicas, max(cfg.min_replicas, from_zero, math.ceil((O + actionable) / S - 1e-9)))

    headroom = max(0.0, capacity.usable * S - O)
    candidate = headroom
    if cap_rps is not None:
        candidate = min(candidate, cap_rps)
    if candidate > 0:
        floor = min(cfg.max_replicas, max(floor, math.ceil((O + candidate) / S - 1e-9)))
    planned = max(0.0, floor * S - O)
    if cap_rps is not None:
        planned = min(planned, cap_rps)
    drain = min(candidate, planned)

    start = wall + (cfg.cold_start_margin_s if floor > capacity.usable else 0.0)
    finish = None
    min_slack = None
    if planned > 0:
        finish = start + remaining / planned + cfg.finalization_margin_s
        if prefix:
            min_slack = min(
                j.deadline_wall_s - (start + c / planned + cfg.finalization_margin_s)  # type: ignore[operator]
                for j, c in prefix
            )
            if min_slack < -1e-9:
                reasons.append("negative_deadline_slack")
    elif prefix:
        min_slack = -math.inf
        reasons.append("no_planned_batch_capacity")
    reasons = list(dict.fromkeys(reasons))
    diag = BatchDiagnostics(
        required_batch_rps=required,
        current_safe_headroom_rps=headroom,
        planned_batch_capacity_rps=planned,
        predicted_finish_wall_s=finish,
        minimum_deadline_slack_s=min_slack,
        infeasible=bool(reasons),
        infeasible_reasons=tuple(reasons),
        required_replica_floor=uncapped_floor,
        **counts,
        **base,
    )
    return BatchPlan(floor, drain, decision_id, lease, None, diag)
