"""The leadership lease and the epoch fence of both state stores (a shared SQLite file, Redis)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from services.scheduler.adapters.state_store import (
    RedisStateStore,
    SqliteStateStore,
    StoreError,
    StoreFenced,
    StoreLost,
    WriteBatch,
)
from tests.support.redis_server import redis_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(30)
TTL_S = 0.3


class Wall:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "redis"])
async def pair(request, tmp_path):
    """Two stores on one shared location, as two replicas open it; and a way to let the lease expire."""
    if request.param == "sqlite":
        wall = Wall()
        a = SqliteStateStore(tmp_path / "s.sqlite", shared=True, wall=wall)
        b = SqliteStateStore(tmp_path / "s.sqlite", shared=True, wall=wall)

        async def expire():
            wall.now += 10

    else:
        server = request.getfixturevalue("redis_server")
        a = RedisStateStore(server.url, "t:", timeout_s=1.0)
        b = RedisStateStore(server.url, "t:", timeout_s=1.0)

        async def expire():
            await asyncio.sleep(TTL_S + 0.1)

    await a.open()
    await b.open()
    yield a, b, expire
    await a.close()
    await b.close()


def batch(value: bytes) -> WriteBatch:
    return WriteBatch(programs={"p": value}, meta=b'{"format": 1}')


async def test_one_replica_takes_the_lease_the_other_sees_who_holds_it(pair):
    a, b, _ = pair
    got = await a.acquire_lease("A", "a:1", TTL_S, 0)
    assert got.held and got.epoch == 1 and got.record.address == "a:1"
    other = await b.acquire_lease("B", "b:1", TTL_S, 0)
    assert not other.held and other.record.holder == "A" and other.record.epoch == 1
    assert (await a.renew_lease("A", "a:1", 1, TTL_S)).held
    assert not (await b.renew_lease("B", "b:1", 1, TTL_S)).held


async def test_an_expired_lease_goes_to_the_next_replica_at_a_higher_epoch_and_fences_the_old_one(pair):
    a, b, expire = pair
    await a.acquire_lease("A", "a:1", TTL_S, 0)
    await a.write(batch(b"from A"), epoch=1)
    await expire()
    got = await b.acquire_lease("B", "b:1", TTL_S, 0)
    assert got.held and got.epoch == 2
    # The deposed leader can neither renew nor write; the new one can.
    renew = await a.renew_lease("A", "a:1", 1, TTL_S)
    assert not renew.held and renew.record.holder == "B"
    with pytest.raises(StoreFenced):
        await a.write(batch(b"stale"), epoch=1)
    await b.write(batch(b"from B"), epoch=2)
    assert (await b.load()).programs == [b"from B"]


async def test_a_released_lease_is_taken_at_once(pair):
    a, b, _ = pair
    await a.acquire_lease("A", "a:1", 30.0, 0)
    await a.release_lease("A", 1)
    got = await b.acquire_lease("B", "b:1", 30.0, 0)
    assert got.held and got.epoch == 2


async def test_a_new_epoch_is_above_every_epoch_the_replica_saw(pair):
    a, _, _ = pair
    got = await a.acquire_lease("A", "a:1", TTL_S, 41)
    assert got.epoch == 42


async def test_redis_that_lost_everything_lets_the_leader_re_establish_its_lease(redis_server, tmp_path):
    a = RedisStateStore(redis_server.url, "t:", timeout_s=1.0)
    b = RedisStateStore(redis_server.url, "t:", timeout_s=1.0)
    try:
        await a.acquire_lease("A", "a:1", 30.0, 0)
        redis.Redis.from_url(redis_server.url).flushall()
        with pytest.raises(StoreLost):  # not fenced: no successor holds the epoch
            await a.write(batch(b"x"), epoch=1)
        assert (await a.renew_lease("A", "a:1", 1, 30.0)).held  # re-established at its own epoch
        await a.write(WriteBatch(programs={"p": b"all"}, full=True), epoch=1)
        assert not (await b.acquire_lease("B", "b:1", 30.0, 0)).held
    finally:
        await a.close()
        await b.close()


async def test_a_sqlite_writer_frozen_inside_a_table_write_does_not_block_the_lease(tmp_path):
    """The lease lives in its own file: a replica holding the table's write lock (frozen mid-write) cannot
    keep another from taking the lease."""
    import sqlite3

    wall = Wall()
    b = SqliteStateStore(tmp_path / "s.sqlite", shared=True, wall=wall)
    await b.open()
    frozen = sqlite3.connect(tmp_path / "s.sqlite", isolation_level=None)
    try:
        frozen.execute("BEGIN IMMEDIATE")  # holds the table's write lock, as a SIGSTOPped writer would
        got = await asyncio.wait_for(b.acquire_lease("B", "b:1", TTL_S, 0), timeout=2)
        assert got.held
        assert (await b.load()).programs == []  # and the table is still readable
    finally:
        frozen.execute("ROLLBACK")
        frozen.close()
        await b.close()


_RENEWER = """
import asyncio, sys
from services.scheduler.adapters.state_store import SqliteStateStore

async def main(path, ttl_s):
    store = SqliteStateStore(path, shared=True)
    await store.open()
    got = await store.acquire_lease("frozen", "frozen:1", ttl_s, 0)
    assert got.held, got
    print("leading", flush=True)
    while True:  # renew as fast as it can: most of its time is spent inside a renewal
        assert (await store.renew_lease("frozen", "frozen:1", got.epoch, ttl_s)).held

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


@pytest.mark.parametrize("round_", range(4))
async def test_a_replica_frozen_in_the_middle_of_renewing_cannot_keep_the_lease(tmp_path, round_):
    """A leader SIGSTOPped at an arbitrary instant of its renewals (here: while renewing back to back, so
    nearly always inside one) loses the lease when it expires: nothing it holds while frozen keeps another
    replica from taking it. (Failed before the lease moved out of an SQLite row, whose write lock a frozen
    renewal kept, so the standby never led: a CI run's SIGSTOP failover test.)"""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    ttl_s = 0.5
    root = Path(__file__).resolve().parents[3]
    renewer = subprocess.Popen(
        [sys.executable, "-c", _RENEWER, str(tmp_path / "s.sqlite"), str(ttl_s)],
        stdout=subprocess.PIPE,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    b = SqliteStateStore(tmp_path / "s.sqlite", shared=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(renewer.stdout.readline), timeout=20)
        assert line.strip() == b"leading"
        await asyncio.sleep(0.1 + 0.037 * round_)
        renewer.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        await b.open()
        taken = None
        while taken is None and time.monotonic() - frozen_at < ttl_s + 3.0:
            try:
                got = await asyncio.wait_for(b.acquire_lease("B", "b:1", ttl_s, 0), timeout=2)
                taken = got if got.held else None
            except (StoreError, TimeoutError):
                pass
            await asyncio.sleep(0.02)
        assert taken is not None, "the standby could not take the lease of a frozen leader"
        assert taken.epoch == 2
        await b.write(batch(b"from B"), epoch=2)  # and it writes the table
    finally:
        renewer.kill()
        renewer.wait(timeout=10)
        await b.close()
