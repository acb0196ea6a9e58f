"""Builders for planner core tests: one observation with sensible fresh defaults."""

from __future__ import annotations

from services.planner.core.batch_policy import BatchPolicyConfig
from services.planner.core.types import DispatcherFeedback, Inventory, JobDemand, Observation, OnlineTraffic

NOW = 1_000.0
WALL = 1_700_000_000.0
_DEFAULT = object()


def job(
    job_id="job-a",
    remaining=600,
    due_in_s: float | None = 100.0,
    *,
    status="in_progress",
    age_s=0.0,
    work_class="default",
    total=None,
    completed=0,
    failed=0,
    pool_id="default",
) -> JobDemand:
    total = remaining + completed + failed if total is None else total
    return JobDemand(
        job_id,
        status,
        total,
        completed,
        failed,
        None if due_in_s is None else WALL + due_in_s,
        NOW - age_s,
        work_class,
        pool_id,
    )


def traffic(rps=90.0, *, active: int | None = 3, age_s=0.0) -> OnlineTraffic:
    return OnlineTraffic(NOW - age_s, rps, active)


def feedback(queued=0, inflight=0, *, age_s=0.0, rps=0.0, cap: float | None = None) -> DispatcherFeedback:
    return DispatcherFeedback(NOW - age_s, 5.0, queued, inflight, rps, cap)


def inventory(ready=10, expected=_DEFAULT, *, scaling=False, pending=0) -> Inventory:
    exp = ready if expected is _DEFAULT else expected
    return Inventory(NOW, ready, exp, scaling, pending)


def obs(
    jobs=_DEFAULT, *, traffic_=_DEFAULT, feedback_=_DEFAULT, inv=_DEFAULT, loads=None, programs=None
) -> Observation:
    return Observation(
        now_s=NOW,
        now_wall_s=WALL,
        jobs=(job(),) if jobs is _DEFAULT else (None if jobs is None else tuple(jobs)),
        traffic=traffic() if traffic_ is _DEFAULT else traffic_,
        feedback=feedback() if feedback_ is _DEFAULT else feedback_,
        inventory=inventory() if inv is _DEFAULT else inv,
        loads=loads,
        programs=programs,
    )


def cfg(**kw) -> BatchPolicyConfig:
    base = dict(
        safe_rps_per_ready_replica=10.0,
        min_replicas=1,
        max_replicas=20,
        drain_lease_duration_s=15.0,
        max_observation_age_s=60.0,
    )
    base.update(kw)
    return BatchPolicyConfig(**base)
