"""A FakeClock-driven scheduler on 127.0.0.1:0 with a scripted capacity stream."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import grpc

from bandmaster.capacity.v1 import capacity_pb2 as cap_pb
from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.common.clock import FakeClock
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import ControlParams
from services.scheduler.server import RunningScheduler, start_scheduler
from tests.support.eventually import assert_eventually


def workers_snapshot(
    version: int,
    caps: dict[tuple[str, int], int],
    *,
    unhealthy: tuple[str, ...] = (),
    heartbeat: bool = False,
    max_programs: int = 0,
) -> cap_pb.WorkersSnapshot:
    by_worker: dict[str, list[cap_pb.Replica]] = {}
    for (worker_id, rank), tokens in caps.items():
        by_worker.setdefault(worker_id, []).append(
            cap_pb.Replica(worker_id=worker_id, dp_rank=rank, retention_tokens=tokens, max_programs=max_programs)
        )
    out = []
    for worker_id, replicas in by_worker.items():
        health = cap_pb.WORKER_HEALTH_UNHEALTHY if worker_id in unhealthy else cap_pb.WORKER_HEALTH_HEALTHY
        out.append(cap_pb.Worker(worker_id=worker_id, health=health, replicas=replicas))
    return cap_pb.WorkersSnapshot(version=version, workers=out, heartbeat=heartbeat)


class FakeWatch:
    """One WatchWorkers call: yields what is pushed; an exception item ends it with that error."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeCapacity:
    """Stands in for `CapacityStub`: each new stream starts with the latest snapshot, like the service."""

    def __init__(self) -> None:
        self.latest: cap_pb.WorkersSnapshot | None = None
        self.watches: list[FakeWatch] = []

    def WatchWorkers(self, request, **kwargs) -> FakeWatch:
        watch = FakeWatch()
        if self.latest is not None:
            watch.queue.put_nowait(self.latest)
        self.watches.append(watch)
        return watch

    def push(self, snapshot: cap_pb.WorkersSnapshot) -> None:
        self.latest = snapshot
        if self.watches:
            self.watches[-1].queue.put_nowait(snapshot)

    def fail(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE, details: str = "capacity down") -> None:
        self.watches[-1].queue.put_nowait(grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details))


SERVICE_FIELDS = {f.name for f in dataclasses.fields(SchedulerConfig)} - {"control"}


def config(**settings) -> SchedulerConfig:
    """Control-law settings by name, plus any SchedulerConfig field (e.g. ticket_lease_seconds)."""
    service = {name: settings.pop(name) for name in list(settings) if name in SERVICE_FIELDS}
    params = dict(scheduler_interval_seconds=5.0, resume_timeout_seconds=1800.0)
    params.update(settings)
    # These tests pin the reference ("threshold") behaviour with small token counts; the service's
    # default cost_aware policy would rightly not pause such cheap contexts.
    return SchedulerConfig(
        **{
            "control": ControlParams(**params),
            "pause_policy": "threshold",
            "listen": "127.0.0.1:0",
            "metrics_port": -1,
            "shutdown_grace_seconds": 0.5,
            **service,
        }
    )


@dataclass
class Harness:
    running: RunningScheduler
    clock: FakeClock
    capacity: FakeCapacity
    channel: grpc.aio.Channel
    client: pb_grpc.SchedulerStub

    @property
    def runtime(self):
        return self.running.runtime

    @property
    def core(self):
        return self.running.core

    def tick(self):
        return self.runtime.tick_once()

    async def set_capacity(self, caps: dict[tuple[str, int], int], version: int | None = None, **kwargs) -> None:
        version = version if version is not None else (self.capacity.latest.version + 1 if self.capacity.latest else 1)
        self.capacity.push(workers_snapshot(version, caps, **kwargs))
        await assert_eventually(
            lambda: self.core.stats(self.clock.monotonic()).capacity_version == version, timeout_s=5
        )

    async def admit(self, sid: str, request_id: str, tokens: int = 0, parent: str = "", **kwargs) -> pb.AdmitResponse:
        return await self.client.Admit(
            pb.AdmitRequest(
                session_id=sid, parent_session_id=parent, estimated_prompt_tokens=tokens, request_id=request_id
            ),
            **kwargs,
        )

    async def complete(
        self, sid: str, request_id: str, prompt: int, completion: int = 0, worker: str = "", dp_rank: int = 0, **kwargs
    ) -> pb.CompleteResponse:
        return await self.client.Complete(
            pb.CompleteRequest(
                session_id=sid,
                request_id=request_id,
                worker_id=worker,
                dp_rank=dp_rank,
                prompt_tokens=prompt,
                completion_tokens=completion,
                **kwargs,
            )
        )

    async def program(self, sid: str) -> pb.Program:
        return await self.client.GetProgram(pb.GetProgramRequest(session_id=sid))

    async def held(self, n: int) -> None:
        await assert_eventually(
            lambda: self.runtime.held_count == n, timeout_s=5, message=f"expected {n} held admissions"
        )

    def table(self):
        """The core's table without timestamps that legitimately move (for rollback comparisons)."""
        return sorted(self.core.programs(), key=lambda v: v.session_id), self.core.paused_ids()


async def start_harness(*, telemetry=None, **control) -> Harness:
    clock = FakeClock()
    capacity = FakeCapacity()
    running = await start_scheduler(
        config(**control), clock=clock, telemetry=telemetry, capacity_stub=capacity, tick_loop=False
    )
    channel = grpc.aio.insecure_channel(running.address)
    return Harness(running, clock, capacity, channel, pb_grpc.SchedulerStub(channel))


def router_client(address: str, *, breaker_s: float = 1.0, **kwargs):
    """A router's scheduler client (services/router/adapters/scheduler.py) of the scheduler at `address` (or
    replicas, comma-separated), with 2 s deadlines and a breaker that opens at the first failure for
    `breaker_s`; `kwargs` go to SchedulerClient (channel_factory, mux, metrics, ...)."""
    from services.router.adapters.scheduler import SchedulerClient
    from services.router.core.breaker import BreakerParams
    from services.router.observe.metrics import RouterMetrics

    return SchedulerClient(
        address,
        kwargs.pop("metrics", None) or RouterMetrics(),
        call_timeout_s=2.0,
        decision_timeout_s=2.0,
        hold_timeout_s=30.0,
        breaker=BreakerParams(1, breaker_s, breaker_s),
        **kwargs,
    )
