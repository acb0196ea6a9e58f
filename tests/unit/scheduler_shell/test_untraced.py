"""A scheduler whose spans nobody exports records none (the cost of spans on every turn's Admit+Complete,
docs/scheduler.md "Admission cost"); one that exports records them for every call, as before."""

from __future__ import annotations

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.common.observe.telemetry import setup_telemetry
from tests.unit.scheduler_shell.support import start_harness

W = ("w1", 0)


async def _turns(h) -> None:
    await h.set_capacity({W: 100_000})
    resp = await h.admit("p", "r1", 10)
    await h.complete("p", "r1", 10, 1, resp.worker_id, resp.dp_rank)
    updates = [u async for u in h.client.AdmitStream(pb.AdmitRequest(session_id="p", request_id="r2"))]
    assert updates[-1].HasField("decision")
    h.runtime.tick_once()


async def test_a_scheduler_that_exports_no_spans_records_none():
    telemetry = setup_telemetry("scheduler-test", set_global=False)
    assert not telemetry.exporting
    # Watching the provider behind the service's back: anything it recorded would land here.
    seen = InMemorySpanExporter()
    telemetry.provider.add_span_processor(SimpleSpanProcessor(seen))
    h = await start_harness(telemetry=telemetry)
    try:
        await _turns(h)
        assert seen.get_finished_spans() == ()
    finally:
        await h.channel.close()
        await h.running.stop()


async def test_a_scheduler_that_exports_spans_records_every_call():
    exporter = InMemorySpanExporter()
    h = await start_harness(telemetry=setup_telemetry("scheduler-test", exporter=exporter, set_global=False))
    try:
        await _turns(h)
        names = [s.name for s in exporter.get_finished_spans()]
        assert names.count("scheduler.admit") == 2 and "scheduler.tick" in names
        assert "/bandmaster.scheduler.v1.Scheduler/Admit" in names
        assert "/bandmaster.scheduler.v1.Scheduler/Complete" in names
    finally:
        await h.channel.close()
        await h.running.stop()
