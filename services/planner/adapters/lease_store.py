"""Lease stores: in-memory (embedded default) and Redis with a writer fence. One interface.

Both stamp a lease at publication: `valid_until = now + duration` on the caller's monotonic
clock (what this process judges expiry by) and on the wall clock (`valid_until_unix_ms`, for
other processes). Sequencing is the store's: a new decision gets the next `writer_sequence`; a
retry of the same decision reuses its sequence and expiry, so it is idempotent.

Redis layout (reference §3.5, with a relative TTL):
* control key — a hash {api_version, pool_id, max_admission_rps, valid_until_unix_ms,
  decision_id, writer_epoch, writer_id, writer_sequence}, expiring with the lease (PEXPIRE of
  the lease's remaining monotonic time, so neither a planner wall-clock jump nor clock skew
  against Redis can extend it);
* fence key — a non-expiring hash {epoch, writer_id, last_sequence, last_payload}, in the same
  Redis-Cluster slot (`{control}:planner-writer-fence` unless the control key has a hash tag).

Bootstrap (once per process, one Lua call): epoch += 1, fresh random writer id, sequence 0 and
a zero-rate lease. Apply (one Lua call): a stale epoch or writer returns 0 (the writer is deposed),
a lower sequence -1, and neither changes anything; the same sequence with a different payload is an
error; an identical retry returns 2 (and repairs an evicted control key); a new sequence returns 1.

A lost fence (Redis restarted without its data) is re-established by the next write, from the
writer's own epoch and id, marked `reestablished` (apply returns 3). Who may do so, so that a
deposed planner stays fenced out:
* a writer that was ever refused as stale (deposed) never re-establishes;
* a re-established fence of a lower epoch is taken over by a writer of a higher one (an older
  planner that had not yet noticed it was deposed may have re-established it first);
* a fence bootstrapped after the loss (by a planner started since: not `reestablished`) is
  respected whatever its epoch: that planner is the newest.

Outcomes: `LeaseRejected` = known not applied; `LeaseOutcomeUnknown` = may or may not have been
applied (a transport failure after one identical retry). The caller stops that tick's effects
either way and lets the last lease lapse by its TTL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
from typing import Protocol

from services.common.outbound.retry import RetryPolicy, retrying
from services.planner.core.types import Lease, LeaseDecision

log = logging.getLogger("services.planner.lease")
API_VERSION = "bandmaster.planner/v1"


class LeaseStoreError(Exception):
    pass


class LeaseRejected(LeaseStoreError):
    """The store refused the write; nothing changed."""


class LeaseOutcomeUnknown(LeaseStoreError):
    """The write may or may not have been applied."""


class LeaseStore(Protocol):
    name: str

    async def start(self, zero: LeaseDecision, now_mono: float, now_wall: float) -> Lease: ...

    async def publish(self, decision: LeaseDecision, now_mono: float, now_wall: float) -> Lease: ...

    def current(self) -> Lease | None: ...

    async def close(self) -> None: ...


def _check(decision: LeaseDecision) -> None:
    if decision.max_admission_rps < 0 or not math.isfinite(decision.max_admission_rps):
        raise LeaseRejected("max_admission_rps must be finite and >= 0")


class _Sequencer:
    """decision_id -> (payload identity, sequence, lease stamp): retries reuse, new ids advance."""

    def __init__(self) -> None:
        self.last_sequence = 0
        self._seen: dict[str, tuple[tuple, int, float, int]] = {}

    def assign(self, decision: LeaseDecision, now_mono: float, now_wall: float) -> tuple[int, float, int]:
        identity = (decision.pool_id, decision.max_admission_rps, decision.duration_s)
        seen = self._seen.get(decision.decision_id)
        if seen is not None:
            if seen[0] != identity:
                raise LeaseRejected(f"decision {decision.decision_id} reused with a different payload")
            return seen[1], seen[2], seen[3]
        self.last_sequence += 1
        stamp = (self.last_sequence, now_mono + decision.duration_s, int((now_wall + decision.duration_s) * 1000))
        # Keep only recent decisions: an old id can never come back after a newer one was issued.
        self._seen = {k: v for k, v in self._seen.items() if v[2] > now_mono}
        self._seen[decision.decision_id] = (identity, *stamp)
        return stamp


class MemoryLeaseStore:
    """The embedded store: leases live in this process (served by GetLease / WatchLease)."""

    name = "memory"

    def __init__(self) -> None:
        self.epoch = 0
        self._seq = _Sequencer()
        self._current: Lease | None = None
        self.fail_next: Exception | None = None
        """Tests: raise this from the next publish (then clear it)."""

    async def start(self, zero: LeaseDecision, now_mono: float, now_wall: float) -> Lease:
        if zero.max_admission_rps != 0:
            raise LeaseRejected("the start-up lease must be a zero-rate lease")
        self.epoch += 1
        self._seq = _Sequencer()
        return await self.publish(zero, now_mono, now_wall)

    async def publish(self, decision: LeaseDecision, now_mono: float, now_wall: float) -> Lease:
        if self.epoch == 0:
            raise LeaseRejected("the store was not started")
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        _check(decision)
        seq, until_mono, until_ms = self._seq.assign(decision, now_mono, now_wall)
        if self._current is not None and seq < self._current.writer_sequence:
            raise LeaseRejected("a lower writer sequence")
        self._current = Lease(
            decision.pool_id, decision.max_admission_rps, until_ms, decision.decision_id, self.epoch, seq, until_mono
        )
        return self._current

    def current(self) -> Lease | None:
        return self._current

    async def close(self) -> None:
        return None


_BOOTSTRAP = """
local epoch = redis.call('HINCRBY', KEYS[2], 'epoch', 1)
redis.call('HSET', KEYS[2], 'writer_id', ARGV[1], 'last_sequence', 0, 'last_payload', ARGV[2])
redis.call('HDEL', KEYS[2], 'reestablished')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'api_version', ARGV[3], 'pool_id', ARGV[4], 'max_admission_rps', ARGV[5],
  'valid_until_unix_ms', ARGV[6], 'decision_id', ARGV[7], 'writer_epoch', epoch, 'writer_id', ARGV[1],
  'writer_sequence', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[8])
