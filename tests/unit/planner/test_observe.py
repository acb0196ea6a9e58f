"""Observation sources: router scrapes (warm-up, rates, resets, batch traffic left out), the capacity
and scheduler sources, and the collector's unknown-is-never-zero rules."""

import asyncio
import gc
import warnings

import pytest
from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp

from bandmaster.capacity.v1 import capacity_pb2 as cpb
from bandmaster.scheduler.v1 import scheduler_pb2 as spb
from services.common.clock import FakeClock
from services.planner.adapters.observe import CapacitySource, Collector, RouterTrafficSource, SchedulerSource, WarmingUp
from services.planner.core.types import Inventory


class RouterMetrics:
    def __init__(self):
        self.total = 0
        self.in_flight = 3
        self.fail = False
        self.batch: tuple[int, int] | None = None  # (requests, in flight) under traffic="batch"; None = unlabelled

    async def start(self):
        async def metrics(_r):
            if self.fail:
                return web.Response(status=500)
            if self.batch is None:
                body = (
                    "# TYPE bandmaster_router_requests counter\n"
                    'bandmaster_router_requests_total{route="openai",path="/v1/chat/completions",outcome="ok"} '
                    f"{self.total}\n"
                    "# TYPE bandmaster_router_requests_in_flight gauge\n"
                    f"bandmaster_router_requests_in_flight {self.in_flight}\n"
                )
            else:
                body = (
                    "# TYPE bandmaster_router_requests counter\n"
                    'bandmaster_router_requests_total{route="chat",path="passthrough",outcome="ok",traffic="online"} '
                    f"{self.total}\n"
                    'bandmaster_router_requests_total{route="chat",path="passthrough",outcome="ok",traffic="batch"} '
                    f"{self.batch[0]}\n"
                    "# TYPE bandmaster_router_requests_in_flight gauge\n"
                    f'bandmaster_router_requests_in_flight{{traffic="online"}} {self.in_flight}\n'
                    f'bandmaster_router_requests_in_flight{{traffic="batch"}} {self.batch[1]}\n'
                )
            return web.Response(text=body, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self):
        await self.runner.cleanup()


@pytest.fixture
async def router():
    r = await RouterMetrics().start()
    yield r
    await r.stop()


async def test_router_traffic_warms_up_then_reports_a_rate(router):
    clock = FakeClock()
    src = RouterTrafficSource([router.url], clock, timeout_s=2)
    with pytest.raises(WarmingUp):
        await src.collect()
    clock.advance(10)
    router.total = 50
    t = await src.collect()
    assert t.offered_rps == pytest.approx(5.0) and t.active_requests == 3
    router.total = 10  # a router restarted
    clock.advance(10)
    with pytest.raises(WarmingUp, match="reset"):
        await src.collect()
    router.fail = True
    clock.advance(10)
    with pytest.raises(RuntimeError):
        await src.collect()
    router.fail = False
    with pytest.raises(WarmingUp):  # a failed scrape re-warms
        await src.collect()
    await src.close()


async def test_router_traffic_leaves_out_the_batch_labelled_samples(router):
    """The batch service's requests (X-Bandmaster-Traffic: batch) are counted by the router under
    traffic="batch": the planner skips those samples, and has no dispatch of its own to subtract."""
    clock = FakeClock()
    router.batch = (0, 0)
    src = RouterTrafficSource([router.url], clock, timeout_s=2)
    with pytest.raises(WarmingUp):
        await src.collect()
    clock.advance(10)
    router.total, router.batch = 20, (30, 2)
    t = await src.collect()
    assert t.offered_rps == pytest.approx(2.0) and t.active_requests == 3
    await src.close()


class FakeCapacity:
    def __init__(self, snapshot=None, fail=False):
        self.snapshot = snapshot
        self.fail = fail

    async def ListWorkers(self, request, timeout=None):
        if self.fail:
            raise RuntimeError("capacity down")
        return self.snapshot


def worker(wid, healthy=True, usage=0.5, queued=0):
    return cpb.Worker(
        worker_id=wid,
        health=cpb.WORKER_HEALTH_HEALTHY if healthy else cpb.WORKER_HEALTH_UNHEALTHY,
        load=cpb.WorkerLoad(num_running_reqs=1, num_queue_reqs=queued, token_usage=usage),
    )


