"""Redis SIGSTOPped or killed under a scheduler that keeps its table there: the scheduler keeps serving
(every write is bounded by its timeout, failures are counted and logged once per outage), and once
Redis answers again it holds the whole table, changes made during the outage included."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from tests.faults.support import Client, metric, start_scheduler
from tests.support.eventually import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
FLUSH_S = 0.1
WRITE_TIMEOUT_S = 0.3


def _store(redis_server) -> list[str]:
    return [
        "--state-redis-url",
        redis_server.url,
        "--state-flush-seconds",
        str(FLUSH_S),
        "--state-write-timeout-seconds",
        str(WRITE_TIMEOUT_S),
    ]


async def _turns(client: Client, prefix: str, n: int) -> float:
    """n one-turn programs; returns the slowest round trip (Admit + Complete), in seconds."""
    slowest = 0.0
    for i in range(n):
        started = time.monotonic()
        await client.turn(f"{prefix}{i}", f"{prefix}{i}-1", 100 + i)
        slowest = max(slowest, time.monotonic() - started)
    return slowest


async def _store_up(proc, up: bool) -> None:
    async def check():
        return await metric(proc, "bandmaster_scheduler_state_store_up") == (1.0 if up else 0.0)

    await assert_eventually(check, timeout_s=10, interval_s=0.05)


async def _recovered_table(tmp_path, capacity, first, store: list[str], name: str) -> dict:
    """SIGKILL `first`, start a scheduler from the same Redis, return its table."""
    first.kill()
    await first.wait_exit_async()
    second = await start_scheduler(tmp_path, capacity.address, *store, name=name)
    client = Client.connect(second.ready["grpc"])
    try:
        return {sid: (p.token_total, p.turns) for sid, p in (await client.programs()).items()}
    finally:
        await client.close()
        await second.stop_async()


async def test_redis_stopped_then_continued(tmp_path, scripted_capacity, redis_server):
    store = _store(redis_server)
    sched = await start_scheduler(tmp_path, scripted_capacity.address, *store)
    client = Client.connect(sched.ready["grpc"])
    try:
        await client.wait_replicas(1)
        await _turns(client, "before", 5)
        await _store_up(sched, True)

        redis_server.signal(signal.SIGSTOP)
        try:
            # Serving on: round trips are not held up by the store (a write is bounded and off the RPC path).
            slowest = await _turns(client, "during", 20)
            assert slowest < 0.5, slowest
            await _store_up(sched, False)  # noticed at the first write it could not make
            await asyncio.sleep(1.0)  # several failing attempts: still one WARNING for the outage
            assert await metric(sched, "bandmaster_scheduler_state_write_failures_total") >= 2
            assert sched.log_text().count("scheduler state: cannot write to redis://") == 1
        finally:
            redis_server.signal(signal.SIGCONT)
        await _store_up(sched, True)
        assert "writable again after" in sched.log_text()
        await asyncio.sleep(FLUSH_S * 5)
        table = {sid: (p.token_total, p.turns) for sid, p in (await client.programs()).items()}
        assert len(table) == 25
        assert await _recovered_table(tmp_path, scripted_capacity, sched, store, "scheduler-2") == table
    finally:
        await client.close()
        await sched.stop_async()


async def test_redis_killed_and_restarted_empty_gets_the_whole_table_back(tmp_path, scripted_capacity, redis_server):
    store = _store(redis_server)
    sched = await start_scheduler(tmp_path, scripted_capacity.address, *store)
    client = Client.connect(sched.ready["grpc"])
    try:
        await client.wait_replicas(1)
        await _turns(client, "before", 5)
        await _store_up(sched, True)
        redis_server.kill()
        await _turns(client, "during", 5)
        await _store_up(sched, False)
        redis_server.start()  # same port, no data: it lost everything
        await _store_up(sched, True)
        await _turns(client, "after", 5)
        await asyncio.sleep(FLUSH_S * 5)
        table = {sid: (p.token_total, p.turns) for sid, p in (await client.programs()).items()}
        assert len(table) == 15
        assert await _recovered_table(tmp_path, scripted_capacity, sched, store, "scheduler-2") == table
    finally:
        await client.close()
        await sched.stop_async()


async def test_redis_restarted_empty_between_two_writes_is_noticed(tmp_path, scripted_capacity, redis_server):
    """A Redis that comes back empty before the next write: that write fails on the dropped connection
    (or, on a fresh one, finds the generation gone), and the whole table is written again."""
    store = [*_store(redis_server)[:2], "--state-flush-seconds", "2", "--state-write-timeout-seconds", "1"]
    sched = await start_scheduler(tmp_path, scripted_capacity.address, *store)
    client = Client.connect(sched.ready["grpc"])
    try:
        await client.wait_replicas(1)
        await _turns(client, "before", 3)
        await asyncio.sleep(2.5)  # written
        redis_server.kill()
        redis_server.start()
        await _turns(client, "after", 3)

        async def rewritten():
            text = sched.log_text()
            return "lost the scheduler state" in text or "writable again" in text

        await assert_eventually(rewritten, timeout_s=10)
        await asyncio.sleep(2.5)
        table = {sid: (p.token_total, p.turns) for sid, p in (await client.programs()).items()}
        assert await _recovered_table(tmp_path, scripted_capacity, sched, store, "scheduler-2") == table
    finally:
        await client.close()
        await sched.stop_async()  # already gone on success; stopped here when an assertion failed first