return epoch
"""

_APPLY = """
local f = redis.call('HMGET', KEYS[2], 'epoch', 'writer_id', 'last_sequence', 'last_payload', 'reestablished')
local code = 1
if not f[1] or (f[5] and tonumber(f[1]) < tonumber(ARGV[1])) then
  -- The fence was lost (or re-established by an older writer): take it from this writer's epoch.
  if ARGV[11] ~= '1' then return 0 end
  redis.call('HSET', KEYS[2], 'epoch', ARGV[1], 'writer_id', ARGV[2], 'reestablished', 1)
  code = 3
else
  if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] then return 0 end
  local seq = tonumber(ARGV[3])
  local last = tonumber(f[3])
  if last == nil or seq < last then return -1 end
  if seq == last then
    if f[4] ~= ARGV[4] then return redis.error_reply('writer sequence reused with different payload') end
    code = 2
  end
end
redis.call('HSET', KEYS[2], 'last_sequence', ARGV[3], 'last_payload', ARGV[4])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'api_version', ARGV[5], 'pool_id', ARGV[6], 'max_admission_rps', ARGV[7],
  'valid_until_unix_ms', ARGV[8], 'decision_id', ARGV[9], 'writer_epoch', ARGV[1], 'writer_id', ARGV[2],
  'writer_sequence', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[10])
return code
"""


def fence_key_for(control_key: str) -> str:
    """The fence key shares the control key's Redis-Cluster slot."""
    start = control_key.find("{")
    end = control_key.find("}", start + 1) if start >= 0 else -1
    if start >= 0 and end > start + 1:
        return f"{control_key}:planner-writer-fence"
    return "{" + control_key + "}:planner-writer-fence"


def _rate_text(rate: float) -> str:
    return format(rate, ".17g")


def _payload(pool_id: str, rate: float, until_ms: int, decision_id: str) -> str:
    return json.dumps([pool_id, _rate_text(rate), until_ms, decision_id], separators=(",", ":"))


