"""Lease stores: the in-memory store and the fenced Redis store against a real redis-server."""

import asyncio

import pytest

from services.planner.adapters.lease_store import (
    LeaseOutcomeUnknown,
    LeaseRejected,
    MemoryLeaseStore,
    RedisLeaseStore,
    fence_key_for,
)
from services.planner.core.types import LeaseDecision
from tests.support.redis_server import redis_server  # noqa: F401  (fixture)

WALL = 1_700_000_000.0


def dec(rate=5.0, did="d-1", duration=30.0):
    return LeaseDecision("default", rate, duration, did)


async def test_memory_store_sequences_and_expires_on_the_monotonic_clock():
    s = MemoryLeaseStore()
    with pytest.raises(LeaseRejected):
        await s.publish(dec(), 0, WALL)
    zero = await s.start(dec(0.0, "planner-startup"), 100.0, WALL)
    assert (zero.max_admission_rps, zero.writer_epoch, zero.writer_sequence) == (0.0, 1, 1)
    lease = await s.publish(dec(5.0, "d-1"), 101.0, WALL + 1)
    assert lease.writer_sequence == 2 and lease.valid_until_mono_s == 131.0
    assert lease.valid_until_unix_ms == int((WALL + 31) * 1000)
    assert lease.rate_at(130.9) == 5.0 and lease.rate_at(131.0) == 0.0
    again = await s.publish(dec(5.0, "d-1"), 105.0, WALL - 3600)  # identical retry, wall clock jumped back
    assert again == lease and again.valid_until_mono_s == 131.0
    with pytest.raises(LeaseRejected):
        await s.publish(dec(6.0, "d-1"), 105.0, WALL)


async def test_memory_store_rejects_a_positive_start_lease():
    with pytest.raises(LeaseRejected):
        await MemoryLeaseStore().start(dec(1.0), 0, WALL)


def test_fence_key_shares_the_control_keys_slot():
    assert fence_key_for("bm:lease:default") == "{bm:lease:default}:planner-writer-fence"
    assert fence_key_for("bm:{pool}:lease") == "bm:{pool}:lease:planner-writer-fence"
    assert fence_key_for("bm:{}:lease") == "{bm:{}:lease}:planner-writer-fence"


async def _store(server, key="bm:lease:default"):
    return RedisLeaseStore(server.url, key, connect_timeout_s=0.5, socket_timeout_s=0.5)


async def test_redis_bootstrap_publishes_zero_and_claims_a_new_epoch(redis_server):
    a = await _store(redis_server)
    lease = await a.start(dec(0.0, "planner-startup-1"), 100.0, WALL)
    assert lease.writer_epoch == 1 and lease.max_admission_rps == 0
    h = await a.read_control()
    assert h["max_admission_rps"] == "0" and h["writer_sequence"] == "0" and h["writer_epoch"] == "1"
    assert 29_000 < await a.client.pttl(a.control_key) <= 30_000
    b = await _store(redis_server)
    assert (await b.start(dec(0.0, "planner-startup-2"), 100.0, WALL)).writer_epoch == 2
    await a.close()
    await b.close()


async def test_redis_fences_a_stale_writer(redis_server):
    old = await _store(redis_server)
    await old.start(dec(0.0, "s1"), 100.0, WALL)
    await old.publish(dec(5.0, "d-1"), 101.0, WALL)
    new = await _store(redis_server)
    await new.start(dec(0.0, "s2"), 102.0, WALL)
    with pytest.raises(LeaseRejected):
        await old.publish(dec(9.0, "d-2"), 103.0, WALL)  # cannot resurrect a positive lease
    h = await new.read_control()
    assert h["max_admission_rps"] == "0" and h["decision_id"] == "s2"
    await new.publish(dec(3.0, "d-9"), 104.0, WALL)
    with pytest.raises(LeaseRejected):
        await old.publish(dec(0.0, "old-shutdown"), 105.0, WALL)  # an old shutdown pause cannot overwrite
    assert (await new.read_control())["max_admission_rps"] == "3"
    await old.close()
    await new.close()


