"""The scheduler's scrape-time series: band edges from the control parameters in force."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from services.scheduler.core import CapacitySnapshot, ControlParams, ReplicaCapacity, SchedulerCore
from services.scheduler.metrics import SchedulerMetrics


def _watched(params: ControlParams) -> tuple[SchedulerCore, CollectorRegistry]:
    core = SchedulerCore(params)
    core.apply_capacity(0.0, CapacitySnapshot(1, (ReplicaCapacity("w0", 0, 1000, 0),)))
    registry = CollectorRegistry()
    SchedulerMetrics(registry).watch_core(core, now=lambda: 0.0, held=lambda: 0)
    return core, registry


def _registry(params: ControlParams) -> CollectorRegistry:
    return _watched(params)[1]


@pytest.mark.parametrize(
    "params, expected",
    [
        (ControlParams(), {"pause": 0.95, "soft_demote": 0.80, "resume": 0.85, "target": 0.80}),
        (
            ControlParams(pause_threshold=0.9, soft_demote_threshold=0.5, pause_target=0.7, resume_hysteresis=0.2),
            {"pause": 0.9, "soft_demote": 0.5, "resume": 0.7, "target": 0.7},
        ),
        # The resume edge never goes below 0 (hysteresis as large as the pause threshold).
        (
            ControlParams(pause_threshold=0.3, soft_demote_threshold=0.1, pause_target=0.2, resume_hysteresis=0.3),
            {"pause": 0.3, "soft_demote": 0.1, "resume": 0.0, "target": 0.2},
        ),
    ],
)
def test_band_thresholds_follow_the_control_parameters(params, expected):
    registry = _registry(params)
    for band, value in expected.items():
        got = registry.get_sample_value("bandmaster_scheduler_band_threshold_ratio", {"band": band})
        assert got == pytest.approx(value), band


def test_band_edges_are_ordered_like_the_bands_on_a_utilisation_panel():
    registry = _registry(ControlParams())
    edge = {
        band: registry.get_sample_value("bandmaster_scheduler_band_threshold_ratio", {"band": band})
        for band in ("pause", "soft_demote", "resume", "target")
    }
    assert edge["soft_demote"] <= edge["pause"]
    assert edge["resume"] <= edge["pause"]
    assert edge["target"] <= edge["pause"]


def test_replica_utilisation_is_exported_beside_the_edges():
    registry = _registry(ControlParams())
    assert (
        registry.get_sample_value("bandmaster_scheduler_replica_utilization", {"worker_id": "w0", "dp_rank": "0"})
        == 0.0
    )
    assert (
        registry.get_sample_value(
            "bandmaster_scheduler_replica_band", {"worker_id": "w0", "dp_rank": "0", "band": "normal"}
        )
        == 1.0
    )


def test_the_target_edge_is_where_a_pause_cycle_stops_with_a_measured_margin():
    params = ControlParams(
        pause_threshold=1.0,
        soft_demote_threshold=0.9,
        pause_target=0.9,
        resume_hysteresis=0.0,
        pause_margin_quantile=0.9,
    )
    core, registry = _watched(params)
    target = {"band": "target"}
    assert registry.get_sample_value("bandmaster_scheduler_band_threshold_ratio", target) == pytest.approx(0.9)
    for tick in range(513):  # nothing grows: the margin measured is 0 once the window is full
        core.tick(float(tick))
    assert core.control.pause_margin == 0.0
    assert registry.get_sample_value("bandmaster_scheduler_band_threshold_ratio", target) == pytest.approx(1.0)
