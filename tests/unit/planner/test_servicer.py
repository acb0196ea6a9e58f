"""The planner's gRPC edge against a real server on 127.0.0.1:0: leases, plans, jobs, dispatch reports, health."""

import asyncio
import time

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bandmaster.planner.v1 import planner_pb2 as pb
from bandmaster.planner.v1 import planner_pb2_grpc as pb_grpc
from services.planner.server import start_planner
from tests.support.eventually import assert_eventually
from tests.unit.planner.fakes import planner_config


@pytest.fixture
async def running(tmp_path):
    r = await start_planner(planner_config(tmp_path))
    yield r
    await r.stop()


@pytest.fixture
async def stub(running):
    channel = grpc.aio.insecure_channel(running.address)
    yield pb_grpc.PlannerStub(channel)
    await channel.close()


def ts(seconds: float) -> Timestamp:
    t = Timestamp()
    t.FromNanoseconds(int(seconds * 1e9))
    return t


async def test_health_serving_after_the_startup_lease(running):
    async with grpc.aio.insecure_channel(running.address) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="bandmaster.planner.v1.Planner")
        )
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_get_lease_and_watch_lease(stub):
    lease = await stub.GetLease(pb.GetLeaseRequest(pool_id="default"))
    assert lease.writer_epoch == 1 and lease.valid_until_unix_ms > 0
    stream = stub.WatchLease(pb.WatchLeaseRequest())
    first = await stream.read()
    second = await asyncio.wait_for(stream.read(), 5)
    assert second.writer_sequence > first.writer_sequence
    stream.cancel()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetLease(pb.GetLeaseRequest(pool_id="other"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_get_plan_returns_the_last_decision_with_provenance(stub, running):
    await stub.SubmitBatchJob(
        pb.SubmitBatchJobRequest(total_requests=5000, deadline=ts(time.time() + 100), job_id="ext-1")
    )

    async def plan_with_job():
        p = await stub.GetPlan(pb.GetPlanRequest())
        return p if p.observation.active_jobs == 1 else None

    plan = await assert_eventually(plan_with_job, timeout_s=5)
    assert plan.decision_id.startswith("d-") and plan.effects_outcome == "applied"
    assert plan.has_replica_floor and plan.replica_floor >= 1
    sources = {t.source: t for t in plan.targets}
    assert sources["native_batch_policy"].provenance == pb.PROVENANCE_RECONCILE
    assert sources["native_max_replicas"].kind == "AT_MOST"
    assert plan.required_batch_rps > 0 and plan.leases and plan.audit
    assert plan.observation.jobs_known and plan.observation.traffic_known


async def test_submit_batch_job_is_idempotent_and_validated(stub):
    deadline = ts(time.time() + 3600)
    a = await stub.SubmitBatchJob(pb.SubmitBatchJobRequest(total_requests=10, deadline=deadline, job_id="j1"))
    b = await stub.SubmitBatchJob(pb.SubmitBatchJobRequest(total_requests=10, deadline=deadline, job_id="j1"))
    assert a.job_id == b.job_id == "j1" and a.external and a.state == pb.BATCH_JOB_STATE_RUNNING
    for bad, code in [
        (pb.SubmitBatchJobRequest(total_requests=11, deadline=deadline, job_id="j1"), grpc.StatusCode.ALREADY_EXISTS),
        (pb.SubmitBatchJobRequest(total_requests=0, deadline=deadline), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.SubmitBatchJobRequest(total_requests=1, deadline=ts(time.time() - 1)), grpc.StatusCode.INVALID_ARGUMENT),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SubmitBatchJob(bad)
        assert info.value.code() == code
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetBatchJob(pb.GetBatchJobRequest(job_id="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    jobs = await stub.ListBatchJobs(pb.ListBatchJobsRequest())
    assert [j.job_id for j in jobs.jobs] == ["j1"]


async def test_report_dispatch_updates_an_external_job_and_feeds_the_tick(stub, running):
    await stub.SubmitBatchJob(pb.SubmitBatchJobRequest(total_requests=4, deadline=ts(time.time() + 3600), job_id="j"))
    await stub.ReportDispatch(
        pb.ReportDispatchRequest(
            job_id="j",
            dispatched=4,
            completed=3,
            failed=1,
            queued=0,
            inflight=0,
            actual_dispatch_rps=2.0,
            applied_max_admission_rps=5.0,
            has_applied_cap=True,
        )
    )
    job = await stub.GetBatchJob(pb.GetBatchJobRequest(job_id="j"))
    assert (job.status, job.completed_requests, job.failed_requests) == ("completed", 3, 1)

    async def idle_plan():
        p = await stub.GetPlan(pb.GetPlanRequest())
        return p if p.observation.feedback_known and p.has_idle_target else None

    plan = await assert_eventually(idle_plan, timeout_s=5)
    assert plan.idle_target == 0 and plan.observation.actual_dispatch_rps == 2.0
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ReportDispatch(pb.ReportDispatchRequest(queued=-1))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_one_span_per_tick_and_metrics(tmp_path):
    import aiohttp
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from services.common.observe.telemetry import setup_telemetry

    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry("bandmaster-planner", exporter=exporter, set_global=False)
    r = await start_planner(planner_config(tmp_path, metrics_port=0), telemetry=telemetry)
    try:
        await assert_eventually(
            lambda: len([s for s in exporter.get_finished_spans() if s.name == "planner.tick"]) >= 2, timeout_s=5
        )
        span = [s for s in exporter.get_finished_spans() if s.name == "planner.tick"][-1]
        assert {"planner.action", "planner.lease_rps", "planner.effects"} <= set(span.attributes)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{r.host.metrics_port}/metrics") as resp:
                text = await resp.text()
        for name in (
            "bandmaster_planner_lease_max_admission_rps",
            "bandmaster_planner_target_replicas",
            'bandmaster_planner_fail_closed_total{reason="policy_safety_pause"}',
            "bandmaster_planner_tick_seconds_bucket",
            "bandmaster_planner_lease_publish_seconds_count",
        ):
            assert name in text
    finally:
        await r.stop()


@pytest.mark.parametrize("job_id", ["x" * 65, "a\nb", "job 1", "-leading-dash", "caf\u00e9"])
async def test_client_named_ids_are_refused_unless_short_and_plain(stub, job_id):
    """Regression: a job id of any length or bytes was stored, put in lease audit lines and echoed."""
    deadline = ts(time.time() + 3600)
    for call, request in [
        (stub.SubmitBatchJob, pb.SubmitBatchJobRequest(total_requests=1, deadline=deadline, job_id=job_id)),
        (stub.GetBatchJob, pb.GetBatchJobRequest(job_id=job_id)),
        (stub.GetLease, pb.GetLeaseRequest(pool_id=job_id)),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "letters, digits" in info.value.details() and "\n" not in info.value.details()
    assert not (await stub.ListBatchJobs(pb.ListBatchJobsRequest())).jobs


async def test_a_final_status_closes_a_job_and_stops_its_demand(stub, running):
    """The batch service reports a cancelled (or expired) batch with `final_status`: the planner closes the
    job at once instead of planning for its remaining requests until the deadline."""
    await stub.SubmitBatchJob(pb.SubmitBatchJobRequest(total_requests=5, deadline=ts(time.time() + 3600), job_id="c"))
    await stub.ReportDispatch(pb.ReportDispatchRequest(job_id="c", dispatched=1, completed=1))
    assert [d.job_id for d in running.jobs.job_demands(0.0)] == ["c"]
    await stub.ReportDispatch(pb.ReportDispatchRequest(job_id="c", dispatched=1, completed=1, final_status="cancelled"))
    job = await stub.GetBatchJob(pb.GetBatchJobRequest(job_id="c"))
    assert (job.status, job.state, job.completed_requests) == ("cancelled", pb.BATCH_JOB_STATE_CANCELLED, 1)
    assert job.external and running.jobs.job_demands(0.0) == ()
    # A later report cannot reopen it.
    await stub.ReportDispatch(pb.ReportDispatchRequest(job_id="c", dispatched=2, completed=2))
    assert (await stub.GetBatchJob(pb.GetBatchJobRequest(job_id="c"))).status == "cancelled"
    for bad in (
        pb.ReportDispatchRequest(job_id="c", final_status="done-ish"),
        pb.ReportDispatchRequest(final_status="cancelled"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ReportDispatch(bad)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ReportDispatch(pb.ReportDispatchRequest(job_id="nope", completed=1))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_job_store_holds_counts_and_deadlines_only(tmp_path):
    """The planner's store has no column for a request body, a prompt or a completion."""
    from services.planner.adapters.jobs import JobStore

    store = JobStore(str(tmp_path / "jobs.sqlite3"))
    try:
        store.submit("j", 3, 5000, 1000, "default")
        store.report("j", 3, 2, 1, 1001)
        assert store.get("j")["status"] == "completed"
        tables = [r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        columns = {c[1] for t in tables for c in store.db.execute(f"PRAGMA table_info({t})")}
        assert not columns & {"body", "content", "result", "prompt", "messages", "url"}, columns
        store.submit("late", 1, 1500, 1000, "default")
        assert store.advance(1500) == [("late", "in_progress", "expired")]
    finally:
        store.close()