async def test_redis_lower_and_reused_sequences(redis_server):
    s = await _store(redis_server)
    await s.start(dec(0.0, "s"), 100.0, WALL)
    first = await s.publish(dec(5.0, "d-1"), 101.0, WALL)
    await s.publish(dec(6.0, "d-2"), 102.0, WALL)
    # A delayed older write (lower sequence) is refused by the script.
    payload = __import__("services.planner.adapters.lease_store", fromlist=["_payload"])._payload(
        "default", 5.0, first.valid_until_unix_ms, "d-1"
    )
    result = await s._apply(
        keys=[s.control_key, s.fence_key],
        args=[
            s.epoch,
            s.writer_id,
            first.writer_sequence,
            payload,
            "v",
            "default",
            "5",
            first.valid_until_unix_ms,
            "d-1",
            1000,
        ],
    )
    assert result == -1  # a lower sequence (0 means a stale writer)
    # The same sequence with another payload is an error, and changes nothing.
    with pytest.raises(Exception, match="different payload"):
        await s._apply(
            keys=[s.control_key, s.fence_key],
            args=[s.epoch, s.writer_id, 2, "other", "v", "default", "7", 1, "d-2", 1000],
        )
    assert (await s.read_control())["max_admission_rps"] == "6"
    await s.close()


async def test_redis_identical_retry_is_idempotent_and_repairs_an_evicted_key(redis_server):
    s = await _store(redis_server)
    await s.start(dec(0.0, "s"), 100.0, WALL)
    a = await s.publish(dec(5.0, "d-1"), 101.0, WALL)
    await s.client.delete(s.control_key)  # evicted
    b = await s.publish(dec(5.0, "d-1"), 102.0, WALL + 1)  # the retry keeps sequence and expiry
    assert (a.writer_sequence, a.valid_until_unix_ms) == (b.writer_sequence, b.valid_until_unix_ms)
    h = await s.read_control()
    assert h["decision_id"] == "d-1" and h["writer_sequence"] == str(a.writer_sequence)
    assert 28_500 <= await s.client.pttl(s.control_key) <= 29_000 + 10  # the remaining time, not a new 30 s
    await s.close()


async def test_redis_key_expires_with_the_lease(redis_server):
    s = await _store(redis_server)
    await s.start(dec(0.0, "s", duration=0.3), 100.0, WALL)
    await s.publish(dec(5.0, "d-1", duration=0.3), 100.0, WALL)
    assert (await s.read_control())["max_admission_rps"] == "5"
    await asyncio.sleep(0.45)
    assert await s.read_control() == {}
    assert await s.client.exists(s.fence_key) == 1  # the fence outlives leases
    await s.close()


async def test_redis_stopped_is_outcome_unknown_and_the_local_lease_lapses(redis_server):
    s = await _store(redis_server)
    await s.start(dec(0.0, "s"), 100.0, WALL)
    good = await s.publish(dec(5.0, "d-1"), 101.0, WALL)
    redis_server.stop()
    with pytest.raises(LeaseOutcomeUnknown):
        await s.publish(dec(6.0, "d-2"), 102.0, WALL)
    assert s.current() == good and s.current().rate_at(131.0) == 0.0
    await s.close()


async def test_redis_unreachable_at_start(redis_server):
    redis_server.stop()
    s = await _store(redis_server)
    with pytest.raises(LeaseOutcomeUnknown, match="bootstrap"):
        await s.start(dec(0.0, "s"), 100.0, WALL)
    await s.close()


async def _restart_empty(server) -> None:
    """Redis restarted on the same port without its data: the fence and the control key are gone."""
    server.stop()
    server.start()


