"""Domain <-> protobuf for the planner. Protobuf types stop here."""

from __future__ import annotations

import math

from google.protobuf.timestamp_pb2 import Timestamp

from bandmaster.planner.v1 import planner_pb2 as pb
from services.planner.core.types import Lease, Stage, TargetKind

_STATE = {
    "validating": pb.BATCH_JOB_STATE_QUEUED,
    "in_progress": pb.BATCH_JOB_STATE_RUNNING,
    "finalizing": pb.BATCH_JOB_STATE_RUNNING,
    "completed": pb.BATCH_JOB_STATE_DONE,
    "failed": pb.BATCH_JOB_STATE_FAILED,
    "cancelling": pb.BATCH_JOB_STATE_CANCELLED,
    "cancelled": pb.BATCH_JOB_STATE_CANCELLED,
    "expired": pb.BATCH_JOB_STATE_EXPIRED,
}
_PROVENANCE = {
    Stage.PROPOSE: pb.PROVENANCE_PROPOSE,
    Stage.RECONCILE: pb.PROVENANCE_RECONCILE,
    Stage.CONSTRAIN: pb.PROVENANCE_CONSTRAIN,
}


def _ts(seconds: float | None) -> Timestamp:
    ts = Timestamp()
    if seconds is not None:
        ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def lease_to_proto(lease: Lease | None) -> pb.Lease:
    if lease is None:
        return pb.Lease()
    return pb.Lease(
        pool_id=lease.pool_id,
        max_admission_rps=lease.max_admission_rps,
        valid_until_unix_ms=lease.valid_until_unix_ms,
        decision_id=lease.decision_id,
        writer_epoch=lease.writer_epoch,
        writer_sequence=lease.writer_sequence,
    )


def job_to_proto(job: dict) -> pb.BatchJob:
    """A JobStore row -> BatchJob (every planner job is external: dispatched outside the planner)."""
    return pb.BatchJob(
        job_id=job["id"],
        pool_id=job["pool_id"],
        total_requests=job["total"],
        dispatched_requests=job["dispatched"],
        completed_requests=job["completed"],
        failed_requests=job["failed"],
        deadline=_ts(job["expires_at"]),
        state=_STATE.get(job["status"], pb.BATCH_JOB_STATE_UNSPECIFIED),
        submitted_at=_ts(job["created_at"]),
        status=job["status"],
        external=True,
    )


def _finite(v: float | None, default: float = 0.0) -> float:
    if v is None:
        return default
    return v if not math.isnan(v) else default


def plan_to_proto(record) -> pb.Plan:
    """A TickRecord (services.planner.loop) -> Plan."""
    d = record.decision
    obs = record.observation
    plan = d.plan
    diag = plan.diagnostics
    targets = []
    changed = {(s.source, s.stage) for s in d.steps}
    for s in d.steps:
        targets.append(
            pb.ReplicaTarget(
                pool_id=d.lease.pool_id,
                replicas=-1 if s.value is None else s.value,
                provenance=_PROVENANCE[s.stage],
                reason=s.reason,
                source=s.source,
                effect=s.effect,
                kind=s.kind.value,
            )
        )
    for o in d.opinions:
        if (o.source, o.stage) in changed:
            continue
        targets.append(
            pb.ReplicaTarget(
                pool_id=d.lease.pool_id,
                replicas=-1 if o.replicas is None else o.replicas,
                provenance=_PROVENANCE[o.stage],
                reason=o.reason,
                source=o.source,
                effect="opinion",
                kind=o.kind.value,
                replayed=o.replayed,
            )
        )
    if d.target is not None:
        targets.append(
            pb.ReplicaTarget(
                pool_id=d.lease.pool_id,
                replicas=d.target,
                provenance=pb.PROVENANCE_FAIL_CLOSED if d.fail_closed else pb.PROVENANCE_CONSTRAIN,
                reason=d.action,
                source="final",
                effect="final",
                kind=TargetKind.SET.value,
            )
        )
    inv = obs.inventory
    fb = obs.feedback
    active = [j for j in (obs.jobs or ()) if j.active]
    summary = pb.ObservationSummary(
        jobs_known=obs.jobs is not None,
        active_jobs=len(active),
        remaining_requests=sum(max(0, j.remaining_requests) for j in active),
        traffic_known=obs.traffic is not None,
        online_offered_rps=obs.traffic.offered_rps if obs.traffic else 0.0,
        inventory_known=inv is not None,
        ready_replicas=inv.ready if inv else 0,
        desired_replicas=-1 if d.desired is None else d.desired,
        pending_replicas=inv.pending if inv else 0,
        scaling_in_progress=inv.scaling_in_progress if inv else False,
        feedback_known=fb is not None,
        queued_requests=fb.queued_requests if fb else 0,
        inflight_requests=fb.inflight_requests if fb else 0,
        actual_dispatch_rps=fb.actual_dispatch_rps if fb else 0.0,
        programs_known=obs.programs is not None,
        paused_programs=obs.programs.paused_programs if obs.programs else 0,
        utilization=_finite(obs.programs.utilization if obs.programs else None),
        source_errors=list(obs.errors),
    )
    leases = [lease_to_proto(record.lease)] if record.lease is not None else []
    return pb.Plan(
        decision_id=d.decision_id,
        decided_at=_ts(d.decided_at_wall_s),
        leases=leases,
        targets=targets,
        audit=list(d.audit),
        action=d.action,
        fail_closed_reasons=list(record.fail_closed),
        policy_reasons=list(diag.infeasible_reasons),
        has_replica_floor=plan.replica_floor is not None,
        replica_floor=plan.replica_floor or 0,
        has_idle_target=plan.idle_replica_target is not None,
        idle_target=plan.idle_replica_target or 0,
        has_scale_to=d.scale_to is not None,
        scale_to=d.scale_to or 0,
        advisory=record.advisory,
        effects_outcome=record.effects_outcome,
        effects_error=record.effects_error,
        required_batch_rps=diag.required_batch_rps,
        planned_batch_capacity_rps=_finite(diag.planned_batch_capacity_rps),
        minimum_deadline_slack_s=_finite(diag.minimum_deadline_slack_s),
        observation=summary,
        proposer_reasons={k: str(v) for k, v in d.reasons.items()},
        tick_seconds=record.tick_seconds,
    )
