"""Router replica sync (`--router-replica-sync`): report this router's own active load to the capacity
service and keep the other routers' loads (core/peer_loads.py) from its `WatchRouterLoads` stream.

Two tasks, off the request path (a turn never waits on them):

* the reporter, every `interval_s`: drops the peer view once it is `ttl_s` old (capacity unreachable:
  the router routes on its own count), and sends `ReportRouterLoad` when this router's per-replica
  load changed since the last report, or `keepalive_s` passed (the capacity service drops a router
  whose report outlived its TTL, `ttl_s`); every call has a deadline, failures back off;
* the watcher (the capacity service's one stream follower, `StreamWatch`): follows `WatchRouterLoads`,
  replacing the peer view with every table received; reopens the stream with backoff when it fails, ends
  or stays silent past `idle_timeout_s`.

WARN once per outage, INFO on recovery.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from typing import Any, Callable

import grpc

from bandmaster.capacity.v1 import capacity_pb2 as pb
from services.common.clock import Clock
from services.common.outbound.capacity_watch import StreamWatch
from services.common.outbound.retry import Backoff, RetryPolicy
from services.router.core.load import ReplicaLoad
from services.router.core.peer_loads import PeerLoads, PeerReport
from services.router.core.types import Replica
from services.router.observe.metrics import RouterMetrics

log = logging.getLogger(__name__)

TTL_INTERVALS = 10
"""A report stays live this many report intervals (1 s at the default 100 ms)."""
KEEPALIVES_PER_TTL = 3
"""An unchanged load is re-reported this many times per TTL, so one lost report drops nothing."""


def new_router_id() -> str:
    """Unique per process: a restarted router is a new router (its old report ages out)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def report_to_proto(
    router_id: str, sequence: int, ttl_s: float, loads: dict[Replica, ReplicaLoad]
) -> pb.RouterLoadReport:
    return pb.RouterLoadReport(
        router_id=router_id,
        sequence=sequence,
        ttl_ms=round(ttl_s * 1000),
        loads=[
            pb.ReplicaActiveLoad(
                worker_id=replica.worker_id,
                dp_rank=replica.dp_rank,
                active_requests=load.active_requests,
                prefill_tokens=load.active_prefill_tokens,
                decode_blocks=load.active_decode_blocks,
            )
            for replica, load in sorted(loads.items())
        ],
    )


def reports_from_proto(snapshot: pb.RouterLoadsSnapshot) -> list[PeerReport]:
    return [
        PeerReport(
            r.router_id,
            {
                Replica(x.worker_id, x.dp_rank): ReplicaLoad(x.active_requests, x.prefill_tokens, x.decode_blocks)
                for x in r.loads
            },
        )
        for r in snapshot.routers
    ]


class PeerSync:
    def __init__(
        self,
        stub: Any,
        peers: PeerLoads,
        own_loads: Callable[[], dict[Replica, ReplicaLoad]],
        clock: Clock,
        metrics: RouterMetrics,
        *,
        interval_s: float,
        address: str,
        idle_timeout_s: float = 60.0,
        max_backoff_s: float = 5.0,
    ) -> None:
        self.stub = stub
        self.peers = peers
        self.own_loads = own_loads
        self.clock = clock
        self.metrics = metrics
        self.interval_s = interval_s
        self.keepalive_s = peers.ttl_s / KEEPALIVES_PER_TTL
        self.address = address
        self.idle_timeout_s = idle_timeout_s
        self.max_backoff_s = max_backoff_s
        self.sequence = 0
        self._last_sent: dict[Replica, ReplicaLoad] | None = None
        self._last_sent_at = 0.0
        self._gauged_generation = -1
        self._tasks: list[asyncio.Task] = []
        self._watch: StreamWatch | None = None

    def start(self) -> None:
        log.info(
            "router replica sync: id %s, reporting every %gs (TTL %gs) to %s",
            self.peers.own_id,
            self.interval_s,
            self.peers.ttl_s,
            self.address,
        )
        self._tasks = [asyncio.create_task(self._report_loop(), name="router-peer-report")]
        self._watch = StreamWatch(
            lambda: self.stub.WatchRouterLoads(pb.WatchRouterLoadsRequest()),
            self.take,
            address=self.address,
            logger=log,
            what="router replica sync: the peer-load stream",
            kept=lambda: "the peers' last loads until their TTL",
            initial_backoff_s=0.1,
            max_backoff_s=self.max_backoff_s,
            idle_timeout_s=self.idle_timeout_s,
            name="router-peer-watch",
        )
        self._watch.start()

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._watch is not None:
            await self._watch.stop()
            self._watch = None

    # -- reporting --------------------------------------------------------------------------

    async def report_once(self) -> bool | None:
        """One reporter tick: expire a stale peer view, send a report if one is due. None: nothing due;
        True/False: sent / failed."""
        now = self.clock.monotonic()
        if self.peers.expire(now):
            log.warning(
                "router replica sync: no peer table for %gs; routing on this router's load only", self.peers.ttl_s
            )
        self._observe(now)
        loads = self.own_loads()
        if loads == self._last_sent and now - self._last_sent_at < self.keepalive_s:
            return None
        self.sequence += 1
        request = report_to_proto(self.peers.own_id, self.sequence, self.peers.ttl_s, loads)
        try:
            await self.stub.ReportRouterLoad(request, timeout=max(self.keepalive_s, 0.5))
        except grpc.aio.AioRpcError:
            self.metrics.replica_sync_reports.labels("failed").inc()
            return False
        self._last_sent, self._last_sent_at = loads, now
        self.metrics.replica_sync_reports.labels("sent").inc()
        return True

    def _observe(self, now: float) -> None:
        age = self.peers.age_s(now)
        self.metrics.replica_sync_peers.set(self.peers.peers)
        self.metrics.replica_sync_age.set(-1 if age is None else age)
        if self.peers.generation == self._gauged_generation:
            return  # the per-worker gauge already shows this view
        self._gauged_generation = self.peers.generation
        per_worker: dict[str, int] = {}
        for replica, load in self.peers.items():
            per_worker[replica.worker_id] = per_worker.get(replica.worker_id, 0) + load.active_requests
        gauge = self.metrics.replica_sync_peer_requests
        gauge.clear()  # a worker no peer reports on leaves the exposition (bounded by the fleet)
        for worker_id, requests in per_worker.items():
            gauge.labels(worker_id).set(requests)

    async def _report_loop(self) -> None:
        backoff = Backoff(RetryPolicy(self.interval_s, max(self.max_backoff_s, self.interval_s), jitter=0.5))
        in_outage = False
        while True:
            sent = await self.report_once()
            if sent is False:
                if not in_outage:
                    log.warning("router replica sync: load report to %s failed; retrying with backoff", self.address)
                    in_outage = True
                await asyncio.sleep(backoff.failed())
                continue
            if sent and in_outage:
                log.info("router replica sync: load reports to %s recovered", self.address)
                in_outage = False
            backoff.reset()
            await asyncio.sleep(self.interval_s)

    # -- watching ---------------------------------------------------------------------------

    def take(self, snapshot: pb.RouterLoadsSnapshot) -> None:
        self.peers.replace(reports_from_proto(snapshot), self.clock.monotonic())