async def test_redis_restarted_empty_the_writer_re_establishes_its_fence(redis_server):
    s = await _store(redis_server)
    await s.start(dec(0.0, "s"), 100.0, WALL)
    before = await s.publish(dec(5.0, "d-1"), 101.0, WALL)
    await _restart_empty(redis_server)
    lease = await s.publish(dec(7.0, "d-2"), 102.0, WALL)  # one retry covers the dead connection
    assert lease.writer_epoch == before.writer_epoch and lease.writer_sequence == before.writer_sequence + 1
    assert s.fences_reestablished == 1
    h = await s.read_control()
    assert h["max_admission_rps"] == "7" and h["writer_epoch"] == str(s.epoch)
    fence = await s.client.hgetall(s.fence_key)
    assert fence["epoch"] == str(s.epoch) and fence["writer_id"] == s.writer_id and fence["reestablished"] == "1"
    await s.publish(dec(8.0, "d-3"), 103.0, WALL)  # and on as usual
    assert s.fences_reestablished == 1 and (await s.read_control())["max_admission_rps"] == "8"
    await s.close()


async def test_a_deposed_writer_stays_fenced_out_after_redis_lost_the_fence(redis_server):
    old = await _store(redis_server)
    await old.start(dec(0.0, "s1"), 100.0, WALL)
    new = await _store(redis_server)
    await new.start(dec(0.0, "s2"), 101.0, WALL)
    with pytest.raises(LeaseRejected):
        await old.publish(dec(9.0, "old-1"), 102.0, WALL)  # refused as stale: it knows it was deposed
    await _restart_empty(redis_server)
    with pytest.raises(LeaseRejected):
        await old.publish(dec(9.0, "old-2"), 103.0, WALL)  # the fence is gone, but not for it to take
    assert await old.client.exists(old.control_key, old.fence_key) == 0
    await new.publish(dec(3.0, "new-1"), 104.0, WALL)
    with pytest.raises(LeaseRejected):
        await old.publish(dec(9.0, "old-3"), 105.0, WALL)
    assert (await new.read_control())["max_admission_rps"] == "3"
    await old.close()
    await new.close()


async def test_an_older_writer_that_re_established_first_is_taken_over(redis_server):
    """The older planner had not written since it was deposed, so it did not know; the newer takes
    the fence back at its next write and the older is refused from then on."""
    old = await _store(redis_server)
    await old.start(dec(0.0, "s1"), 100.0, WALL)
    new = await _store(redis_server)
    await new.start(dec(0.0, "s2"), 101.0, WALL)
    await _restart_empty(redis_server)
    await old.publish(dec(9.0, "old-1"), 102.0, WALL)
    await new.publish(dec(3.0, "new-1"), 103.0, WALL)
    assert (await new.read_control())["writer_epoch"] == str(new.epoch)
    with pytest.raises(LeaseRejected):
        await old.publish(dec(9.0, "old-2"), 104.0, WALL)
    assert old.deposed and (await new.read_control())["max_admission_rps"] == "3"
    await new.publish(dec(4.0, "new-2"), 105.0, WALL)
    await old.close()
    await new.close()


async def test_a_planner_started_after_the_loss_is_the_writer(redis_server):
    """Its bootstrap (a new epoch from the empty store, not a re-established fence) outranks the
    planner that ran before the loss, whatever the epoch numbers say."""
    before = await _store(redis_server)
    await before.start(dec(0.0, "s1"), 100.0, WALL)
    await before.start(dec(0.0, "s1b"), 100.0, WALL)  # epoch 2 (a restart of its own)
    await _restart_empty(redis_server)
    after = await _store(redis_server)
    assert (await after.start(dec(0.0, "s2"), 101.0, WALL)).writer_epoch == 1
    with pytest.raises(LeaseRejected):
        await before.publish(dec(9.0, "b-1"), 102.0, WALL)
    await after.publish(dec(2.0, "a-1"), 103.0, WALL)
    assert (await after.read_control())["max_admission_rps"] == "2"
    await before.close()
    await after.close()
