import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common.observe.telemetry import setup_telemetry
from tests.unit.scheduler_shell.support import start_harness


@pytest.fixture
async def make_harness():
    made = []

    async def make(**control):
        exporter = InMemorySpanExporter()
        harness = await start_harness(
            telemetry=setup_telemetry("scheduler-test", exporter=exporter, set_global=False), **control
        )
        harness.exporter = exporter
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.channel.close()
        await harness.running.stop()


@pytest.fixture
async def h(make_harness):
    return await make_harness()