class RedisLeaseStore:
    """Leases in Redis, written by one fenced writer (this process) through Lua scripts."""

    name = "redis"

    def __init__(
        self, url: str, control_key: str, *, connect_timeout_s: float = 2.0, socket_timeout_s: float = 2.0, client=None
    ) -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.control_key = control_key
        self.fence_key = fence_key_for(control_key)
        self.client = client or aioredis.Redis.from_url(
            url, socket_connect_timeout=connect_timeout_s, socket_timeout=socket_timeout_s, decode_responses=True
        )
        self.writer_id = ""
        self.epoch = 0
        self.deposed = False
        """Refused as a stale writer once: never re-establishes a lost fence (restart to write again)."""
        self.fences_reestablished = 0
        self._seq = _Sequencer()
        self._current: Lease | None = None
        self._bootstrap = self.client.register_script(_BOOTSTRAP)
        self._apply = self.client.register_script(_APPLY)

    async def start(self, zero: LeaseDecision, now_mono: float, now_wall: float) -> Lease:
        """Claim a new epoch with a zero-rate lease. Raises LeaseStoreError if Redis cannot be reached."""
        if zero.max_admission_rps != 0:
            raise LeaseRejected("the start-up lease must be a zero-rate lease")
        self.writer_id = secrets.token_hex(16)
        self.deposed = False
        self._seq = _Sequencer()
        until_mono = now_mono + zero.duration_s
        until_ms = int((now_wall + zero.duration_s) * 1000)
        payload = _payload(zero.pool_id, 0.0, until_ms, zero.decision_id)
        try:
            epoch = await self._bootstrap(
                keys=[self.control_key, self.fence_key],
                args=[
                    self.writer_id,
                    payload,
                    API_VERSION,
                    zero.pool_id,
                    _rate_text(0.0),
                    until_ms,
                    zero.decision_id,
                    max(1, int(zero.duration_s * 1000)),
                ],
            )
        except Exception as exc:
            raise LeaseOutcomeUnknown(f"Redis bootstrap failed: {type(exc).__name__}: {exc}") from exc
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch <= 0:
            raise LeaseRejected(f"Redis returned an invalid writer epoch {epoch!r}")
        self.epoch = epoch
        self._current = Lease(zero.pool_id, 0.0, until_ms, zero.decision_id, epoch, 0, until_mono)
        return self._current

    async def publish(self, decision: LeaseDecision, now_mono: float, now_wall: float) -> Lease:
        import redis.exceptions as rex

        if self.epoch == 0:
            raise LeaseRejected("the store was not started")
        _check(decision)
        seq, until_mono, until_ms = self._seq.assign(decision, now_mono, now_wall)
        ttl_ms = int((until_mono - now_mono) * 1000)
        if ttl_ms <= 0:
            raise LeaseRejected(f"decision {decision.decision_id} has already expired")
        rate = _rate_text(decision.max_admission_rps)
        args: list[str | int | float] = [
            self.epoch,
            self.writer_id,
            seq,
            _payload(decision.pool_id, decision.max_admission_rps, until_ms, decision.decision_id),
            API_VERSION,
            decision.pool_id,
            rate,
            until_ms,
            decision.decision_id,
            ttl_ms,
            "0" if self.deposed else "1",
        ]
        unreachable = (rex.ConnectionError, rex.TimeoutError, asyncio.TimeoutError, OSError)
        try:
            result = await retrying(
                lambda: self._apply(keys=[self.control_key, self.fence_key], args=args),
                RetryPolicy(first_delay_s=0.0, max_attempts=2, retry_on=unreachable),
                on_retry=lambda exc, _failures, _delay_s: log.warning(
                    "lease publish to Redis failed (%s); retrying once with the same sequence", exc
                ),
            )
        except unreachable as exc:
            raise LeaseOutcomeUnknown(f"Redis unreachable publishing {decision.decision_id}: {exc}") from exc
        except rex.ResponseError as exc:
            raise LeaseRejected(f"Redis refused the lease: {exc}") from exc
        if result == 0:
            if not self.deposed:
                log.warning(
                    "lease writer epoch %d refused as stale: another planner holds the Redis fence; "
                    "this planner writes no lease until it restarts",
                    self.epoch,
                )
            self.deposed = True
            raise LeaseRejected("Redis rejected a stale lease writer (another planner holds the fence)")
        if result == -1:
            raise LeaseRejected("Redis rejected a lower writer sequence")
        if result not in (1, 2, 3):
            raise LeaseRejected(f"Redis answered the lease write with {result!r}")
        if result == 3:
            self.fences_reestablished += 1
            log.warning(
                "Redis lost the lease writer fence (restarted without its data?); re-established it "
                "from writer epoch %d, sequence %d",
                self.epoch,
                seq,
            )
        self._current = Lease(
            decision.pool_id, decision.max_admission_rps, until_ms, decision.decision_id, self.epoch, seq, until_mono
        )
        return self._current

    def current(self) -> Lease | None:
        return self._current

    async def read_control(self) -> dict:
        """The control hash as Redis holds it now (empty when expired)."""
        return await self.client.hgetall(self.control_key)

    async def close(self) -> None:
        try:
            await self.client.aclose()
        except Exception:  # closing is best effort
            pass