def collector(clock, inventory, **kw):
    async def inv():
        return inventory

    return Collector(clock, jobs=lambda now: (), inventory=inv, timeout_s=1, **kw)


async def test_capacity_healthy_count_caps_ready_and_an_outage_makes_the_fleet_unknown():
    clock = FakeClock()
    inv = Inventory(clock.monotonic(), 3, 3)
    snap = cpb.WorkersSnapshot(workers=[worker("a"), worker("b"), worker("c", healthy=False)])
    obs = await collector(clock, inv, capacity=CapacitySource(FakeCapacity(snap), timeout_s=1)).collect()
    assert obs.inventory.ready == 2 and obs.inventory.expected is None and len(obs.loads) == 2
    obs = await collector(clock, inv, capacity=CapacitySource(FakeCapacity(fail=True), timeout_s=1)).collect()
    assert obs.inventory is None and any("capacity" in e for e in obs.errors)


async def test_missing_optional_sources_are_unknown_not_zero():
    clock = FakeClock()
    obs = await collector(clock, Inventory(clock.monotonic(), 1, 1)).collect()
    assert obs.traffic is None and obs.feedback is None and obs.programs is None and obs.jobs == ()
    obs = await collector(clock, Inventory(clock.monotonic(), 1, 1), assume_no_online_traffic=True).collect()
    assert obs.traffic.offered_rps == 0 and obs.traffic.active_requests == 0


async def test_a_failing_job_snapshot_is_none():
    clock = FakeClock()

    def broken(now):
        raise RuntimeError("disk")

    async def inv():
        return Inventory(clock.monotonic(), 1, 1)

    obs = await Collector(clock, jobs=broken, inventory=inv, timeout_s=1).collect()
    assert obs.jobs is None and any(e.startswith("jobs:") for e in obs.errors)


class FakeScheduler:
    def __init__(self, clock):
        self.clock = clock
        self.admissions = 100

    async def GetStats(self, request, timeout=None):
        return spb.Stats(
            programs_paused=1,
            programs_reasoning=2,
            passthrough_in_flight=1,
            admissions_total=self.admissions,
            replicas=[
                spb.ReplicaUtilization(retention_tokens=1000, utilization=0.8),
                spb.ReplicaUtilization(retention_tokens=1000, utilization=1.0),
            ],
        )

    async def ListPrograms(self, request, timeout=None):
        since = Timestamp()
        since.FromNanoseconds(int((self.clock.wall() - 40) * 1e9))
        return spb.ListProgramsResponse(
            programs=[spb.Program(session_id="p", lifecycle=spb.LIFECYCLE_PAUSED, paused_since=since)]
        )


async def test_scheduler_signal_and_fallback_traffic():
    clock = FakeClock()
    fake = FakeScheduler(clock)
    src = SchedulerSource(fake, clock, timeout_s=1)
    signal, traffic = await src.collect()
    assert signal.paused_programs == 1 and signal.longest_pause_s == pytest.approx(40)
    assert signal.utilization == pytest.approx(0.9) and traffic is None
    clock.advance(10)
    fake.admissions = 150
    _, traffic = await src.collect()
    assert traffic.offered_rps == pytest.approx(5.0) and traffic.active_requests == 3


async def test_a_collection_cancelled_before_its_reads_start_leaves_no_coroutine_unawaited():
    """A planner stopping mid-collection used to leave the inventory read created and never awaited
    (a RuntimeWarning in CI): each read is now created inside its own bounded task."""
    clock = FakeClock()
    started: list[str] = []

    async def inv():
        started.append("inventory")
        return Inventory(clock.monotonic(), 1, 1)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = asyncio.ensure_future(Collector(clock, jobs=lambda now: (), inventory=inv, timeout_s=1).collect())
        await asyncio.sleep(0)  # collect() has started its reads' tasks, which have not run yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(3):  # let the cancelled reads' tasks finish being cancelled
            await asyncio.sleep(0)
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert started == []
