"""The tick loop's effects: lease first, then replicas; an error or unknown outcome stops the tick's
later effects with no replay; advisory actuates nothing; start-up and shutdown zero leases;
Redis stopped mid-tick; monotonic lease expiry across a wall-clock jump."""

import asyncio

from opentelemetry import trace
from prometheus_client import CollectorRegistry

from services.common.clock import FakeClock
from services.planner.adapters.connectors import ConnectorRefused, VirtualConnector
from services.planner.adapters.lease_store import LeaseOutcomeUnknown, LeaseRejected, MemoryLeaseStore, RedisLeaseStore
from services.planner.adapters.observe import Collector
from services.planner.core.scaling import LoadScalingConfig, ProgramScalingConfig
from services.planner.core.tick import TickSettings
from services.planner.core.types import JobDemand, LeaseDecision, OnlineTraffic
from services.planner.loop import PlannerRuntime
from services.planner.metrics import PlannerMetrics
from tests.support.redis_server import redis_server  # noqa: F401
from tests.unit.planner.helpers import cfg


class Journal:
    """Records the order of effects across the store and the connector."""

    def __init__(self):
        self.events: list[tuple] = []


class JournalStore(MemoryLeaseStore):
    def __init__(self, journal):
        super().__init__()
        self.journal = journal

    async def publish(self, decision, now_mono, now_wall):
        self.journal.events.append(("lease", decision.max_admission_rps))
        return await super().publish(decision, now_mono, now_wall)


class JournalConnector(VirtualConnector):
    def __init__(self, journal, clock, **kw):
        super().__init__(clock, **kw)
        self.journal = journal

    async def scale_to(self, replicas):
        self.journal.events.append(("scale", replicas))
        await super().scale_to(replicas)


def runtime(clock, store, connector, *, jobs=None, advisory=False, traffic=True, **batch_kw):
    jobs = jobs if jobs is not None else [("job-a", 20000, 100.0)]

    def job_source(now):
        return tuple(JobDemand(j, "in_progress", n, 0, 0, clock.wall() + due, now) for j, n, due in jobs)

    collector = Collector(
        clock, jobs=job_source, inventory=connector.inventory, timeout_s=1.0, assume_no_online_traffic=traffic
    )
    settings = TickSettings(
        batch=cfg(**batch_kw), load=LoadScalingConfig(enabled=False), programs=ProgramScalingConfig(enabled=False)
    )
    return PlannerRuntime(
        settings=settings,
        collector=collector,
        store=store,
        connector=connector,
        clock=clock,
        metrics=PlannerMetrics(CollectorRegistry()),
        tracer=trace.get_tracer("t"),
        interval_s=5,
        tick_max_duration_s=2,
        effect_timeout_s=1,
        advisory=advisory,
    )


async def test_the_lease_is_published_before_replicas_change():
    clock, j = FakeClock(), Journal()
    rt = runtime(clock, JournalStore(j), JournalConnector(j, clock, initial_replicas=10))
    await rt.start_lease()
    record = await rt.tick_once()
    assert j.events == [("lease", 0.0), ("lease", 100.0), ("scale", 20)]
    assert record.effects_outcome == "applied" and record.decision.scale_to == 20


async def test_a_failed_lease_write_stops_scaling_without_replay():
    clock, j = FakeClock(), Journal()
    store, connector = JournalStore(j), JournalConnector(j, clock, initial_replicas=10)
    rt = runtime(clock, store, connector)
    await rt.start_lease()
    store.fail_next = LeaseOutcomeUnknown("ack lost")
    record = await rt.tick_once()
    assert record.effects_outcome == "lease_unknown" and connector.decisions == []
    assert [e for e in j.events if e[0] == "scale"] == []
    store.fail_next = LeaseRejected("stale writer")
    assert (await rt.tick_once()).effects_outcome == "lease_failed" and connector.decisions == []
    # The next tick decides afresh (a new decision, not a replay of the failed one).
    record = await rt.tick_once()
    assert record.effects_outcome == "applied" and connector.decisions[-1][1] == 20


async def test_an_unknown_scale_outcome_is_recorded_and_not_retried_within_the_tick():
    clock, j = FakeClock(), Journal()
    connector = JournalConnector(j, clock, initial_replicas=10)
    rt = runtime(clock, JournalStore(j), connector)
    await rt.start_lease()
    connector.fail_next = RuntimeError("API server went away")
    record = await rt.tick_once()
    assert record.effects_outcome == "scale_unknown" and record.lease is not None
    assert [e for e in j.events if e[0] == "scale"] == [("scale", 20)]
    connector.fail_next = ConnectorRefused("409")
    assert (await rt.tick_once()).effects_outcome == "scale_failed"


async def test_advisory_mode_computes_everything_and_actuates_nothing():
    clock, j = FakeClock(), Journal()
    connector = JournalConnector(j, clock, initial_replicas=10)
    rt = runtime(clock, JournalStore(j), connector, advisory=True)
    await rt.start_lease()
    record = await rt.tick_once()
    assert record.decision.scale_to == 20 and record.decision.lease.max_admission_rps == 100.0
    assert j.events == [] and record.effects_outcome == "advisory"
    await rt.stop()
    assert j.events == []


