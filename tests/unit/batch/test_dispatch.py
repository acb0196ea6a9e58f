"""The registry's per-request state machine (restart safety, exactly-once results, expiry) and the
dispatcher's rate: never above the lease, nothing on an expired lease."""

import asyncio
import time

from services.batch.adapters.registry import Registry
from services.batch.core.batch_api import parse_batch_input
from services.batch.core.lease import DrainLease
from services.batch.dispatcher import Dispatcher
from services.common.clock import SystemClock
from tests.unit.batch.fakes import batch_jsonl


def new_batch(reg: Registry, n=3, now=1000, window_s=3600):
    data = batch_jsonl(n)
    f = reg.add_input_file("in.jsonl", data, parse_batch_input(data), now)
    return reg.create_batch(f["id"], "/v1/chat/completions", "1h", window_s, None, now)


def test_claim_recover_and_exactly_once_results(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite3"))
    b = new_batch(reg)
    assert reg.claim(5) == []  # still validating
    reg.advance(1001)
    claimed = reg.claim(2)
    assert [c.custom_id for c in claimed] == ["req-0", "req-1"] and claimed[0].attempts == 1
    assert reg.queue_counts() == (1, 2)
    line = {"id": "x", "custom_id": "req-0", "response": {"status_code": 200}, "error": None}
    assert reg.record_result(b["id"], 0, "output", line)
    assert not reg.record_result(b["id"], 0, "output", line)  # never twice
    reg.close()
    reg = Registry(str(tmp_path / "r.sqlite3"))  # a restart
    assert reg.recover() == 1  # req-1 was in flight
    again = reg.claim(5)
    assert [c.custom_id for c in again] == ["req-1", "req-2"] and again[0].attempts == 2
    for c in again:
        reg.record_result(c.batch_id, c.idx, "output", {"custom_id": c.custom_id})
    assert reg.advance(1002) == [(b["id"], "in_progress", "completed")]
    out = reg.file_content(reg.get_batch(b["id"])["output_file_id"]).decode().splitlines()
    assert len(out) == 3 and reg.get_batch(b["id"])["request_counts"]["completed"] == 3


def test_expiry_closes_unsent_requests_and_waits_for_in_flight(tmp_path):
    reg = Registry(":memory:")
    b = new_batch(reg, n=3, now=1000, window_s=60)
    reg.advance(1000)
    c = reg.claim(1)[0]
    assert reg.advance(1061) == []  # one still in flight
    assert reg.get_batch(b["id"])["status"] == "in_progress"
    reg.record_result(c.batch_id, c.idx, "output", {"custom_id": c.custom_id})
    assert reg.advance(1062) == [(b["id"], "in_progress", "expired")]
    got = reg.get_batch(b["id"])
    assert got["expired_at"] == 1062 and got["output_file_id"] and got["error_file_id"]
    errors = reg.file_content(got["error_file_id"]).decode()
    assert errors.count("batch_expired") == 2


def test_open_batches_then_each_end_reported_once(tmp_path):
    """What the planner is told: every non-terminal batch while open, then its end until acknowledged."""
    reg = Registry(":memory:")
    b = new_batch(reg, n=3, now=1000)
    (o,) = reg.open_batches()
    assert (o["id"], o["request_counts"]["total"], o["expires_at"]) == (b["id"], 3, 4600)
    assert reg.ended_unreported() == []
    reg.cancel(b["id"], 1001)
    assert reg.open_batches()[0]["status"] == "cancelling"
    reg.advance(1002)
    assert reg.open_batches() == []
    (ended,) = reg.ended_unreported()
    assert ended["status"] == "cancelled"
    reg.mark_ended_reported(b["id"])
    assert reg.ended_unreported() == []


class LeaseBox:
    def __init__(self):
        self.lease = None

    def set(self, rate, ttl_s):
        now = time.monotonic()
        self.lease = DrainLease("default", rate, now + ttl_s, "d")


async def test_dispatch_never_exceeds_the_leased_rate(upstream):
    reg = Registry(":memory:")
    new_batch(reg, n=40, now=int(time.time()))
    box = LeaseBox()
    d = Dispatcher(reg, lambda: box.lease, SystemClock(), base_url=upstream.url, max_inflight=16)
    await d.start()
    try:
        await asyncio.sleep(0.3)
        assert upstream.requests == []  # no lease: nothing
        box.set(10.0, 30)
        d.wake()
        started = time.monotonic()
        await asyncio.sleep(1.0)
        elapsed = time.monotonic() - started
        assert 5 <= len(upstream.requests) <= 10 * elapsed + 1
        box.set(10.0, 0.0)  # expired
        await asyncio.sleep(0.1)
        seen = len(upstream.requests)
        await asyncio.sleep(0.5)
        assert len(upstream.requests) == seen
        fb = d.feedback()
        assert fb.applied_max_admission_rps is None and fb.queued_requests == 40 - seen
        box.set(0.0, 30)  # an explicit pause
        assert d.feedback().applied_max_admission_rps == 0.0
    finally:
        await d.stop()


async def test_max_inflight_bounds_concurrency(upstream):
    reg = Registry(":memory:")
    new_batch(reg, n=10, now=int(time.time()))
    box = LeaseBox()
    box.set(1000.0, 30)
    upstream.gate = asyncio.Event()
    d = Dispatcher(reg, lambda: box.lease, SystemClock(), base_url=upstream.url, max_inflight=3)
    await d.start()
    try:
        await asyncio.sleep(0.5)
        assert len(upstream.requests) == 3 and d.feedback().inflight_requests == 3
        upstream.gate.set()
    finally:
        await d.stop()


def test_a_registry_the_planner_kept_before_the_split_carries_on(tmp_path):
    """The planner's old registry (files, batches, requests, and `external` demand-only jobs) handed to the
    batch service: its open batch is still served and reported; its external job is closed, never sent."""
    import sqlite3

    path = str(tmp_path / "planner.sqlite3")
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(
        """
        CREATE TABLE files (id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
          created_at INTEGER NOT NULL, kind TEXT NOT NULL, batch_id TEXT, content BLOB,
          lines INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE input_lines (file_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL,
          url TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (file_id, idx));
        CREATE TABLE batches (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, endpoint TEXT NOT NULL,
          input_file_id TEXT, completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
          expires_at INTEGER NOT NULL, in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER,
          failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER, output_file_id TEXT,
          error_file_id TEXT, errors TEXT, metadata TEXT, total INTEGER NOT NULL, completed INTEGER NOT NULL DEFAULT 0,
          failed INTEGER NOT NULL DEFAULT 0, external INTEGER NOT NULL DEFAULT 0,
          pool_id TEXT NOT NULL DEFAULT 'default', dispatched INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE requests (batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL,
          body TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, result TEXT, result_kind TEXT,
          PRIMARY KEY (batch_id, idx));
        INSERT INTO batches (id, endpoint, completion_window, status, created_at, expires_at, metadata, total,
          external) VALUES ('ext-1', '', '', 'in_progress', 1000, 9000, '{}', 5, 1);
        INSERT INTO batches (id, endpoint, completion_window, status, created_at, expires_at, metadata, total)
          VALUES ('batch_a', '/v1/chat/completions', '24h', 'in_progress', 1000, 9000, '{}', 1);
        INSERT INTO requests (batch_id, idx, custom_id, url, body, state)
          VALUES ('batch_a', 0, 'a', '/v1/chat/completions', '{}', 'queued');
        """
    )
    old.close()
    reg = Registry(path)
    try:
        assert [b["id"] for b in reg.open_batches()] == ["batch_a"]
        assert reg.ended_unreported() == [] and reg.get_batch("ext-1")["status"] == "cancelled"
        (claimed,) = reg.claim(5)
        assert claimed.batch_id == "batch_a"
    finally:
        reg.close()
    Registry(path).close()  # opening it again changes nothing


def test_dispatch_retries_follow_the_one_retry_policy(tmp_path):
    """Retryable failures wait as services/common/outbound/retry.py says, doubling to a cap, within max_attempts."""
    reg = Registry(str(tmp_path / "r.sqlite3"))
    d = Dispatcher(reg, lambda: None, SystemClock(), base_url="http://127.0.0.1:9", max_attempts=3)
    assert d.retry.may_try_again(2) and not d.retry.may_try_again(3)
    assert [d.retry.delay_s(n, rand=lambda: 0.0) for n in (1, 2, 3, 10)] == [0.25, 0.5, 1.0, 8.0]
    assert 0.2 <= d.retry.delay_s(1, rand=lambda: 1.0) < 0.25  # jittered down, never up


def test_a_request_requeued_after_its_batch_was_cancelled_is_closed_and_the_batch_ends(tmp_path):
    """A retryable failure that comes back after a cancel (the request was in flight, or in its backoff)
    must not leave a queued request that nothing claims: the batch would stay `cancelling` forever."""
    reg = Registry(str(tmp_path / "r.sqlite3"))
    b = new_batch(reg, n=2)
    reg.advance(1001)
    in_flight = reg.claim(1)[0]
    reg.cancel(b["id"], 1002)
    reg.advance(1002)
    assert reg.get_batch(b["id"])["status"] == "cancelling"  # waits for the request in flight
    reg.requeue(in_flight.batch_id, in_flight.idx)
    assert reg.request_states(b["id"]) == {"cancelled": 2}
    reg.advance(1003)
    ended = reg.get_batch(b["id"])
    assert ended["status"] == "cancelled" and ended["error_file_id"]
    assert reg.file_content(ended["error_file_id"]).count(b"batch_cancelled") == 2
