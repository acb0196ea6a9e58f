"""The capacity service's counters exist at 0 for every reason from the start."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.capacity.core.state import CardRejectReason, Health, PollFailureReason
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
