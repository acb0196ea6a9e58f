"""The gRPC edge of the planner. Thin: validate, call the job store/runtime, map errors (`DOMAIN_ERRORS`).

Every batch job is dispatched outside the planner (the batch service, or another gateway): it submits the job
(`SubmitBatchJob`: a count and a deadline), follows the lease (`WatchLease`) and reports progress
(`ReportDispatch`). Nothing here sees a request body or a completion."""

from __future__ import annotations

import secrets
from typing import AsyncIterator

import grpc

from bandmaster.planner.v1 import planner_pb2 as pb
from bandmaster.planner.v1 import planner_pb2_grpc as pb_grpc
from services.common.clock import Clock
from services.common.serve.grpc_errors import ErrorTable
from services.planner.adapters.jobs import Conflict, JobStore, NotFound
from services.planner.adapters.proto import job_to_proto, lease_to_proto, plan_to_proto
from services.planner.core.jobs import check_id
from services.planner.core.types import DispatcherFeedback
from services.planner.loop import PlannerRuntime

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Planner"].full_name
MAX_JOB_REQUESTS = 2**31 - 1
"""Bound on one external job's requests: the plan sums jobs' remaining requests into an int64."""


class InvalidArgument(ValueError):
    pass


DOMAIN_ERRORS = ErrorTable(
    [
        (NotFound, grpc.StatusCode.NOT_FOUND),
        (Conflict, grpc.StatusCode.ALREADY_EXISTS),
        ((InvalidArgument, ValueError), grpc.StatusCode.INVALID_ARGUMENT),
    ],
    message=lambda exc: f"not found: {exc.args[0]}" if isinstance(exc, NotFound) else str(exc),
)
"""The one mapping from the planner's domain errors to gRPC codes."""


class PlannerServicer(pb_grpc.PlannerServicer):
    def __init__(self, runtime: PlannerRuntime, jobs: JobStore, clock: Clock) -> None:
        self.runtime = runtime
        self.jobs = jobs
        self.clock = clock
        self.external_feedback: DispatcherFeedback | None = None

    def _pool(self, pool_id: str) -> str:
        if pool_id:
            check_id(pool_id, "pool_id")
        if pool_id and pool_id != self.runtime.pool_id:
            raise NotFound(f"pool {pool_id} (this planner owns {self.runtime.pool_id})")
        return self.runtime.pool_id

    async def SubmitBatchJob(self, request: pb.SubmitBatchJobRequest, context) -> pb.BatchJob:
        async with DOMAIN_ERRORS.guard(context):
            pool = self._pool(request.pool_id)
            now = self.clock.wall()
            if not 0 < request.total_requests <= MAX_JOB_REQUESTS:
                raise InvalidArgument(f"total_requests must be in [1, {MAX_JOB_REQUESTS}]")
            if not request.HasField("deadline") or request.deadline.ToNanoseconds() / 1e9 <= now:
                raise InvalidArgument("deadline must be in the future")
            job_id = check_id(request.job_id, "job_id") if request.job_id else f"job_{secrets.token_hex(12)}"
            job = self.jobs.submit(
                job_id, request.total_requests, int(request.deadline.ToNanoseconds() // 1_000_000_000), int(now), pool
            )
            return job_to_proto(job)

    async def GetBatchJob(self, request: pb.GetBatchJobRequest, context) -> pb.BatchJob:
        async with DOMAIN_ERRORS.guard(context):
            return job_to_proto(self.jobs.get(check_id(request.job_id, "job_id")))

    async def ListBatchJobs(self, request: pb.ListBatchJobsRequest, context) -> pb.ListBatchJobsResponse:
        async with DOMAIN_ERRORS.guard(context):
            pool = self._pool(request.pool_id)
            return pb.ListBatchJobsResponse(jobs=[job_to_proto(job) for job in self.jobs.list(pool)])

    async def GetLease(self, request: pb.GetLeaseRequest, context) -> pb.Lease:
        async with DOMAIN_ERRORS.guard(context):
            self._pool(request.pool_id)
            return lease_to_proto(self.runtime.board.lease)

    async def WatchLease(self, request: pb.WatchLeaseRequest, context) -> AsyncIterator[pb.Lease]:
        async with DOMAIN_ERRORS.guard(context):
            self._pool(request.pool_id)
        board = self.runtime.board
        event = board.subscribe()
        try:
            sent = -1
            while True:
                if board.version != sent and board.lease is not None:
                    sent = board.version
                    yield lease_to_proto(board.lease)
                event.clear()
                if board.version == sent:
                    await event.wait()
        finally:
            board.unsubscribe(event)

    async def ReportDispatch(self, request: pb.ReportDispatchRequest, context) -> pb.ReportDispatchResponse:
        async with DOMAIN_ERRORS.guard(context):
            self._pool(request.pool_id)
            if min(request.dispatched, request.completed, request.queued, request.inflight, request.failed) < 0:
                raise InvalidArgument("counts must be >= 0")
            if request.final_status and not request.job_id:
                raise InvalidArgument("final_status needs a job_id")
            if request.job_id:
                self.jobs.report(
                    check_id(request.job_id, "job_id"),
                    request.dispatched,
                    request.completed,
                    request.failed,
                    int(self.clock.wall()),
                    request.final_status,
                )
            self.external_feedback = DispatcherFeedback(
                self.clock.monotonic(),
                1.0,
                int(request.queued),
                int(request.inflight),
                max(0.0, request.actual_dispatch_rps),
                request.applied_max_admission_rps if request.has_applied_cap else None,
            )
            return pb.ReportDispatchResponse()

    async def GetPlan(self, request: pb.GetPlanRequest, context) -> pb.Plan:
        record = self.runtime.last
        if record is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no tick has run yet")
        return plan_to_proto(record)
