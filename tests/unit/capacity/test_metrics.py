"""The capacity service's counters exist at 0 for every reason from the start; the degraded gauge
follows each worker's card and forgets removed workers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.capacity.core.cards import RetentionSettings, derive_card, recompute
from services.capacity.core.state import CardRejectReason, Health, Origin, PollFailureReason, WorkerState
from services.capacity.metrics import CapacityMetrics


def test_every_reason_and_health_is_exported_before_it_happens():
    registry = CollectorRegistry()
    CapacityMetrics(registry)
    for reason in PollFailureReason:
        assert registry.get_sample_value("bandmaster_capacity_poll_failures_total", {"reason": reason.value}) == 0
    for reason in CardRejectReason:
        assert registry.get_sample_value("bandmaster_capacity_card_rejections_total", {"reason": reason.value}) == 0
    for health in Health:
        assert registry.get_sample_value("bandmaster_capacity_workers", {"health": health.value}) == 0


def _worker(worker_id: str, **args) -> WorkerState:
    info = {"max_total_num_tokens": 1000, "page_size": 1, **args}
    return WorkerState(
        worker_id, f"http://{worker_id}:1", Origin.FLAG, 0.0, health=Health.HEALTHY, card=derive_card(info)
    )


def test_degraded_gauge_is_one_per_reason_off_and_forgets_removed_workers():
    registry = CollectorRegistry()
    metrics = CapacityMetrics(registry)

    def gauge(worker_id, reason):
        return registry.get_sample_value(
            "bandmaster_capacity_worker_degraded", {"worker_id": worker_id, "reason": reason}
        )

    bare = _worker("a", enable_priority_scheduling=True)
    full = _worker("b", enable_cache_report=True, enable_priority_scheduling=True)
    metrics.observe_view(recompute(RetentionSettings(), [bare, full]), 2)
    assert (gauge("a", "cache_report_off"), gauge("a", "priority_scheduling_off")) == (1, 0)
    assert (gauge("b", "cache_report_off"), gauge("b", "priority_scheduling_off")) == (0, 0)
    metrics.observe_view(recompute(RetentionSettings(), [full]), 3)
    assert gauge("a", "cache_report_off") is None and gauge("b", "cache_report_off") == 0
    # A worker without a card yet has no series: nothing is known about its arguments.
    pending = WorkerState("c", "http://c:1", Origin.RPC, 0.0)
    metrics.observe_view(recompute(RetentionSettings(), [full, pending]), 4)
    assert gauge("c", "cache_report_off") is None