async def test_startup_and_shutdown_publish_zero_leases():
    clock, j = FakeClock(), Journal()
    rt = runtime(clock, JournalStore(j), JournalConnector(j, clock, initial_replicas=10))
    await rt.start_lease()
    assert rt.board.lease.max_admission_rps == 0 and rt.board.lease.decision_id.startswith("planner-startup-")
    await rt.tick_once()
    assert rt.board.lease.max_admission_rps == 100.0
    await rt.stop()
    assert rt.board.lease.max_admission_rps == 0 and rt.board.lease.decision_id.startswith("planner-shutdown-")


async def test_observation_timeout_is_a_zero_lease_without_scaling():
    clock, j = FakeClock(), Journal()
    connector = JournalConnector(j, clock, initial_replicas=10)

    async def stuck():
        await asyncio.sleep(60)

    rt = runtime(clock, JournalStore(j), connector)
    rt.tick_max_duration_s = 0.05
    rt.collector.inventory = stuck
    await rt.start_lease()
    record = await rt.tick_once()
    assert record.decision.action == "tick_timeout" and record.decision.lease.max_admission_rps == 0
    assert connector.decisions == []


async def test_lease_expiry_survives_a_wall_clock_jump_backwards():
    clock = FakeClock()
    store = MemoryLeaseStore()
    await store.start(LeaseDecision("default", 0.0, 10, "s"), clock.monotonic(), clock.wall())
    lease = await store.publish(LeaseDecision("default", 5.0, 10, "d"), clock.monotonic(), clock.wall())
    clock._wall_offset -= 3600  # the wall clock jumps back an hour
    clock.advance(10)
    assert lease.rate_at(clock.monotonic()) == 0.0  # still expired on time


async def test_redis_stopped_mid_tick_no_scaling_and_the_lease_lapses(redis_server):
    clock, j = FakeClock(), Journal()
    connector = JournalConnector(j, clock, initial_replicas=10)
    store = RedisLeaseStore(redis_server.url, "bm:lease:default", connect_timeout_s=0.3, socket_timeout_s=0.3)
    rt = runtime(clock, store, connector, drain_lease_duration_s=2.0)
    rt.effect_timeout_s = 3
    await rt.start_lease()
    record = await rt.tick_once()
    assert record.effects_outcome == "applied" and connector.decisions == [(clock.monotonic(), 20)]
    assert (await store.read_control())["max_admission_rps"] == "100"
    connector_before = list(connector.decisions)
    await connector.scale_to(10)  # the fleet drifted back: the next tick wants 20 again
    redis_server.stop()
    record = await rt.tick_once()
    assert record.effects_outcome == "lease_unknown"
    assert connector.decisions == connector_before + [(clock.monotonic(), 10)]  # no scaling by the planner
    clock.advance(2.0)
    assert rt.board.lease.rate_at(clock.monotonic()) == 0.0  # the lease lapsed
    redis_server.start()
    await asyncio.sleep(2.1)
    assert await store.client.exists(store.control_key) == 0  # Redis restarted empty
    await store.close()


async def test_unknown_traffic_keeps_admission_closed_but_scales_from_zero():
    clock, j = FakeClock(), Journal()
    connector = JournalConnector(j, clock, initial_replicas=0)
    rt = runtime(clock, JournalStore(j), connector, traffic=False, min_replicas=0)
    await rt.start_lease()
    record = await rt.tick_once()
    assert record.decision.lease.max_admission_rps == 0 and record.decision.scale_to == 1
    assert j.events == [("lease", 0.0), ("lease", 0.0), ("scale", 1)]
    assert OnlineTraffic  # imported for the type in docs


def _fail_closed_gauge(rt) -> float:
    return rt.metrics.lease_fail_closed._value.get()


async def test_redis_restarted_empty_leases_flow_again_and_the_outage_is_reported_fail_closed(redis_server, caplog):
    """Issue 21: the fence is lost with Redis's data. Before, every write was refused as stale until
    the planner restarted (batches at 0 rps) and nothing said the planner was failing closed."""
    clock, j = FakeClock(), Journal()
    connector = JournalConnector(j, clock, initial_replicas=20)
    store = RedisLeaseStore(redis_server.url, "bm:lease:default", connect_timeout_s=0.3, socket_timeout_s=0.3)
    rt = runtime(clock, store, connector, drain_lease_duration_s=5.0)
    rt.effect_timeout_s = 3
    await rt.start_lease()
    assert (await rt.tick_once()).effects_outcome == "applied"
    assert _fail_closed_gauge(rt) == 0
    redis_server.stop()
    for _ in range(3):
        clock.advance(1.0)
        record = await rt.tick_once()
        assert record.effects_outcome == "lease_unknown" and "lease_unknown" in record.fail_closed
        assert _fail_closed_gauge(rt) == 1
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "failing closed" in r.getMessage()]
    assert len(warnings) == 1  # once when it starts, not once per tick
    redis_server.start()  # empty: no fence, no control key
    ticks = 0
    while True:
        clock.advance(1.0)
        record = await rt.tick_once()
        ticks += 1
        if record.effects_outcome == "applied" or ticks == 2:
            break
    assert record.effects_outcome == "applied", record.effects_error  # within 2 ticks
    assert record.fail_closed == () and _fail_closed_gauge(rt) == 0
    h = await store.read_control()
    assert float(h["max_admission_rps"]) > 0 and h["writer_epoch"] == str(store.epoch)
    assert (await rt.tick_once()).effects_outcome == "applied"
    await store.close()
