"""The state stores (SQLite, Redis), their records, and the persister's batching and outage handling."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
import redis

from services.common.clock import FakeClock
from services.common.settings.errors import ConfigError
from services.scheduler.adapters.state_store import (
    RedisStateStore,
    SqliteStateStore,
    StoredState,
    StoreError,
    StoreLocked,
    StoreLost,
    WriteBatch,
    decode_meta,
    decode_program,
    decode_state,
    decode_ticket,
    encode_meta,
    encode_program,
    encode_ticket,
)
from services.scheduler.core import ControlParams, Lifecycle, ReplicaKey, SchedulerCore, Status, durable
from services.scheduler.core.state import CoreMeta, ProgramRecord, TicketRecord
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.persist import StatePersister
from tests.support.redis_server import redis_server  # noqa: F401  (fixture)
from tests.unit.scheduler_shell.support import start_harness

pytestmark = pytest.mark.timeout(30)

PROGRAM = ProgramRecord(
    "p1",
    "root",
    10.0,
    3,
    Status.ACTING,
    Lifecycle.PAUSED,
    1_234,
    False,
    None,
    ReplicaKey("w1", 2),
    0.0,
    5,
    4,
    12.5,
    12.0,
    12.25,
    7,
)


@pytest.fixture
def redis_url(redis_server):
    return redis_server.url


def test_records_round_trip_through_wall_time():
    """Written by a process whose wall clock is monotonic + 1,000; read by one where it is + 5,000."""
    program = decode_program(encode_program(PROGRAM, 1_000.0), 5_000.0)
    assert program.created_at == pytest.approx(10.0 - 4_000.0) and program.acting_since == pytest.approx(-3_988.0)
    assert program.paused_since == pytest.approx(12.25 - 4_000.0)
    assert (program.session_id, program.status, program.lifecycle, program.last_replica, program.paused_seq) == (
        "p1",
        Status.ACTING,
        Lifecycle.PAUSED,
        ReplicaKey("w1", 2),
        7,
    )
    ticket = TicketRecord("pt", "", 0, 3.0, tokens=40, replica=ReplicaKey("w", 0))
    assert decode_ticket(encode_ticket(ticket, 0.0), 0.0) == ticket
    meta = CoreMeta(9, 4, (3, 5), {"pauses_total": 2})
    assert decode_meta(encode_meta(meta)) == meta


def test_a_tickets_confirmation_is_stored_and_an_older_record_reads_as_confirmed():
    """A new leader must know which running turns their clients saw (those count) and which not (those are
    rolled back when they lapse). A record written before the field existed was always counted."""
    for confirmed in (False, True):
        ticket = TicketRecord("r", "p", 3, 2.0, confirmed=confirmed)
        assert decode_ticket(encode_ticket(ticket, 0.0), 0.0) == ticket
    older = orjson.loads(encode_ticket(TicketRecord("r", "p", 3, 2.0), 0.0))
    del older["confirmed"]
    assert decode_ticket(orjson.dumps(older), 0.0).confirmed


def test_unreadable_records_are_skipped_and_counted():
    stored = StoredState([encode_program(PROGRAM, 0.0), b"not json", b'{"session_id": 1}'], [b"[]"], b"{}")
    decoded = decode_state(stored, 0.0)
    assert [p.session_id for p in decoded.state.programs] == ["p1"] and decoded.skipped == 4


async def test_sqlite_store_writes_deltas_and_full_batches_and_keeps_others_off(tmp_path):
    path = tmp_path / "deep" / "state.sqlite"
    store = SqliteStateStore(path)
    await store.open()
    try:
        intruder = SqliteStateStore(path)
        with pytest.raises(StoreLocked):
            await intruder.open()
        await intruder.close()
        await store.write(WriteBatch({"a": b"A", "b": b"B"}, {"t": b"T"}, b"M1", full=True))
        await store.write(WriteBatch({"a": None, "c": b"C"}, {"t": None}, b"M2"))
        loaded = await store.load()
        assert sorted(loaded.programs) == [b"B", b"C"] and loaded.tickets == [] and loaded.meta == b"M2"
        await store.write(WriteBatch({"z": b"Z"}, {}, b"M3", full=True))
        assert (await store.load()).programs == [b"Z"]
    finally:
        await store.close()
    reopened = SqliteStateStore(path)  # the lock went with the first store
    await reopened.open()
    assert (await reopened.load()).meta == b"M3"
    await reopened.close()


async def test_a_file_that_is_not_sqlite_is_a_store_error(tmp_path):
    path = tmp_path / "state.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    store = SqliteStateStore(path)
    with pytest.raises(StoreError, match="not a usable SQLite database"):
        await store.open()
    await store.close()


async def test_redis_store_notices_a_redis_that_lost_its_data(redis_url):
    store = RedisStateStore(redis_url, "t:", timeout_s=1.0)
    try:
        await store.load()
        await store.write(WriteBatch({"a": b"A"}, {}, b"M", full=True))
        await store.write(WriteBatch({"b": b"B"}, {}, b"M"))
        assert sorted((await store.load()).programs) == [b"A", b"B"]
        redis.Redis.from_url(redis_url).flushall()  # what a restart without persistence does
        with pytest.raises(StoreLost):
            await store.write(WriteBatch({"c": b"C"}, {}, b"M"))
    finally:
        await store.close()


async def test_redis_store_unreachable_is_a_bounded_store_error():
    store = RedisStateStore("redis://127.0.0.1:1/0", "t:", timeout_s=0.2)
    try:
        with pytest.raises(StoreError, match="cannot read"):
            await asyncio.wait_for(store.load(), 2)
    finally:
        await store.close()


class FlakyStore:
    """An in-memory store that can fail or hang on demand."""

    description = "flaky:"

    def __init__(self) -> None:
        self.programs: dict[str, bytes] = {}
        self.tickets: dict[str, bytes] = {}
        self.meta = b""
        self.mode = "ok"  # ok | fail | hang
        self.writes: list[WriteBatch] = []

    async def open(self) -> None: ...

    async def load(self) -> StoredState:
        return StoredState(list(self.programs.values()), list(self.tickets.values()), self.meta or None)

    async def _gate(self) -> None:
        if self.mode == "fail":
            raise StoreError("down")
        if self.mode == "hang":
            await asyncio.sleep(3600)

    async def write(self, batch: WriteBatch) -> None:
        await self._gate()
        self.writes.append(batch)
        if batch.full:
            self.programs.clear()
            self.tickets.clear()
        for target, records in ((self.programs, batch.programs), (self.tickets, batch.tickets)):
            for key, value in records.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        self.meta = batch.meta

    async def ping(self) -> None:
        await self._gate()

    async def close(self) -> None: ...


def persister_for(store, core=None) -> tuple[StatePersister, SchedulerCore]:
    from prometheus_client import CollectorRegistry

    core = core or SchedulerCore(ControlParams(), ticket_lease_seconds=30.0)
    return StatePersister(
        core, store, FakeClock(), SchedulerMetrics(CollectorRegistry()), flush_s=0.05, write_timeout_s=0.2
    ), core


async def test_persister_batches_deltas_and_rewrites_everything_after_an_outage(caplog):
    store = FlakyStore()
    persister, core = persister_for(store)
    await persister.recover(1.0)
    assert await persister.flush() and store.writes[-1].full  # the first batch makes the store exact
    core.admit(0.0, "p", "", 100, "r1")
    assert await persister.flush()
    assert set(store.writes[-1].programs) == {"p"} and set(store.writes[-1].tickets) == {"r1"}
    assert await persister.flush() and len(store.writes) == 2  # nothing changed: nothing written

    store.mode = "hang"
    core.admit(1.0, "q", "", 100, "r2")
    with caplog.at_level(logging.INFO, logger="services.scheduler.state"):
        started = asyncio.get_running_loop().time()
        assert not await persister.flush()  # bounded by the write timeout
        assert asyncio.get_running_loop().time() - started < 1.0
        store.mode = "fail"
        core.complete(2.0, "p", "r1", None, 150, 0)
        for _ in range(3):
            assert not await persister.flush()
        assert not core.ledger.take_changes()  # an outage does not accumulate changes: the rewrite exports all
        store.mode = "ok"
        assert await persister.flush()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot write to flaky:" in m for m in messages) == 1
    assert any("cannot write to flaky" in m and "(TimeoutError)" in m for m in messages)  # the hang, named
    assert sum("writable again" in m for m in messages) == 1
    assert store.writes[-1].full and set(store.programs) == {"p", "q"} and set(store.tickets) == {"r2"}
    assert persister.metrics.state_write_failures._value.get() == 4


async def test_scheduler_restarted_on_its_state_file_recovers_the_table(tmp_path):
    path = str(tmp_path / "state.sqlite")
    first = await start_harness(state_path=path)
    try:
        await first.set_capacity({("w1", 0): 10_000})
        await first.admit("p", "r1", 100)
        await first.complete("p", "r1", 2_000, 10, "w1", 0)
        await first.admit("q", "r2", 300)
        table = first.table()
    finally:
        await first.channel.close()
        await first.running.stop()  # a graceful stop writes the last batch
    second = await start_harness(state_path=path)
    try:
        assert second.table() == table
        assert second.running.persister.recovery.programs == 2
        await second.complete("q", "r2", 400, 0, "w1", 0)  # the running turn survived the restart
        assert second.core.program("q").token_total == 400
    finally:
        await second.channel.close()
        await second.running.stop()


async def test_a_state_file_in_use_refuses_the_start_naming_the_setting(tmp_path):
    path = str(tmp_path / "state.sqlite")
    first = await start_harness(state_path=path)
    try:
        with pytest.raises(ConfigError) as err:
            await start_harness(state_path=path)
        assert err.value.field == "state_path" and "in use by another scheduler" in err.value.reason
    finally:
        await first.channel.close()
        await first.running.stop()


async def test_a_redis_store_that_never_answers_refuses_the_start_within_the_load_timeout():
    started = asyncio.get_running_loop().time()
    with pytest.raises(ConfigError) as err:
        await start_harness(
            state_redis_url="redis://user:secret@127.0.0.1:1/0",
            state_load_timeout_seconds=0.5,
            state_write_timeout_seconds=0.2,
        )
    assert asyncio.get_running_loop().time() - started < 5
    assert err.value.field == "state_redis_url" and "within 0.5s" in err.value.reason
    assert "secret" not in str(err.value)


async def test_without_the_redis_package_the_redis_store_is_a_config_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_redis(name, *args, **kwargs):
        if name == "redis" or name.startswith("redis."):
            raise ImportError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_redis)
    with pytest.raises(ConfigError) as err:
        await start_harness(state_redis_url="redis://127.0.0.1:1/0")
    assert err.value.field == "state_redis_url" and "`redis` package" in err.value.reason


def _rss_anon_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))


def test_a_batch_of_encoded_records_takes_about_their_size_in_memory():
    # orjson builds each output in a buffer of several KiB and shrinks it in place: kept, each ~400-byte
    # record pinned ~8 KiB of the C heap, so a 10,000-program batch grew the scheduler's RSS by ~78 MiB for
    # as long as it lived (the soak's 85 <-> 165 MiB swings). Encoded records are copied to their size.
    core = SchedulerCore(ControlParams(), ticket_lease_seconds=30.0)
    for i in range(10_000):
        core.admit(0.0, f"program-{i}", "", 2_000, f"r{i}")
    records = [durable.export_program(core.ledger, sid) for sid in core.ledger.programs]
    tickets = [durable.export_ticket(core.ledger, rid) for rid in core.ledger.turns]
    before = _rss_anon_kb()
    batch = [encode_program(r, 0.0) for r in records if r is not None]
    batch += [encode_ticket(t, 0.0) for t in tickets if t is not None]
    grown_kb = _rss_anon_kb() - before
    encoded_kb = sum(len(b) for b in batch) // 1024
    assert len(batch) == 20_000
    assert grown_kb < 4 * encoded_kb + 2_048, (grown_kb, encoded_kb)  # before the copy: ~20x
