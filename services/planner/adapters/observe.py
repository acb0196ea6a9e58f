"""Observation sources and the collector that builds one `Observation` per tick.

Sources run concurrently, each under its own deadline. The job snapshot (the registry) is
required: if it fails the observation has `jobs=None` and the policy pauses. Every other source
is optional: a failure or timeout leaves it None (unknown, never zero) and names why in
`Observation.errors`.

Online traffic comes from the routers' `/metrics` (`bandmaster_router_requests_total`, summed,
as a rate between two scrapes: the first scrape only warms up; a counter reset, a failed scrape
or a change in the set of routers re-warms) and `bandmaster_router_requests_in_flight`; else from
the scheduler's GetStats (admissions rate, reasoning + passthrough in flight). Batch requests (the
batch service marks each `X-Bandmaster-Traffic: batch`) are left out: the router counts them under
`traffic="batch"`, which is skipped, so batch drain is not mistaken for online load. The planner
sends no requests itself, so there is nothing of its own to subtract.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from services.common.clock import Clock
from services.planner.core.types import (
    DispatcherFeedback,
    Inventory,
    JobDemand,
    Observation,
    OnlineTraffic,
    ProgramSignal,
    ReplicaLoad,
)

log = logging.getLogger("services.planner.observe")


class WarmingUp(Exception):
    """A rate needs two scrapes; this was the first (or the baseline was reset)."""


@dataclass
class _Baseline:
    counter: float
    end_s: float
    urls: tuple[str, ...]
    ttft_sum: float = 0.0
    ttft_count: float = 0.0


class RouterTrafficSource:
    def __init__(
        self,
        urls: Sequence[str],
        clock: Clock,
        *,
        timeout_s: float,
        metrics_token: str = "",
    ) -> None:
        """`metrics_token`: sent as `Authorization: Bearer` on each scrape (a router whose /metrics takes a
        metrics token accepts it, or the control token; docs/security.md#metrics)."""
        self.urls = tuple(u.rstrip("/") for u in urls)
        self._headers = {"Authorization": f"Bearer {metrics_token}"} if metrics_token else None
        self.clock = clock
        self.timeout_s = timeout_s
        self._baseline: _Baseline | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _scrape(self, url: str) -> tuple[float, float, float, float]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        async with self._session.get(url + "/metrics", headers=self._headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{url}/metrics answered {resp.status}")
            text = await resp.text()
        counter = in_flight = ttft_sum = ttft_count = 0.0
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("traffic") == "batch":
                    continue
                if s.name == "bandmaster_router_requests_total":
                    counter += s.value
                elif s.name == "bandmaster_router_requests_in_flight":
                    in_flight += s.value
                elif s.name == "bandmaster_router_ttft_seconds_sum":
                    ttft_sum += s.value
                elif s.name == "bandmaster_router_ttft_seconds_count":
                    ttft_count += s.value
        return counter, in_flight, ttft_sum, ttft_count

    async def collect(self) -> OnlineTraffic:
        start = self.clock.monotonic()
        try:
            results = await asyncio.gather(*(self._scrape(u) for u in self.urls))
        except BaseException:
            self._baseline = None
            raise
        end = self.clock.monotonic()
        counter = sum(r[0] for r in results)
        in_flight = sum(r[1] for r in results)
        ttft_sum, ttft_count = sum(r[2] for r in results), sum(r[3] for r in results)
        prev, self._baseline = self._baseline, _Baseline(counter, end, self.urls, ttft_sum, ttft_count)
        if prev is None or prev.urls != self.urls:
            raise WarmingUp("first scrape")
        if counter < prev.counter or ttft_count < prev.ttft_count:
            raise WarmingUp("counter reset (a router restarted)")
        window = start - prev.end_s
        if window <= 0:
            raise WarmingUp("overlapping scrape windows")
        delta = counter - prev.counter
        ttft = None
        if ttft_count > prev.ttft_count:
            ttft = (ttft_sum - prev.ttft_sum) / (ttft_count - prev.ttft_count)
        return OnlineTraffic(end, delta / window, int(round(in_flight)), ttft)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class SchedulerSource:
    """The scheduler's GetStats / ListPrograms: program signal, and online traffic as a fallback."""

    def __init__(self, stub: Any, clock: Clock, *, timeout_s: float) -> None:
        self.stub = stub
        self.clock = clock
        self.timeout_s = timeout_s
        self._admissions: tuple[int, float] | None = None

    async def collect(self) -> tuple[ProgramSignal, OnlineTraffic | None]:
        from bandmaster.scheduler.v1 import scheduler_pb2 as spb

        start = self.clock.monotonic()
        stats, programs = await asyncio.gather(
            self.stub.GetStats(spb.GetStatsRequest(), timeout=self.timeout_s),
            self.stub.ListPrograms(spb.ListProgramsRequest(), timeout=self.timeout_s),
        )
        now = self.clock.monotonic()
        wall = self.clock.wall()
        pauses = [
            wall - p.paused_since.ToMicroseconds() / 1e6
            for p in programs.programs
            if p.lifecycle == spb.LIFECYCLE_PAUSED and p.HasField("paused_since")
        ]
        utils = [r.utilization for r in stats.replicas if r.retention_tokens > 0 and math.isfinite(r.utilization)]
        signal = ProgramSignal(
            now,
            stats.programs_paused,
            max(pauses) if pauses else None,
            sum(utils) / len(utils) if utils else None,
            len(stats.replicas),
        )
        prev, self._admissions = self._admissions, (stats.admissions_total, now)
        traffic = None
        if prev is not None and stats.admissions_total >= prev[0] and start > prev[1]:
            traffic = OnlineTraffic(
                now,
                (stats.admissions_total - prev[0]) / (start - prev[1]),
                stats.programs_reasoning + stats.passthrough_in_flight,
            )
        return signal, traffic


class CapacitySource:
    """The capacity service's ListWorkers: healthy workers and their load."""

    def __init__(self, stub: Any, *, timeout_s: float) -> None:
        self.stub = stub
        self.timeout_s = timeout_s

    async def collect(self) -> tuple[int, tuple[ReplicaLoad, ...]]:
        from bandmaster.capacity.v1 import capacity_pb2 as cpb

        snap = await self.stub.ListWorkers(cpb.ListWorkersRequest(), timeout=self.timeout_s)
        healthy = [w for w in snap.workers if w.health == cpb.WORKER_HEALTH_HEALTHY]
        loads = tuple(
            ReplicaLoad(w.worker_id, w.load.num_running_reqs, w.load.num_queue_reqs, w.load.token_usage)
            for w in healthy
        )
        return len(healthy), loads


class Collector:
    def __init__(
        self,
        clock: Clock,
        *,
        jobs: Callable[[float], tuple[JobDemand, ...]],
        inventory: Callable[[], Awaitable[Inventory]],
        timeout_s: float,
        feedback: Callable[[], DispatcherFeedback | None] = lambda: None,
        router: RouterTrafficSource | None = None,
        scheduler: SchedulerSource | None = None,
        capacity: CapacitySource | None = None,
        assume_no_online_traffic: bool = False,
    ) -> None:
        self.clock = clock
        self.jobs = jobs
        self.inventory = inventory
        self.timeout_s = timeout_s
        self.feedback = feedback
        self.router = router
        self.scheduler = scheduler
        self.capacity = capacity
        self.assume_no_online_traffic = assume_no_online_traffic

    async def _bounded(self, name: str, read: Callable[[], Awaitable], errors: list[str]):
        """`read()` within the timeout, or None with the error noted. The read is started here, inside
        this task: a collection cancelled before its tasks run leaves no coroutine unawaited."""
        try:
            return await asyncio.wait_for(read(), self.timeout_s)
        except asyncio.CancelledError:
            raise
        except WarmingUp as exc:
            errors.append(f"{name}: warming up ({exc})")
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
        return None

    async def collect(self) -> Observation:
        errors: list[str] = []
        tasks = {
            "inventory": self._bounded("inventory", self.inventory, errors),
            "router": self._bounded("router", self.router.collect, errors) if self.router else None,
            "scheduler": self._bounded("scheduler", self.scheduler.collect, errors) if self.scheduler else None,
            "capacity": self._bounded("capacity", self.capacity.collect, errors) if self.capacity else None,
        }
        started = {k: v for k, v in tasks.items() if v is not None}
        results = dict(zip(started, await asyncio.gather(*started.values())))
        # The job snapshot and the dispatcher's feedback are local: read after the I/O, so the
        # observation's time is the end of collection.
        now = self.clock.monotonic()
        try:
            jobs: tuple[JobDemand, ...] | None = self.jobs(now)
        except Exception as exc:
            errors.append(f"jobs: {type(exc).__name__}: {exc}")
            jobs = None
        try:
            feedback = self.feedback()
        except Exception as exc:
            errors.append(f"feedback: {type(exc).__name__}: {exc}")
            feedback = None
        inventory: Inventory | None = results.get("inventory")
        loads = None
        if self.capacity is not None:
            cap = results.get("capacity")
            if cap is None:
                inventory = None  # capacity configured but unknown: the fleet is unknown
            else:
                healthy, loads = cap
                if inventory is not None and healthy < inventory.ready:
                    inventory = Inventory(
                        inventory.observed_at_s,
                        healthy,
                        inventory.expected if healthy == inventory.expected else None,
                        inventory.scaling_in_progress or healthy != inventory.ready,
                        inventory.pending,
                    )
        traffic = results.get("router")
        programs = None
        sched = results.get("scheduler")
        if sched is not None:
            programs, sched_traffic = sched
            if traffic is None and self.router is None:
                traffic = sched_traffic
        if traffic is None and self.assume_no_online_traffic and self.router is None and self.scheduler is None:
            # An operator's explicit statement that this pool serves no online traffic.
            traffic = OnlineTraffic(now, 0.0, 0)
        return Observation(now, self.clock.wall(), jobs, traffic, feedback, inventory, loads, programs, tuple(errors))
