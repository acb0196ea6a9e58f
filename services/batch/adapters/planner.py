"""The batch service's link to the planner, over the planner's gRPC API (the planner decides, this follows).

* Lease: `WatchLease` streams every lease the planner publishes for the pool; each is held as a
  `DrainLease` on the monotonic clock. A broken stream is reopened after `retry_s` (backing off to 5 s
  under the one retry policy, services/common/outbound/retry.py, while the planner stays away); meanwhile the held
  lease runs out by itself, so the dispatcher stops at its expiry (fail closed: no planner, no sends).
* Jobs: every open batch is a planner job with the batch id as job id (`SubmitBatchJob`, idempotent),
  its request count and its `expires_at` as deadline. Every `interval_s` each open batch's progress is
  reported (`ReportDispatch`, with the dispatcher's pool-level feedback); a job the planner does not know
  (NOT_FOUND: it restarted on an empty store) is submitted again; a batch that ended is reported once
  more with its `final_status`, after which the planner plans nothing more for it. With no open batch,
  a pool-level report (no job id) still tells the planner that the backlog is empty.

Only ids, counts, rates and statuses cross this link: never a request body or a completion.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from bandmaster.planner.v1 import planner_pb2 as pb
from bandmaster.planner.v1 import planner_pb2_grpc as pb_grpc
from services.batch.adapters.registry import Registry
from services.batch.core.lease import DispatchFeedback, DrainLease
from services.common.clock import Clock
from services.common.outbound.retry import Backoff, RetryPolicy

log = logging.getLogger("services.batch.planner")


class PlannerLink:
    def __init__(
        self,
        stub: pb_grpc.PlannerStub,
        registry: Registry,
        clock: Clock,
        *,
        pool_id: str,
        feedback: Callable[[], DispatchFeedback],
        interval_s: float = 1.0,
        timeout_s: float = 3.0,
        retry_s: float = 1.0,
        on_lease: Callable[[], None] = lambda: None,
        metrics=None,
    ) -> None:
        self.stub = stub
        self.registry = registry
        self.clock = clock
        self.pool_id = pool_id
        self.feedback = feedback
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.on_lease = on_lease
        self.metrics = metrics
        self.lease: DrainLease | None = None
        self.connected = False
        self.reports_sent = 0
        self._tasks: list[asyncio.Task] = []
        self._report_now = asyncio.Event()

    def current_lease(self) -> DrainLease | None:
        return self.lease

    def report_soon(self) -> None:
        """A batch was created or cancelled: tell the planner now rather than at the next interval."""
        self._report_now.set()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="batch-lease-watch"),
            asyncio.create_task(self._report_loop(), name="batch-planner-report"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _count_error(self, call: str) -> None:
        if self.metrics is not None:
            self.metrics.planner_errors.labels(call).inc()

    # --- the lease ---

    async def _watch(self) -> None:
        # The one retry policy: the first reopen after `retry_s`, then longer up to 5 s while the planner
        # stays away (jittered so that many batch services do not reconnect in step); reset by a lease.
        backoff = Backoff(RetryPolicy(first_delay_s=self.retry_s, max_delay_s=max(self.retry_s, 5.0), jitter=0.2))
        while True:
            try:
                stream = self.stub.WatchLease(pb.WatchLeaseRequest(pool_id=self.pool_id))
                async for msg in stream:
                    self._take(msg)
                    backoff.reset()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self._count_error("watch_lease")
                if self.connected:
                    log.warning("lease watch lost (%s); the held lease runs out by itself", exc.code().name)
                self.connected = False
            await asyncio.sleep(backoff.failed())

    def _take(self, msg: pb.Lease) -> None:
        lease = DrainLease.from_wire(
            msg.pool_id or self.pool_id,
            msg.max_admission_rps,
            msg.valid_until_unix_ms,
            msg.decision_id,
            now_wall_s=self.clock.wall(),
            now_mono_s=self.clock.monotonic(),
        )
        if not self.connected:
            log.info("lease watch: following the planner's lease for pool %s", self.pool_id)
        self.connected = True
        self.lease = lease
        if self.metrics is not None:
            self.metrics.lease_valid.set(1 if lease.valid_at(self.clock.monotonic()) else 0)
        self.on_lease()

    # --- jobs and progress ---

    async def _report_loop(self) -> None:
        while True:
            try:
                await self.report_once()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self._count_error("report")
                log.debug("report to the planner failed: %s", exc.code().name)
            except Exception:
                log.exception("report to the planner failed")
            self._report_now.clear()
            try:
                await asyncio.wait_for(self._report_now.wait(), timeout=self.interval_s)
            except TimeoutError:
                pass

    async def report_once(self) -> None:
        """One round: every open batch's progress, then every ended batch's end, else pool feedback only."""
        if self.metrics is not None:
            lease = self.lease
            self.metrics.lease_valid.set(1 if lease is not None and lease.valid_at(self.clock.monotonic()) else 0)
        fb = self.feedback()
        reported = False
        for batch in self.registry.open_batches():
            reported |= await self._report(batch, fb, final_status="")
        for batch in self.registry.ended_unreported():
            if await self._report(batch, fb, final_status=batch["status"]):
                self.registry.mark_ended_reported(batch["id"])
                reported = True
        if not reported:
            await self._call(self.stub.ReportDispatch, self._request(fb), "report")
        self.reports_sent += 1

    def _request(self, fb: DispatchFeedback, batch: dict | None = None, final_status: str = ""):
        counts = batch["request_counts"] if batch else {"completed": 0, "failed": 0}
        return pb.ReportDispatchRequest(
            pool_id=self.pool_id,
            job_id=batch["id"] if batch else "",
            dispatched=batch["dispatched"] if batch else 0,
            completed=counts["completed"],
            failed=counts["failed"],
            queued=fb.queued_requests,
            inflight=fb.inflight_requests,
            actual_dispatch_rps=fb.actual_dispatch_rps,
            applied_max_admission_rps=fb.applied_max_admission_rps or 0.0,
            has_applied_cap=fb.applied_max_admission_rps is not None,
            final_status=final_status,
        )

    async def _report(self, batch: dict, fb: DispatchFeedback, *, final_status: str) -> bool:
        """True when the planner took the report (or has nothing to close). An unreachable planner raises
        (the round ends); a refusal of this one job is counted and logged, and the round goes on."""
        request = self._request(fb, batch, final_status)
        try:
            try:
                await self._call(self.stub.ReportDispatch, request, "report")
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                if final_status:
                    return True  # the planner never knew it (or forgot it): nothing to close
                await self._submit(batch)
                await self._call(self.stub.ReportDispatch, request, "report")
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            self._count_error("report")
            log.warning("batch %s: the planner refused its report: %s %s", batch["id"], exc.code().name, exc.details())
            return False
        return True

    async def _submit(self, batch: dict) -> None:
        deadline = Timestamp()
        deadline.FromSeconds(int(batch["expires_at"]))
        await self._call(
            self.stub.SubmitBatchJob,
            pb.SubmitBatchJobRequest(
                pool_id=self.pool_id,
                job_id=batch["id"],
                total_requests=batch["request_counts"]["total"],
                deadline=deadline,
            ),
            "submit",
        )
        log.info("batch %s: submitted to the planner (%d requests)", batch["id"], batch["request_counts"]["total"])

    async def _call(self, method, request, call: str):
        try:
            return await method(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError:
            if call == "submit":
                self._count_error(call)
            raise
