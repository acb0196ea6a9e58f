"""Where the scheduler's durable state lives: an embedded SQLite file (default) or Redis.

Both stores keep three things, keyed so that a write only touches what changed: one record per
program (by session id), one per running turn (by request id), and one meta record (creation and
pause sequences, tail-protection history, totals). A write is a batch applied atomically (one
SQLite transaction, one Redis MULTI/EXEC): either a delta (upserts and deletes) or a full
replacement. Records are JSON; their times are wall-clock seconds, so a restarted process (another
monotonic clock) maps them onto its own.

- SQLite: WAL journal, `synchronous=FULL` (one fsync per batch, on the store's own thread, never on
  the event loop or per RPC); an exclusive `flock` on `<path>.lock` keeps a second scheduler off the
  same file, unless the file is `shared` by an active/standby pair (leader election): the lease then
  lives in plain files, `<path>.lease/epoch-<E>` (adapters/file_lease.py: taken and renewed without any
  lock, so that a replica frozen in the middle of a table write or of a renewal cannot keep the others
  from taking the lease); every table write reads the lease epoch inside its own write transaction and
  rolls back unless it is the writer's.
- Redis: hashes `<prefix>programs` and `<prefix>tickets`, strings `<prefix>meta` and
  `<prefix>generation`. A full write sets a new generation; a delta checks it in the same
  transaction, so a Redis that lost its data (restarted empty) is noticed and rewritten in full.
  With leader election, `<prefix>leader` holds the lease ("epoch|holder|address", with a PX TTL) and
  `<prefix>epoch` the last epoch (no TTL); lease calls are Lua scripts, and a write WATCHes the epoch
  key and applies only if it still holds the writer's epoch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fcntl
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import orjson

from services.common.auth.redact import redact_url
from services.scheduler.adapters.file_lease import FileLease, LeaseFileError
from services.scheduler.core import Lifecycle, ReplicaKey, Status
from services.scheduler.core.leadership import LeaseRead, LeaseRecord
from services.scheduler.core.state import CoreMeta, CoreState, ProgramRecord, TicketRecord


class StoreError(Exception):
    """The store cannot be opened, read or written."""


class StoreLocked(StoreError):
    """Another scheduler holds the state file."""


class StoreLost(StoreError):
    """The store no longer holds what was written to it (e.g. Redis restarted empty)."""


class StoreBusy(StoreError):
    """A shared SQLite file's write lock is held by another process (a replica frozen inside a write):
    the store is up, only this write could not be made."""


class StoreFenced(StoreError):
    """A write was refused: the store's leadership epoch is not the writer's (it was deposed)."""


@dataclass
class WriteBatch:
    """Records to write (None = delete). `full`: replace everything the store holds."""

    programs: dict[str, bytes | None] = field(default_factory=dict)
    tickets: dict[str, bytes | None] = field(default_factory=dict)
    meta: bytes = b""
    full: bool = False


@dataclass
class StoredState:
    programs: list[bytes] = field(default_factory=list)
    tickets: list[bytes] = field(default_factory=list)
    meta: bytes | None = None


class StateStore(Protocol):
    description: str  # for logs: "sqlite:/path" or the Redis URL without credentials

    async def open(self) -> None: ...
    async def load(self) -> StoredState: ...
    async def write(self, batch: WriteBatch, epoch: int | None = None) -> None:
        """Apply `batch` atomically; with `epoch`, only if the stored lease epoch is still `epoch`
        (StoreFenced otherwise)."""

    async def ping(self) -> None: ...
    async def has_table(self) -> bool:
        """Whether the store holds a table at all (any term writes one at its start): False for a new store
        or one that lost its data."""
        ...

    async def close(self) -> None: ...
    # Leader election (a shared store only):
    async def acquire_lease(self, holder: str, address: str, ttl_s: float, min_epoch: int) -> LeaseRead: ...
    async def renew_lease(self, holder: str, address: str, epoch: int, ttl_s: float) -> LeaseRead: ...
    async def release_lease(self, holder: str, epoch: int) -> None: ...


def _lease_value(epoch: int, holder: str, address: str) -> str:
    return f"{epoch}|{holder}|{address}"


def _lease_record(value) -> LeaseRecord | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    epoch, _, rest = text.partition("|")
    holder, _, address = rest.partition("|")
    try:
        return LeaseRecord(holder, int(epoch), address)
    except ValueError:
        return None


# ---------------------------------------------------------------------- records <-> JSON


def _t(value: float | None, offset_s: float) -> float | None:
    return None if value is None else value + offset_s


def _replica(value: ReplicaKey | None) -> list | None:
    return None if value is None else [value.worker_id, value.dp_rank]


def _replica_from(value) -> ReplicaKey | None:
    return None if value is None else ReplicaKey(str(value[0]), int(value[1]))


def _dumps(value: object) -> bytes:
    """`orjson.dumps`, copied to its size. orjson writes into a buffer of several KiB and shrinks it in
    place, which leaves each small output pinning that much of the C heap for as long as it lives: a batch
    of 10,000 program records (~400 bytes each) held ~78 MiB instead of ~4 MiB (docs/scheduler.md,
    "Memory"). The copy frees the big buffer at once, for the next record to reuse."""
    return memoryview(orjson.dumps(value)).tobytes()


def encode_program(r: ProgramRecord, wall_offset_s: float) -> bytes:
    """`wall_offset_s` = wall clock - monotonic clock of the exporting process."""
    return _dumps(
        {
            "session_id": r.session_id,
            "parent": r.parent_session_id,
            "created_at": r.created_at + wall_offset_s,
            "seq": r.seq,
            "status": r.status.value,
            "lifecycle": r.lifecycle.value,
            "token_total": r.token_total,
            "tokens_estimated": r.tokens_estimated,
            "replica": _replica(r.replica),
            "last_replica": _replica(r.last_replica),
            "pause_protected_until": r.pause_protected_until + wall_offset_s,
            "admission_epoch": r.admission_epoch,
            "turns": r.turns,
            "last_activity": r.last_activity + wall_offset_s,
            "acting_since": _t(r.acting_since, wall_offset_s),
            "paused_since": _t(r.paused_since, wall_offset_s),
            "paused_seq": r.paused_seq,
        }
    )


def decode_program(data: bytes, wall_offset_s: float) -> ProgramRecord:
    d = orjson.loads(data)
    back = -wall_offset_s
    return ProgramRecord(
        session_id=str(d["session_id"]),
        parent_session_id=str(d["parent"]),
        created_at=float(d["created_at"]) + back,
        seq=int(d["seq"]),
        status=Status(d["status"]),
        lifecycle=Lifecycle(d["lifecycle"]),
        token_total=int(d["token_total"]),
        tokens_estimated=bool(d["tokens_estimated"]),
        replica=_replica_from(d["replica"]),
        last_replica=_replica_from(d["last_replica"]),
        pause_protected_until=float(d["pause_protected_until"]) + back,
        admission_epoch=int(d["admission_epoch"]),
        turns=int(d["turns"]),
        last_activity=float(d["last_activity"]) + back,
        acting_since=_t(d["acting_since"], back),
        paused_since=_t(d["paused_since"], back),
        paused_seq=None if d["paused_seq"] is None else int(d["paused_seq"]),
    )


def encode_ticket(r: TicketRecord, wall_offset_s: float) -> bytes:
    return _dumps(
        {
            "request_id": r.request_id,
            "session_id": r.session_id,
            "epoch": r.epoch,
            "started_at": r.started_at + wall_offset_s,
            "was_paused": r.was_paused,
            "tokens": r.tokens,
            "replica": _replica(r.replica),
            "confirmed": r.confirmed,
        }
    )


def decode_ticket(data: bytes, wall_offset_s: float) -> TicketRecord:
    d = orjson.loads(data)
    return TicketRecord(
        str(d["request_id"]),
        str(d["session_id"]),
        int(d["epoch"]),
        float(d["started_at"]) - wall_offset_s,
        bool(d["was_paused"]),
        int(d["tokens"]),
        _replica_from(d["replica"]),
        # (A ticket stored before this field existed was restored as counted: so it stays.)
        bool(d.get("confirmed", True)),
    )


def encode_meta(m: CoreMeta) -> bytes:
    return _dumps(
        {
            "format": m.format,
            "next_seq": m.next_seq,
            "next_pause_seq": m.next_pause_seq,
            "released_turns": list(m.released_turns),
            "totals": m.totals,
        }
    )


def decode_meta(data: bytes | None) -> CoreMeta:
    if not data:
        return CoreMeta()
    d = orjson.loads(data)
    return CoreMeta(
        int(d["next_seq"]),
        int(d["next_pause_seq"]),
        tuple(int(t) for t in d["released_turns"]),
        {str(k): int(v) for k, v in d["totals"].items()},
        int(d["format"]),
    )


@dataclass
class Decoded:
    state: CoreState
    skipped: int  # records that could not be read (logged, never fatal)


def decode_state(stored: StoredState, wall_offset_s: float) -> Decoded:
    """Unreadable records are skipped and counted: one bad row must not keep the scheduler down."""
    skipped = 0
    programs, tickets = [], []
    for data in stored.programs:
        try:
            programs.append(decode_program(data, wall_offset_s))
        except (ValueError, KeyError, TypeError, IndexError):
            skipped += 1
    for data in stored.tickets:
        try:
            tickets.append(decode_ticket(data, wall_offset_s))
        except (ValueError, KeyError, TypeError, IndexError):
            skipped += 1
    try:
        meta = decode_meta(stored.meta)
    except (ValueError, KeyError, TypeError, AttributeError):
        meta, skipped = CoreMeta(), skipped + 1
    return Decoded(CoreState(tuple(programs), tuple(tickets), meta), skipped)


# ---------------------------------------------------------------------- SQLite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS programs (session_id TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS tickets (request_id TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
"""


