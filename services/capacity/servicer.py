"""The gRPC edge of the capacity service. Thin: validate, call the runtime, map errors.

Domain errors map to status codes in `DOMAIN_ERRORS` and nowhere else.
"""

from __future__ import annotations

from typing import AsyncIterator

import grpc

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from services.capacity.adapters.proto import expectation_from_proto, load_from_proto, worker_to_proto
from services.capacity.config import validate_worker_id, validate_worker_url, worker_id_for
from services.capacity.core.cards import recompute
from services.capacity.core.errors import AlreadyExists, InvalidArgument
from services.capacity.core.state import Origin
from services.capacity.loop import CapacityRuntime
from services.capacity.router_loads import RouterLoadHub
from services.common.auth.redact import redact_url
from services.common.serve.grpc_errors import ErrorTable

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Capacity"].full_name


DOMAIN_ERRORS = ErrorTable(
    [
        ((InvalidArgument, ValueError), grpc.StatusCode.INVALID_ARGUMENT),
        (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    ],
    # Credentials a caller put in a URL are refused, and never echoed back.
    message=lambda exc: redact_url(str(exc)),
)
"""The one mapping from the capacity service's domain errors to gRPC codes."""


class CapacityServicer(pb_grpc.CapacityServicer):
    def __init__(self, runtime: CapacityRuntime, router_loads: RouterLoadHub) -> None:
        self.runtime = runtime
        self.router_loads = router_loads

    async def RegisterWorker(
        self, request: pb.RegisterWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterWorkerResponse:
        async with DOMAIN_ERRORS.guard(context):
            url = validate_worker_url(request.url)
            worker_id = validate_worker_id(request.worker_id or worker_id_for(url))
            expectation = expectation_from_proto(request)
            state = self.runtime.add_worker(worker_id, url, Origin.RPC, expectation)
            view = next(w for w in recompute(self.runtime.retention, [state]).workers)
            return pb.RegisterWorkerResponse(worker=worker_to_proto(view))

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> pb.HeartbeatResponse:
        async with DOMAIN_ERRORS.guard(context):
            if not request.worker_id:
                raise InvalidArgument("worker_id is required")
            load = load_from_proto(request.load)
            return pb.HeartbeatResponse(known=self.runtime.set_load(request.worker_id, load))

    async def DeregisterWorker(
        self, request: pb.DeregisterWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeregisterWorkerResponse:
        async with DOMAIN_ERRORS.guard(context):
            if not request.worker_id:
                raise InvalidArgument("worker_id is required")
            # Idempotent: an unknown id is OK with removed=false, so a retried call is harmless.
            return pb.DeregisterWorkerResponse(removed=self.runtime.remove_worker(request.worker_id))

    async def ListWorkers(
        self, request: pb.ListWorkersRequest, context: grpc.aio.ServicerContext
    ) -> pb.WorkersSnapshot:
        self.runtime.current()
        return self.runtime.fresh()

    async def WatchWorkers(
        self, request: pb.WatchWorkersRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.WorkersSnapshot]:
        runtime = self.runtime
        mailbox = runtime.subscribe()  # before reading `current`, so no change falls in between
        try:
            current = runtime.current()
            last_sent = request.known_version
            if current.version != request.known_version:
                yield current
                last_sent = current.version
            async for snapshot in mailbox.follow(runtime.heartbeat_interval_s):
                if snapshot is None:
                    yield runtime.heartbeat_snapshot()
                elif snapshot.version != last_sent:
                    last_sent = snapshot.version
                    yield snapshot
        finally:
            runtime.unsubscribe(mailbox)

    async def ReportRouterLoad(
        self, request: pb.RouterLoadReport, context: grpc.aio.ServicerContext
    ) -> pb.ReportRouterLoadResponse:
        async with DOMAIN_ERRORS.guard(context):
            return pb.ReportRouterLoadResponse(accepted=self.router_loads.report(request))

    async def WatchRouterLoads(
        self, request: pb.WatchRouterLoadsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.RouterLoadsSnapshot]:
        hub = self.router_loads
        mailbox = hub.subscribe()
        try:
            yield hub.current()
            async for snapshot in mailbox.follow(self.runtime.heartbeat_interval_s):
                # None: nothing new for a heartbeat interval; the table again tells the watcher's idle
                # timeout the stream is alive.
                yield hub.current() if snapshot is None else snapshot
        finally:
            hub.unsubscribe(mailbox)
