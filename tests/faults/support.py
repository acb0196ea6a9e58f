"""Fault tests of the scheduler: a real `python -m services.scheduler` process, a scripted capacity
service in the test process (one WatchWorkers stream per caller, snapshots pushed by the test), and
helpers to drive programs into the states the faults need.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import grpc

from bandmaster.capacity.v1 import capacity_pb2 as cap_pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as cap_pb_grpc
from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually


class ScriptedCapacity(cap_pb_grpc.CapacityServicer):
    """A capacity service whose WatchWorkers streams send the snapshot the test set, then heartbeats."""

    def __init__(self, replicas: dict[tuple[str, int], int]) -> None:
        self.snapshot = self._snapshot(1, replicas)
        self._changed = asyncio.Event()
        self.server: grpc.aio.Server | None = None
        self.address = ""

    @staticmethod
    def _snapshot(version: int, replicas: dict[tuple[str, int], int]) -> cap_pb.WorkersSnapshot:
        by_worker: dict[str, list[cap_pb.Replica]] = {}
        for (worker_id, rank), tokens in replicas.items():
            by_worker.setdefault(worker_id, []).append(
                cap_pb.Replica(worker_id=worker_id, dp_rank=rank, retention_tokens=tokens)
            )
        return cap_pb.WorkersSnapshot(
            version=version,
            workers=[
                cap_pb.Worker(worker_id=w, health=cap_pb.WORKER_HEALTH_HEALTHY, replicas=r)
                for w, r in by_worker.items()
            ],
        )

    def set(self, replicas: dict[tuple[str, int], int]) -> None:
        self.snapshot = self._snapshot(self.snapshot.version + 1, replicas)
        self._changed.set()
        self._changed = asyncio.Event()

    async def WatchWorkers(self, request, context):
        sent = 0
        while True:
            if self.snapshot.version != sent:
                sent = self.snapshot.version
                yield self.snapshot
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), timeout=1.0)
            except TimeoutError:
                heartbeat = cap_pb.WorkersSnapshot()
                heartbeat.CopyFrom(self.snapshot)
                heartbeat.heartbeat = True
                yield heartbeat

    async def start(self) -> str:
        self.server = grpc.aio.server()
        cap_pb_grpc.add_CapacityServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)


async def start_scheduler(
    tmp: Path, capacity_addr: str, *args: str, name: str = "scheduler", listen: str = "127.0.0.1:0"
) -> stack.Process:
    """The scheduler as a real process (reference policy, fast ticks), serving on `listen`; its state
    in `tmp/<name>.state.sqlite` unless `args` name a store."""
    state = (
        []
        if any(a.startswith(("--state-path", "--state-redis-url")) for a in args)
        else ["--state-path", str(tmp / f"{name}.state.sqlite")]
    )
    return await stack.spawn(
        name,
        "services.scheduler",
        [
            "--capacity-addr",
            capacity_addr,
            "--listen",
            listen,
            "--metrics-port",
            "0",
            "--pause-policy",
            "threshold",
            "--scheduler-interval-seconds",
            "0.1",
            # Decay slowly: the resume side sees what the pause side sees (no churn in the tests).
            "--acting-decay-tau-seconds",
            "1000",
            "--shutdown-grace-seconds",
            "1",
            *state,
            *args,
        ],
        tmp,
    )


async def metric(proc: stack.Process, name: str) -> float:
    return await stack.metric(stack.metrics_url(proc), name)


@dataclass
class Client:
    channel: grpc.aio.Channel
    stub: pb_grpc.SchedulerStub

    @classmethod
    def connect(cls, address: str) -> "Client":
        channel = grpc.aio.insecure_channel(address)
        return cls(channel, pb_grpc.SchedulerStub(channel))

    async def close(self) -> None:
        await self.channel.close()

    async def stats(self) -> pb.Stats:
        return await self.stub.GetStats(pb.GetStatsRequest(), timeout=5)

    async def programs(self) -> dict[str, pb.Program]:
        listing = await self.stub.ListPrograms(pb.ListProgramsRequest(), timeout=5)
        return {p.session_id: p for p in listing.programs}

    async def wait_replicas(self, n: int) -> None:
        async def check():
            return len((await self.stats()).replicas) == n

        await assert_eventually(check, timeout_s=20)

    async def turn(self, sid: str, request_id: str, tokens: int, estimate: int = 1) -> pb.AdmitResponse:
        """One whole turn: Admit, then Complete reporting `tokens`."""
        answer = await self.stub.Admit(
            pb.AdmitRequest(session_id=sid, request_id=request_id, estimated_prompt_tokens=estimate), timeout=5
        )
        await self.stub.Complete(
            pb.CompleteRequest(
                session_id=sid,
                request_id=request_id,
                worker_id=answer.worker_id,
                dp_rank=answer.dp_rank,
                prompt_tokens=tokens,
            ),
            timeout=5,
        )
        return answer


def table(programs: dict[str, pb.Program]) -> dict[str, tuple]:
    """What a rollback must leave exactly as it was (timestamps aside)."""
    return {
        sid: (p.status, p.lifecycle, p.token_total, p.turns, p.worker_id, p.dp_rank, p.parent_session_id)
        for sid, p in programs.items()
    }
