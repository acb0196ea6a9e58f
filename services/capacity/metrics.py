"""Prometheus metrics of the capacity service, on the ServiceHost's per-instance registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.capacity.core.cards import CapacityView
from services.capacity.core.state import CardRejectReason, Degradation, Health, PollFailureReason


class CapacityMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.workers = Gauge(
            "bandmaster_capacity_workers", "Registered workers by health", ["health"], registry=registry
        )
        self.retention_tokens = Gauge(
            "bandmaster_capacity_replica_retention_tokens",
            "Retention budget per replica (worker_id, dp_rank) and where the figure comes from",
            ["worker_id", "dp_rank", "source"],
            registry=registry,
        )
        self.total_retention_tokens = Gauge(
            "bandmaster_capacity_total_retention_tokens", "Retention budget over HEALTHY replicas", registry=registry
        )
        self.poll_failures = Counter(
            "bandmaster_capacity_poll_failures_total", "Failed polls by reason", ["reason"], registry=registry
        )
        self.card_rejections = Counter(
            "bandmaster_capacity_card_rejections_total",
            "Transitions to a rejected /server_info card, by reason",
            ["reason"],
            registry=registry,
        )
        self.recompute_seconds = Histogram(
            "bandmaster_capacity_recompute_seconds",
            "Time to recompute the view and build the snapshot",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        self.worker_degraded = Gauge(
            "bandmaster_capacity_worker_degraded",
            "1 while a server argument Bandmaster relies on is off on the worker (reason: cache_report_off, "
            "priority_scheduling_off), else 0; one series per reason for every worker with a card",
            ["worker_id", "reason"],
            registry=registry,
        )
        self.watchers = Gauge("bandmaster_capacity_watchers", "Open WatchWorkers streams", registry=registry)
        self.version = Gauge(
            "bandmaster_capacity_snapshot_version", "Version of the latest snapshot", registry=registry
        )
        self.router_load_reporters = Gauge(
            "bandmaster_capacity_router_load_reporters",
            "Routers whose load report is live (router replica sync; 0 when no router has the flag)",
            registry=registry,
        )
        self.router_load_watchers = Gauge(
            "bandmaster_capacity_router_load_watchers", "Open WatchRouterLoads streams", registry=registry
        )
        # Every label value exists from the start: a scrape sees 0, not an absent series, so rate() and
        # alerts on these counters work before the first failure.
        for health in Health:
            self.workers.labels(health.value)
        for poll_reason in PollFailureReason:
            self.poll_failures.labels(poll_reason.value)
        for card_reason in CardRejectReason:
            self.card_rejections.labels(card_reason.value)
        self._retention_seen: dict[tuple[str, str, str], int] = {}
        self._degraded_seen: dict[tuple[str, str], int] = {}

    def observe_view(self, view: CapacityView, version: int) -> None:
        counts = {h: 0 for h in Health}
        for w in view.workers:
            counts[w.state.health] += 1
        for health, n in counts.items():
            self.workers.labels(health.value).set(n)
        # Touch only series that changed; removed replicas must not linger as stale series.
        current = {
            (r.worker_id, str(r.dp_rank), r.source.value): r.retention_tokens for w in view.workers for r in w.replicas
        }
        for labels in self._retention_seen.keys() - current.keys():
            self.retention_tokens.remove(*labels)
        for labels, tokens in current.items():
            if self._retention_seen.get(labels) != tokens:
                self.retention_tokens.labels(*labels).set(tokens)
        self._retention_seen = current
        degraded = {
            (w.state.worker_id, d.value): int(d in w.state.card.degraded)
            for w in view.workers
            if w.state.card is not None
            for d in Degradation
        }
        for pair in self._degraded_seen.keys() - degraded.keys():
            self.worker_degraded.remove(*pair)
        for pair, value in degraded.items():
            if self._degraded_seen.get(pair) != value:
                self.worker_degraded.labels(*pair).set(value)
        self._degraded_seen = degraded
        self.total_retention_tokens.set(view.total_retention_tokens)
        self.version.set(version)
