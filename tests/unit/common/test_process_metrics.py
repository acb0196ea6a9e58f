"""Every service's /metrics has the process's series and bandmaster_build_info, and no `_created` series."""

from __future__ import annotations

import platform

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.common.observe.process_metrics import bandmaster_version, register_process_metrics


def _samples(registry: CollectorRegistry) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_process_series_build_info_and_no_created():
    registry = CollectorRegistry()
    register_process_metrics(registry, "capacity")
    Counter("bandmaster_test_things", "things", registry=registry).inc()
    Histogram("bandmaster_test_seconds", "seconds", registry=registry).observe(0.1)
    samples = _samples(registry)
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ):
        assert name in samples, sorted(samples)
    assert samples["process_resident_memory_bytes"][0].value > 0
    (info,) = samples["bandmaster_build_info"]
    assert info.value == 1
    assert info.labels == {
        "service": "capacity",
        "version": bandmaster_version(),
        "python_version": platform.python_version(),
    }
    assert not [name for name in samples if name.endswith("_created")]


@pytest.mark.asyncio
async def test_a_service_host_and_a_simworker_register_them():
    from services.common.serve.grpc_server import ServiceHost
    from services.simworker.core.api import EngineStats
    from services.simworker.metrics import SimWorkerMetrics

    host = ServiceHost("scheduler")
    samples = _samples(host.registry)
    assert samples["bandmaster_build_info"][0].labels["service"] == "scheduler"
    assert "process_cpu_seconds_total" in samples
    assert not [name for name in samples if name.endswith("_created")]
    worker = _samples(SimWorkerMetrics(EngineStats, "model").registry)
    assert worker["bandmaster_build_info"][0].labels["service"] == "simworker"
    assert "process_open_fds" in worker
