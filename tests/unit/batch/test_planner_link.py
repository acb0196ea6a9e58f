"""The batch service and a real planner over gRPC: batches become planner jobs (ids, counts, deadlines only),
progress and ends are reported, the lease paces the dispatcher, and a planner that is gone stops the sends."""

import io

import grpc
import openai

from bandmaster.planner.v1 import planner_pb2 as pb
from bandmaster.planner.v1 import planner_pb2_grpc as pb_grpc
from services.batch.core.lease import DrainLease
from services.batch.server import start_batch
from services.planner.server import start_planner
from tests.support.eventually import assert_eventually
from tests.unit.batch.fakes import batch_config, batch_jsonl, start_stack
from tests.unit.planner.fakes import planner_config


def client_for(running) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=running.http_url + "/v1", api_key="unused", max_retries=0)


async def _job(address: str, job_id: str) -> pb.BatchJob | None:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            return await pb_grpc.PlannerStub(channel).GetBatchJob(pb.GetBatchJobRequest(job_id=job_id), timeout=2)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                return None
            raise


async def _create(client: openai.AsyncOpenAI, n: int):
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(n))), purpose="batch")
    return await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="1h")


async def test_a_batch_is_a_planner_job_reported_to_completion(tmp_path, upstream):
    stack = await start_stack(tmp_path, upstream.url)
    try:
        batch = await _create(client_for(stack), 3)

        async def completed_job():
            job = await _job(stack.planner.address, batch.id)
            return job if job is not None and job.status == "completed" else None

        job = await assert_eventually(completed_job, timeout_s=15)
        assert (job.total_requests, job.completed_requests, job.failed_requests) == (3, 3, 0)
        assert job.deadline.seconds == batch.expires_at and job.external
        assert len(upstream.requests) == 3
    finally:
        await stack.stop()


async def test_a_cancelled_batch_closes_its_planner_job(tmp_path, upstream):
    stack = await start_stack(tmp_path, upstream.url, planner={"max_batch_admission_rps": 0.0})
    try:
        client = client_for(stack)
        batch = await _create(client, 4)

        async def known():
            return await _job(stack.planner.address, batch.id)

        assert (await assert_eventually(known, timeout_s=5)).status == "in_progress"
        await client.batches.cancel(batch.id)

        async def cancelled_job():
            job = await _job(stack.planner.address, batch.id)
            return job if job.status == "cancelled" else None

        await assert_eventually(cancelled_job, timeout_s=10)
        assert stack.planner.jobs.job_demands(0.0) == () and upstream.requests == []
    finally:
        await stack.stop()


async def test_a_planner_restarted_empty_gets_the_open_batches_again(tmp_path, upstream):
    planner = await start_planner(planner_config(tmp_path, registry_path=":memory:", max_batch_admission_rps=0.0))
    port = planner.address.rsplit(":", 1)[1]
    batch_svc = await start_batch(batch_config(tmp_path, planner.address, upstream.url))
    try:
        batch = await _create(client_for(batch_svc), 2)

        async def known():
            return await _job(planner.address, batch.id)

        await assert_eventually(known, timeout_s=5)
        reports = batch_svc.planner.reports_sent
        await planner.stop()
        planner = await start_planner(
            planner_config(tmp_path, registry_path=":memory:", listen=f"127.0.0.1:{port}", max_batch_admission_rps=0.0)
        )
        job = await assert_eventually(known, timeout_s=10)
        assert job.total_requests == 2 and job.status == "in_progress"
        # (The link counts a round once all of it is sent: the job can be known a moment before.)
        await assert_eventually(lambda: batch_svc.planner.reports_sent > reports, timeout_s=5)
    finally:
        await batch_svc.stop()
        await planner.stop()


async def test_without_a_reachable_planner_nothing_is_sent(tmp_path, upstream):
    """Fail closed: no lease ever arrives, so the dispatcher sends nothing; the Batch API still answers."""
    batch_svc = await start_batch(batch_config(tmp_path, "127.0.0.1:9", upstream.url))
    try:
        batch = await _create(client_for(batch_svc), 2)

        def failed_reports():
            registry = batch_svc.host.registry
            value = registry.get_sample_value("bandmaster_batch_planner_errors_total", {"call": "report"})
            return value if value and value >= 2 else None

        await assert_eventually(failed_reports, timeout_s=10)  # the link tried (and failed) twice at least
        got = await client_for(batch_svc).batches.retrieve(batch.id)
        assert got.status in ("validating", "in_progress") and upstream.requests == []
        assert batch_svc.planner.current_lease() is None
        assert batch_svc.dispatcher.feedback().applied_max_admission_rps is None
    finally:
        await batch_svc.stop()


def test_a_received_lease_is_judged_on_the_monotonic_clock():
    lease = DrainLease.from_wire("p", 5.0, 1_010_000, "d", now_wall_s=1000.0, now_mono_s=50.0)
    assert lease.valid_until_mono_s == 60.0
    assert lease.rate_at(59.9) == 5.0 and lease.rate_at(60.0) == 0.0
    expired = DrainLease.from_wire("p", 5.0, 990_000, "d", now_wall_s=1000.0, now_mono_s=50.0)
    assert expired.rate_at(50.0) == 0.0 and not expired.valid_at(50.0)
    for bad in (float("nan"), float("inf"), -1.0):
        assert DrainLease.from_wire("p", bad, 1_010_000, "d", now_wall_s=1000.0, now_mono_s=50.0).rate_at(50.0) == 0
