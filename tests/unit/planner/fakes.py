"""The planner fixture of planner shell tests."""

from __future__ import annotations

from services.planner.config import PlannerConfig


def planner_config(tmp_path, **kw) -> PlannerConfig:
    base = dict(
        listen="127.0.0.1:0",
        metrics_port=-1,
        registry_path=str(tmp_path / "planner.sqlite3"),
        tick_interval_seconds=0.1,
        tick_max_duration_seconds=1.0,
        observe_timeout_seconds=0.5,
        effect_timeout_seconds=1.0,
        drain_lease_duration_seconds=10.0,
        assume_no_online_traffic=True,
        virtual_initial_replicas=1,
        safe_rps_per_replica=100.0,
        cold_start_margin_seconds=0.0,
        finalization_margin_seconds=0.0,
        shutdown_grace_seconds=0.5,
    )
    base.update(kw)
    return PlannerConfig(**base)
