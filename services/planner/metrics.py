"""Prometheus metrics of the planner, on the ServiceHost's per-instance registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

FAIL_CLOSED_REASONS = (
    "policy_safety_pause",
    "floor_blocked_by_budget",
    "pipeline_failed",
    "tick_timeout",
    "merge_rejected",
    "lease_failed",
    "lease_unknown",
    "scale_failed",
    "scale_unknown",
)


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.lease_rps = Gauge(
            "bandmaster_planner_lease_max_admission_rps", "Rate of the last published lease", registry=r
        )
        self.lease_valid_until = Gauge(
            "bandmaster_planner_lease_valid_until_seconds", "Wall-clock expiry of the last published lease", registry=r
        )
        self.lease_sequence = Gauge(
            "bandmaster_planner_lease_writer_sequence", "Writer sequence of the last lease", registry=r
        )
        self.target_replicas = Gauge(
            "bandmaster_planner_target_replicas", "Merged replica target of the last tick (-1 = no opinion)", registry=r
        )
        self.ready_replicas = Gauge(
            "bandmaster_planner_ready_replicas", "Ready replicas seen (-1 = unknown)", registry=r
        )
        self.replica_floor = Gauge(
            "bandmaster_planner_batch_replica_floor", "Batch replica floor (-1 = none)", registry=r
        )
        self.fail_closed = Counter(
            "bandmaster_planner_fail_closed", "Ticks that failed closed, by reason", ["reason"], registry=r
        )
        self.lease_fail_closed = Gauge(
            "bandmaster_planner_lease_fail_closed",
            "1 while lease writes fail or have an unknown outcome (no lease, no scaling: failing closed); "
            "0 once one is applied",
            registry=r,
        )
        self.ticks = Counter("bandmaster_planner_ticks", "Ticks by action", ["action"], registry=r)
        self.tick_seconds = Histogram(
            "bandmaster_planner_tick_seconds",
            "Duration of one tick (observe + decide + effects)",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1, 5, 10, 30),
            registry=r,
        )
        self.lease_publish_seconds = Histogram(
            "bandmaster_planner_lease_publish_seconds",
            "Time to publish one lease to the store (acknowledged)",
            buckets=(0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.effects = Counter(
            "bandmaster_planner_effects", "Effects by kind and outcome", ["effect", "outcome"], registry=r
        )
        self.scale_actions = Counter(
            "bandmaster_planner_scale_actions", "Replica changes actuated", ["direction"], registry=r
        )
        self.batches = Counter(
            "bandmaster_planner_batch_transitions",
            "Batch job status transitions (expiry at the planner)",
            ["status"],
            registry=r,
        )
        for reason in FAIL_CLOSED_REASONS:
            self.fail_closed.labels(reason)