class SqliteStateStore:
    """One file; every call runs on the store's single thread, in order (lease calls: on their own)."""

    def __init__(self, path: str | os.PathLike, *, shared: bool = False, wall=None) -> None:
        """`shared`: an active/standby pair uses the file (no flock; the lease's epoch fences writes).
        `wall`: the wall clock the lease expiry is kept on (time.time; every replica is on this machine)."""
        self.path = Path(path)
        self.shared = shared
        self.description = f"sqlite:{self.path}"
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="scheduler-state")
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self.lease = FileLease(f"{self.path}.lease", wall or time.time)
        self._lease_executor = (
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="scheduler-lease")
            if shared
            else None
        )

    async def _run_lease(self, fn, *args):
        assert self._lease_executor is not None, "leases need a shared store"
        try:
            return await asyncio.get_running_loop().run_in_executor(self._lease_executor, fn, *args)
        except LeaseFileError as exc:
            raise StoreError(str(exc)) from None

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        if self.shared:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create {self.path}: {exc.strerror}") from None
            self._connect()
            try:
                self.lease.open()
            except LeaseFileError as exc:
                raise StoreError(str(exc)) from None
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot create {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = None
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreLocked(f"{self.path} is in use by another scheduler") from None
            raise StoreError(f"cannot lock {self.path}: {exc.strerror}") from None
        self._connect()

    def _connect(self) -> None:
        try:
            # Shared: a write waits for the file's write lock at most about a write's timeout (a frozen
            # replica may hold it); alone, 5 s.
            timeout_s = 0.5 if self.shared else 5.0
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=timeout_s)
            conn.execute("PRAGMA journal_mode=WAL")
            # Shared by replicas on this machine, the table must survive a replica's death, which WAL with
            # NORMAL does (a commit is in the OS before it returns; only a machine crash, which takes every
            # replica with it, may lose the last ones), and a commit then holds the write lock for
            # microseconds instead of an fsync: a replica frozen inside one is that much rarer.
            conn.execute("PRAGMA synchronous=NORMAL" if self.shared else "PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            self._unlock()
            raise StoreError(f"{self.path} is not a usable SQLite database: {exc}") from None
        self._conn = conn

    async def load(self) -> StoredState:
        return await self._run(self._load)

    def _load(self) -> StoredState:
        conn = self._require()
        try:
            programs = [row[0] for row in conn.execute("SELECT record FROM programs")]
            tickets = [row[0] for row in conn.execute("SELECT record FROM tickets")]
            meta = conn.execute("SELECT value FROM meta WHERE key = 'core'").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from None
        return StoredState(programs, tickets, meta[0] if meta else None)

    async def write(self, batch: WriteBatch, epoch: int | None = None) -> None:
        await self._run(self._write, batch, epoch)

    def _write(self, batch: WriteBatch, epoch: int | None = None) -> None:
        conn = self._require()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if epoch is not None:
                    # Read inside this write transaction: a successor's acquire after it cannot be missed by
                    # a write that commits (its answer is checked against the lease again after the commit).
                    try:
                        current = self.lease.current_epoch()
                    except LeaseFileError as exc:
                        raise StoreError(str(exc)) from None
                    if current != epoch:
                        raise StoreFenced(
                            f"{self.path}: write of epoch {epoch} refused (the lease is at epoch {current})"
                        )
                if batch.full:
                    conn.execute("DELETE FROM programs")
                    conn.execute("DELETE FROM tickets")
                for table, key, records in (
                    ("programs", "session_id", batch.programs),
                    ("tickets", "request_id", batch.tickets),
                ):
                    upserts = [(k, v) for k, v in records.items() if v is not None]
                    deletes = [(k,) for k, v in records.items() if v is None]
                    if upserts:
                        conn.executemany(f"INSERT OR REPLACE INTO {table} ({key}, record) VALUES (?, ?)", upserts)
                    if deletes and not batch.full:
                        conn.executemany(f"DELETE FROM {table} WHERE {key} = ?", deletes)
                if batch.meta:
                    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('core', ?)", (batch.meta,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise StoreBusy(f"cannot write {self.path}: {exc} (another process holds its write lock)") from None
            raise StoreError(f"cannot write {self.path}: {exc}") from None
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write {self.path}: {exc}") from None

    async def ping(self) -> None:
        await self._run(lambda: self._require().execute("SELECT 1").fetchone())

    async def has_table(self) -> bool:
        def probe() -> bool:
            try:
                return self._require().execute("SELECT 1 FROM meta WHERE key = 'core'").fetchone() is not None
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read {self.path}: {exc}") from None

        return await self._run(probe)

    # -- the lease row (shared files) -------------------------------------------------------------

    async def acquire_lease(self, holder: str, address: str, ttl_s: float, min_epoch: int) -> LeaseRead:
        return await self._run_lease(self.lease.acquire, holder, address, ttl_s, min_epoch)

    async def renew_lease(self, holder: str, address: str, epoch: int, ttl_s: float) -> LeaseRead:
        return await self._run_lease(self.lease.renew, holder, address, epoch, ttl_s)

    async def release_lease(self, holder: str, epoch: int) -> None:
        await self._run_lease(self.lease.release, holder, epoch)

    async def close(self) -> None:
        try:
            await self._run(self._close)  # after any write still queued on the store's thread
        finally:
            self._executor.shutdown(wait=False)
            if self._lease_executor is not None:
                self._lease_executor.shutdown(wait=False)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("store is not open")
        return self._conn


# ---------------------------------------------------------------------- Redis


class RedisStateStore:
    """Every command bounded by `timeout_s` (connect and reply), no client-side retries: the caller
    decides what a failure means."""

    def __init__(self, url: str, prefix: str, timeout_s: float) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.description = redact_url(url)
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._programs = f"{prefix}programs"
        self._tickets = f"{prefix}tickets"
        self._meta = f"{prefix}meta"
        self._generation_key = f"{prefix}generation"
        self._generation: bytes | None = None
        self._lease_key = f"{prefix}leader"
        self._epoch_key = f"{prefix}epoch"
        self._acquire = self._client.register_script(_ACQUIRE_LUA)
        self._renew = self._client.register_script(_RENEW_LUA)
        self._release = self._client.register_script(_RELEASE_LUA)

    async def open(self) -> None:
        return None  # connects on first use; load() is the first call

    async def load(self) -> StoredState:
        from redis.exceptions import RedisError

        try:
            pipe = self._client.pipeline(transaction=True)
            pipe.hvals(self._programs)
            pipe.hvals(self._tickets)
            pipe.get(self._meta)
            pipe.get(self._generation_key)
            programs, tickets, meta, generation = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise StoreError(f"cannot read {self.description}: {redact_url(str(exc))}") from None
        self._generation = generation
        return StoredState(list(programs), list(tickets), meta)

    async def write(self, batch: WriteBatch, epoch: int | None = None) -> None:
        from redis.exceptions import RedisError, WatchError

        if epoch is None:
            await self._write(self._client.pipeline(transaction=True), batch)
            return
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                await pipe.watch(self._epoch_key)
                stored = await pipe.get(self._epoch_key)
                if stored is None:
                    # Redis lost the epoch (restarted empty): not a successor's. The next renewal
                    # re-establishes the lease, then the whole table is written again.
                    raise StoreLost(f"{self.description} lost the leadership epoch")
                if int(stored) != epoch:
                    raise StoreFenced(
                        f"{self.description}: write of epoch {epoch} refused (the lease is at {int(stored)})"
                    )
                pipe.multi()
                await self._write(pipe, batch)
        except WatchError:
            raise StoreFenced(
                f"{self.description}: the leadership epoch moved during a write of epoch {epoch}"
            ) from None
        except (RedisError, OSError) as exc:
            raise StoreError(f"cannot write {self.description}: {redact_url(str(exc))}") from None

    async def _write(self, pipe, batch: WriteBatch) -> None:
        from redis.exceptions import RedisError, WatchError

        generation = self._generation
        if batch.full:
            generation = secrets.token_hex(8).encode()
            pipe.delete(self._programs, self._tickets)
            pipe.set(self._generation_key, generation)
        else:
            pipe.get(self._generation_key)
        for key, records in ((self._programs, batch.programs), (self._tickets, batch.tickets)):
            upserts = {k: v for k, v in records.items() if v is not None}
            deletes = [k for k, v in records.items() if v is None]
            if upserts:
                pipe.hset(key, mapping=upserts)
            if deletes and not batch.full:
                pipe.hdel(key, *deletes)
        if batch.meta:
            pipe.set(self._meta, batch.meta)
        try:
            results = await pipe.execute()
        except WatchError:
            raise
        except (RedisError, OSError) as exc:
            raise StoreError(f"cannot write {self.description}: {redact_url(str(exc))}") from None
        if batch.full:
            self._generation = generation
        elif results[0] != generation:
            raise StoreLost(f"{self.description} lost the scheduler state (generation {results[0]!r})")

    async def ping(self) -> None:
        from redis.exceptions import RedisError

        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            raise StoreError(f"{self.description} unreachable: {redact_url(str(exc))}") from None

    async def has_table(self) -> bool:
        from redis.exceptions import RedisError

        try:
            return bool(await self._client.exists(self._meta))
        except (RedisError, OSError) as exc:
            raise StoreError(f"{self.description} unreachable: {redact_url(str(exc))}") from None

    async def close(self) -> None:
        await self._client.aclose()

    # -- the lease (Lua: each call is one atomic step) ----------------------------------------------

    async def _script(self, script, keys, args):
        from redis.exceptions import RedisError

        try:
            return await script(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise StoreError(f"lease call to {self.description} failed: {redact_url(str(exc))}") from None

    async def acquire_lease(self, holder: str, address: str, ttl_s: float, min_epoch: int) -> LeaseRead:
        got, value = await self._script(
            self._acquire,
            [self._lease_key, self._epoch_key],
            [holder, address, max(1, int(ttl_s * 1000)), min_epoch],
        )
        record = _lease_record(value)
        return LeaseRead(bool(int(got)), record.epoch if record else 0, record)

    async def renew_lease(self, holder: str, address: str, epoch: int, ttl_s: float) -> LeaseRead:
        value = _lease_value(epoch, holder, address)
        got, stored = await self._script(
            self._renew, [self._lease_key, self._epoch_key], [value, max(1, int(ttl_s * 1000)), epoch]
        )
        record = _lease_record(stored)
        return LeaseRead(bool(int(got)), record.epoch if record else 0, record)

    async def release_lease(self, holder: str, epoch: int) -> None:
        await self._script(self._release, [self._lease_key], [f"{epoch}|{holder}|"])


# KEYS[1] lease, KEYS[2] epoch. ARGV: holder, address, ttl ms, min epoch. -> {1, value} taken, {0, value} held.
# The new epoch is above both the stored one and the highest this replica saw (a Redis restarted empty
# must not hand out an epoch a deposed leader still holds).
_ACQUIRE_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local e = tonumber(redis.call('GET', KEYS[2]) or '0')
local floor = tonumber(ARGV[4])
if floor > e then e = floor end
e = e + 1
redis.call('SET', KEYS[2], e)
local v = e .. '|' .. ARGV[1] .. '|' .. ARGV[2]
redis.call('SET', KEYS[1], v, 'PX', ARGV[3])
return {1, v}
"""

# ARGV: value, ttl ms, epoch. -> {1, value} renewed (or re-established after Redis lost it), {0, stored} not ours.
_RENEW_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, cur}
end
if not cur then
  local e = tonumber(redis.call('GET', KEYS[2]) or '0')
  if e <= tonumber(ARGV[3]) then
    if e < tonumber(ARGV[3]) then redis.call('SET', KEYS[2], ARGV[3]) end
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return {1, ARGV[1]}
  end
  return {0, false}
end
return {0, cur}
"""

# ARGV: "epoch|holder|" prefix of our own value.
_RELEASE_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, string.len(ARGV[1])) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""
