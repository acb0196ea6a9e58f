import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common.clock import FakeClock
from services.common.observe.telemetry import setup_telemetry


def test_fake_clock_moves_only_forward():
    clock = FakeClock(start=10.0)
    clock.advance(2.5)
    assert clock.monotonic() == 12.5
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        clock.set(1.0)


def test_in_memory_exporter_collects_spans():
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry("t", exporter=exporter, set_global=False)
    with telemetry.tracer("t").start_as_current_span("capacity.recompute"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["capacity.recompute"]
    telemetry.shutdown()


def test_nothing_exported_without_endpoint():
    telemetry = setup_telemetry("t", env={}, set_global=False)
    assert telemetry.exporting is False
    telemetry.shutdown()
