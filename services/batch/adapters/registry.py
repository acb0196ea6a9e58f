"""The durable registry of batch files, jobs and per-request dispatch state (SQLite).

Everything the Batch API returns and the dispatcher needs lives here, in the batch service's own
SQLite file (WAL), so a restart of the batch service loses nothing: every state change is committed
before it is acted on. The
per-request state machine makes dispatch restart-safe:

    queued --claim--> sending --result--> done (output line) | failed (error line)
                         |--transport error, attempts left--> queued
    queued --cancel/expire--> cancelled / expired (error line)

A result is written once (the row's state guards it), so each `custom_id` appears exactly once
in the output or error file. A request found `sending` at start-up was interrupted without a
result: it goes back to `queued` and is sent again (at least once upstream, exactly once in
the files).

Timestamps are wall-clock Unix seconds (OpenAI's `created_at` & co.), passed in by the caller.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from dataclasses import dataclass
from typing import Any

from services.batch.core.batch_api import TERMINAL_STATUSES, BatchLine
from services.batch.core.expiry import DEFAULT_RETENTION_S, expires_at
from services.batch.core.listing import PageQuery

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
  id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes INTEGER NOT NULL,
  created_at INTEGER NOT NULL, kind TEXT NOT NULL, batch_id TEXT, content BLOB, lines INTEGER NOT NULL DEFAULT 0,
  expires_at INTEGER
);
CREATE TABLE IF NOT EXISTS input_lines (
  file_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL, body TEXT NOT NULL,
  PRIMARY KEY (file_id, idx)
);
CREATE TABLE IF NOT EXISTS batches (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT,
  completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
  in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER, expired_at INTEGER,
  cancelling_at INTEGER, cancelled_at INTEGER, output_file_id TEXT, error_file_id TEXT, errors TEXT,
  metadata TEXT, total INTEGER NOT NULL, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
  pool_id TEXT NOT NULL DEFAULT 'default', dispatched INTEGER NOT NULL DEFAULT 0,
  planner_ended INTEGER NOT NULL DEFAULT 0, output_expires_s INTEGER
);
CREATE TABLE IF NOT EXISTS requests (
  batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL, body TEXT NOT NULL,
  state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, result TEXT, result_kind TEXT,
  PRIMARY KEY (batch_id, idx)
);
CREATE INDEX IF NOT EXISTS requests_state ON requests (state, batch_id);
"""

BATCH_FIELDS = (
    "id",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "created_at",
    "expires_at",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "output_file_id",
    "error_file_id",
    "errors",
    "metadata",
    "total",
    "completed",
    "failed",
    "pool_id",
    "dispatched",
)


class NotFound(KeyError):
    """An unknown file or batch id."""


class Conflict(ValueError):
    """A request that contradicts existing state (e.g. an id reused with a different payload)."""


class FileInUse(Conflict):
    """Deleting an input file a batch that has not ended still names (HTTP 409)."""


@dataclass(frozen=True)
class Claimed:
    batch_id: str
    idx: int
    custom_id: str
    url: str
    body: dict
    attempts: int


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class Registry:
    def __init__(self, path: str, *, file_retention_s: int = DEFAULT_RETENTION_S) -> None:
        self.path = path
        self.file_retention_s = file_retention_s
        """When a file expires unless its upload (or its batch, for outputs) said otherwise."""
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        if path != ":memory:":
            self.db.execute("PRAGMA journal_mode=WAL")
        # NORMAL under WAL survives a killed process (not a power cut); FULL would fsync every commit.
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        self._upgrade()

    def _upgrade(self) -> None:
        """A registry the planner kept before batch execution moved out of it (its `--registry-path`, handed
        to the batch service) lacks `planner_ended`; its batches carry on here. Its rows of jobs another
        dispatcher ran (`external`) have no requests of their own: they are ended, never dispatched.
        A registry from before files expired lacks `files.expires_at` and `batches.output_expires_s`: its
        files get the default retention from their creation (the cleanup loop deletes them when due)."""
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(batches)")}
        file_columns = {row[1] for row in self.db.execute("PRAGMA table_info(files)")}
        with self._tx():
            if "planner_ended" not in columns:
                self.db.execute("ALTER TABLE batches ADD COLUMN planner_ended INTEGER NOT NULL DEFAULT 0")
                if "external" in columns:
                    self.db.execute(
                        "UPDATE batches SET status = 'cancelled', planner_ended = 1 WHERE external = 1 AND status "
                        "NOT IN ('completed', 'failed', 'expired', 'cancelled')"
                    )
            if "output_expires_s" not in columns:
                self.db.execute("ALTER TABLE batches ADD COLUMN output_expires_s INTEGER")
            if "expires_at" not in file_columns:
                self.db.execute("ALTER TABLE files ADD COLUMN expires_at INTEGER")
                self.db.execute("UPDATE files SET expires_at = created_at + ?", (self.file_retention_s,))
            self.db.execute("CREATE INDEX IF NOT EXISTS files_expiry ON files (expires_at)")
            self.db.execute("CREATE INDEX IF NOT EXISTS files_created ON files (created_at)")

    def close(self) -> None:
        self.db.close()

    # --- files ---

    def add_input_file(
        self, filename: str, data: bytes, lines: list[BatchLine], now: int, expires_after_s: int | None = None
    ) -> dict:
        file_id = _new_id("file")
        with self._tx():
            self.db.execute(
                "INSERT INTO files (id, purpose, filename, bytes, created_at, kind, content, lines, expires_at) "
                "VALUES (?, 'batch', ?, ?, ?, 'input', ?, ?, ?)",
                (
                    file_id,
                    filename,
                    len(data),
                    now,
                    data,
                    len(lines),
                    expires_at(now, expires_after_s, self.file_retention_s),
                ),
            )
            self.db.executemany(
                "INSERT INTO input_lines VALUES (?, ?, ?, ?, ?)",
                ((file_id, ln.index, ln.custom_id, ln.url, json.dumps(ln.body)) for ln in lines),
            )
        return self.get_file(file_id)

    _FILE_COLUMNS = "id, purpose, filename, bytes, created_at, kind, expires_at"

    def get_file(self, file_id: str) -> dict:
        row = self.db.execute(f"SELECT {self._FILE_COLUMNS} FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None:
            raise NotFound(file_id)
        return self._file(row)

    @staticmethod
    def _file(row: sqlite3.Row) -> dict:
        return {
            "id": row["id"],
            "object": "file",
            "bytes": row["bytes"],
            "created_at": row["created_at"],
            "expires_at": row["expires_at"],
            "filename": row["filename"],
            "purpose": row["purpose"],
            "status": "processed",
            "status_details": None,
        }

    def list_files(self, query: PageQuery) -> list[dict]:
        """Up to `query.limit + 1` files in `query.order` of creation (ties by insertion), after the file
        `query.after` when given (NotFound if there is no such file), of `query.purpose` when given."""
        where: list[str] = []
        args: list[object] = []
        if query.purpose is not None:
            where.append("purpose = ?")
            args.append(query.purpose)
        if query.after is not None:
            row = self.db.execute("SELECT created_at, rowid FROM files WHERE id = ?", (query.after,)).fetchone()
            if row is None:
                raise NotFound(query.after)
            where.append("(created_at, rowid) " + ("<" if query.order == "desc" else ">") + " (?, ?)")
            args.extend([row[0], row[1]])
        direction = "DESC" if query.order == "desc" else "ASC"
        sql = (
            f"SELECT {self._FILE_COLUMNS} FROM files"
            + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY created_at {direction}, rowid {direction} LIMIT ?"
        )
        return [self._file(r) for r in self.db.execute(sql, (*args, query.limit + 1))]

    def delete_file(self, file_id: str) -> dict:
        """Delete a file and what it stores: an input file's lines, an output or error file's result lines.
        FileInUse for an input file a batch that has not ended names (its requests are copied, but the batch
        still reports it as its input, so it stays until the batch ends)."""
        row = self.db.execute("SELECT kind, batch_id, bytes FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None:
            raise NotFound(file_id)
        with self._tx():
            if row["kind"] == "input":
                busy = self.db.execute(
                    "SELECT id FROM batches WHERE input_file_id = ? AND status NOT IN "
                    "('completed', 'failed', 'expired', 'cancelled') LIMIT 1",
                    (file_id,),
                ).fetchone()
                if busy is not None:
                    raise FileInUse(f"file {file_id} is the input of batch {busy[0]}, which has not ended")
                self.db.execute("DELETE FROM input_lines WHERE file_id = ?", (file_id,))
            else:
                self.db.execute(
                    "DELETE FROM requests WHERE batch_id = ? AND result_kind = ?", (row["batch_id"], row["kind"])
                )
            self.db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return {"id": file_id, "object": "file", "deleted": True, "kind": row["kind"], "bytes": row["bytes"]}

    def expired_files(self, now: int, limit: int) -> list[str]:
        """Up to `limit` files whose `expires_at` has passed, oldest expiry first, except input files of batches
        that have not ended (they are deleted once the batch ends)."""
        rows = self.db.execute(
            "SELECT f.id FROM files f WHERE f.expires_at IS NOT NULL AND f.expires_at <= ? AND NOT EXISTS ("
            "SELECT 1 FROM batches b WHERE b.input_file_id = f.id AND b.status NOT IN "
            "('completed', 'failed', 'expired', 'cancelled')) ORDER BY f.expires_at LIMIT ?",
            (now, limit),
        )
        return [r[0] for r in rows]

    def input_urls(self, file_id: str) -> set[str]:
        self.get_file(file_id)
        return {r[0] for r in self.db.execute("SELECT DISTINCT url FROM input_lines WHERE file_id = ?", (file_id,))}

    def file_content(self, file_id: str) -> bytes:
        row = self.db.execute("SELECT kind, batch_id, content FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None:
            raise NotFound(file_id)
        if row["kind"] == "input":
            return bytes(row["content"])
        return self._result_lines(row["batch_id"], row["kind"])

    def _result_lines(self, batch_id: str, kind: str) -> bytes:
        rows = self.db.execute(
            "SELECT result FROM requests WHERE batch_id = ? AND result_kind = ? ORDER BY idx", (batch_id, kind)
        )
        return "".join(r[0] + "\n" for r in rows).encode()

    # --- batches ---

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str,
        window: str,
        window_s: int,
        metadata: dict | None,
        now: int,
        pool_id: str = "default",
        output_expires_s: int | None = None,
    ) -> dict:
        row = self.db.execute("SELECT kind, purpose FROM files WHERE id = ?", (input_file_id,)).fetchone()
        if row is None:
            raise NotFound(input_file_id)
        if row["kind"] != "input":
            raise Conflict(f"file {input_file_id} is not a batch input file")
        batch_id = _new_id("batch")
        with self._tx():
            total = self.db.execute("SELECT COUNT(*) FROM input_lines WHERE file_id = ?", (input_file_id,)).fetchone()[
                0
            ]
            self.db.execute(
                "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, created_at, expires_at, "
                "metadata, total, pool_id, output_expires_s) VALUES (?, ?, ?, ?, 'validating', ?, ?, ?, ?, ?, ?)",
                (
                    batch_id,
                    endpoint,
                    input_file_id,
                    window,
                    now,
                    now + window_s,
                    json.dumps(metadata or {}),
                    total,
                    pool_id,
                    output_expires_s,
                ),
            )
            self.db.execute(
                "INSERT INTO requests (batch_id, idx, custom_id, url, body, state) "
                "SELECT ?, idx, custom_id, url, body, 'queued' FROM input_lines WHERE file_id = ?",
                (batch_id, input_file_id),
            )
        return self.get_batch(batch_id)

    def get_batch(self, batch_id: str) -> dict:
        row = self.db.execute(f"SELECT {', '.join(BATCH_FIELDS)} FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            raise NotFound(batch_id)
        return self._batch(row)

    @staticmethod
    def _batch(row: sqlite3.Row) -> dict:
        errors = json.loads(row["errors"]) if row["errors"] else None
        return {
            "id": row["id"],
            "object": "batch",
            "endpoint": row["endpoint"],
            "errors": {"object": "list", "data": errors} if errors else None,
            "input_file_id": row["input_file_id"] or "",
            "completion_window": row["completion_window"],
            "status": row["status"],
            "output_file_id": row["output_file_id"],
            "error_file_id": row["error_file_id"],
            "created_at": row["created_at"],
            "in_progress_at": row["in_progress_at"],
            "expires_at": row["expires_at"],
            "finalizing_at": row["finalizing_at"],
            "completed_at": row["completed_at"],
            "failed_at": row["failed_at"],
            "expired_at": row["expired_at"],
            "cancelling_at": row["cancelling_at"],
            "cancelled_at": row["cancelled_at"],
            "request_counts": {"total": row["total"], "completed": row["completed"], "failed": row["failed"]},
            "metadata": json.loads(row["metadata"] or "{}") or None,
            # Not OpenAI fields; the planner reports use them.
            "pool_id": row["pool_id"],
            "dispatched": row["dispatched"],
        }

    def list_batches(self, after: str | None, limit: int) -> list[dict]:
        """Up to `limit + 1` batches, newest first; `after` is the id of the last batch of the previous page."""
        if after:
            row = self.db.execute("SELECT seq FROM batches WHERE id = ?", (after,)).fetchone()
            if row is None:
                raise NotFound(after)
            rows = self.db.execute(
                f"SELECT {', '.join(BATCH_FIELDS)} FROM batches WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                (row["seq"], limit + 1),
            ).fetchall()
        else:
            rows = self.db.execute(
                f"SELECT {', '.join(BATCH_FIELDS)} FROM batches ORDER BY seq DESC LIMIT ?", (limit + 1,)
            ).fetchall()
        return [self._batch(r) for r in rows]

    def cancel(self, batch_id: str, now: int) -> dict:
        """Idempotent: a terminal or cancelling batch is returned unchanged."""
        b = self.get_batch(batch_id)
        if b["status"] in TERMINAL_STATUSES or b["status"] == "cancelling":
            return b
        with self._tx():
            self.db.execute("UPDATE batches SET status = 'cancelling', cancelling_at = ? WHERE id = ?", (now, batch_id))
            self._close_queued(batch_id, "batch_cancelled", "The batch was cancelled before this request was sent.")
        return self.get_batch(batch_id)

    def _close_queued(self, batch_id: str, code: str, message: str) -> None:
        rows = self.db.execute(
            "SELECT idx, custom_id FROM requests WHERE batch_id = ? AND state = 'queued'", (batch_id,)
        ).fetchall()
        state = "cancelled" if code == "batch_cancelled" else "expired"
        for r in rows:
            line = {
                "id": _new_id("batch_req"),
                "custom_id": r["custom_id"],
                "response": None,
                "error": {"code": code, "message": message},
            }
            self.db.execute(
                "UPDATE requests SET state = ?, result = ?, result_kind = 'error' WHERE batch_id = ? AND idx = ?",
                (state, json.dumps(line), batch_id, r["idx"]),
            )

    # --- lifecycle (called by the dispatcher loop) ---

    def advance(self, now: int) -> list[tuple[str, str, str]]:
        """Move every non-terminal batch along; returns (batch_id, old, new) transitions.

        Called every few dispatcher steps: one read of the open batches and one grouped
        count of their open requests; a transaction only for a batch that changes."""
        moved: list[tuple[str, str, str]] = []
        rows = self.db.execute(
            "SELECT id, status, expires_at FROM batches WHERE status NOT IN "
            "('completed', 'failed', 'expired', 'cancelled')"
        ).fetchall()
        if not rows:
            return moved
        open_counts = dict(
            self.db.execute(
                "SELECT batch_id, COUNT(*) FROM requests WHERE state IN ('queued', 'sending') GROUP BY batch_id"
            ).fetchall()
        )
        for r in rows:
            bid, status = r["id"], r["status"]
            expiring = status in ("validating", "in_progress") and now >= r["expires_at"]
            open_ = open_counts.get(bid, 0)
            if status != "validating" and not expiring and open_:
                continue  # the common case: work still running, nothing to write
            with self._tx():
                if status == "validating":
                    self.db.execute(
                        "UPDATE batches SET status = 'in_progress', in_progress_at = ? WHERE id = ?", (now, bid)
                    )
                    moved.append((bid, status, "in_progress"))
                    status = "in_progress"
                if expiring:
                    self._close_queued(
                        bid, "batch_expired", "This request could not be executed before the completion window expired."
                    )
                    status = "expiring"
                    open_ = self.db.execute(
                        "SELECT COUNT(*) FROM requests WHERE batch_id = ? AND state = 'sending'", (bid,)
                    ).fetchone()[0]
                if open_:
                    continue
                final = {"in_progress": "completed", "expiring": "expired", "cancelling": "cancelled"}.get(status)
                if final is None:
                    continue
                self._finalize(bid, final, now)
                moved.append((bid, r["status"], final))
        return moved

    def _finalize(self, batch_id: str, final: str, now: int) -> None:
        ids: dict[str, str | None] = {"output": None, "error": None}
        output_expires_s = self.db.execute("SELECT output_expires_s FROM batches WHERE id = ?", (batch_id,)).fetchone()[
            0
        ]
        for kind in ("output", "error"):
            data = self._result_lines(batch_id, kind)
            if data:
                file_id = _new_id("file")
                self.db.execute(
                    "INSERT INTO files (id, purpose, filename, bytes, created_at, kind, batch_id, expires_at) "
                    "VALUES (?, 'batch_output', ?, ?, ?, ?, ?, ?)",
                    (
                        file_id,
                        f"{batch_id}_{kind}.jsonl",
                        len(data),
                        now,
                        kind,
                        batch_id,
                        expires_at(now, output_expires_s, self.file_retention_s),
                    ),
                )
                ids[kind] = file_id
        stamp = {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}[final]
        finalizing = ", finalizing_at = ?" if final == "completed" else ""
        args: list[Any] = [final, ids["output"], ids["error"], now]
        if finalizing:
            args.append(now)
        self.db.execute(
            f"UPDATE batches SET status = ?, output_file_id = ?, error_file_id = ?, {stamp} = ?{finalizing} "
            "WHERE id = ?",
            (*args, batch_id),
        )

    def recover(self) -> int:
        """At start-up: requests interrupted while sending go back to the queue."""
        with self._tx():
            cur = self.db.execute("UPDATE requests SET state = 'queued' WHERE state = 'sending'")
        return cur.rowcount

    def claim(self, n: int) -> list[Claimed]:
        """The next `n` queued requests of in-progress batches, earliest expiry first; marked sending."""
        if n <= 0:
            return []
        with self._tx():
            rows = self.db.execute(
                "SELECT r.batch_id, r.idx, r.custom_id, r.url, r.body, r.attempts FROM requests r "
                "JOIN batches b ON b.id = r.batch_id WHERE r.state = 'queued' AND b.status = 'in_progress' "
                "ORDER BY b.expires_at, b.seq, r.idx LIMIT ?",
                (n,),
            ).fetchall()
            self.db.executemany(
                "UPDATE requests SET state = 'sending', attempts = attempts + 1 WHERE batch_id = ? AND idx = ?",
                ((r["batch_id"], r["idx"]) for r in rows),
            )
            for r in rows:
                self.db.execute("UPDATE batches SET dispatched = dispatched + 1 WHERE id = ?", (r["batch_id"],))
        return [
            Claimed(r["batch_id"], r["idx"], r["custom_id"], r["url"], json.loads(r["body"]), r["attempts"] + 1)
            for r in rows
        ]

    def record_result(self, batch_id: str, idx: int, kind: str, line: dict) -> bool:
        """Write a request's one result; False if it already had one (never written twice)."""
        state = "done" if kind == "output" else "failed"
        with self._tx():
            cur = self.db.execute(
                "UPDATE requests SET state = ?, result = ?, result_kind = ? "
                "WHERE batch_id = ? AND idx = ? AND state = 'sending'",
                (state, json.dumps(line, separators=(",", ":")), kind, batch_id, idx),
            )
            if cur.rowcount != 1:
                return False
            column = "completed" if kind == "output" else "failed"
            self.db.execute(f"UPDATE batches SET {column} = {column} + 1 WHERE id = ?", (batch_id,))
        return True

    def requeue(self, batch_id: str, idx: int) -> None:
        """A request to send again. If its batch was cancelled meanwhile (it was in flight, or waiting out a
        retry's backoff, when the cancel closed the queue) it is closed as cancelled at once: nothing claims
        the queued requests of a cancelling batch, which would otherwise never end."""
        with self._tx():
            self.db.execute(
                "UPDATE requests SET state = 'queued' WHERE batch_id = ? AND idx = ? AND state = 'sending'",
                (batch_id, idx),
            )
            row = self.db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is not None and row[0] == "cancelling":
                self._close_queued(batch_id, "batch_cancelled", "The batch was cancelled before this request was sent.")

    # --- observation ---

    def open_batches(self) -> list[dict]:
        """The batches the planner should plan for: every non-terminal one."""
        rows = self.db.execute(
            f"SELECT {', '.join(BATCH_FIELDS)} FROM batches WHERE status NOT IN "
            "('completed', 'failed', 'expired', 'cancelled') ORDER BY seq"
        ).fetchall()
        return [self._batch(r) for r in rows]

    def ended_unreported(self) -> list[dict]:
        """Terminal batches whose end the planner has not acknowledged yet (`mark_ended_reported`)."""
        rows = self.db.execute(
            f"SELECT {', '.join(BATCH_FIELDS)} FROM batches WHERE planner_ended = 0 AND status IN "
            "('completed', 'failed', 'expired', 'cancelled') ORDER BY seq"
        ).fetchall()
        return [self._batch(r) for r in rows]

    def mark_ended_reported(self, batch_id: str) -> None:
        self.db.execute("UPDATE batches SET planner_ended = 1 WHERE id = ?", (batch_id,))

    def queue_counts(self) -> tuple[int, int]:
        """(queued, sending) over in-progress batches."""
        # Requests of terminal batches are never queued or sending (closed when the batch ends).
        rows = dict(
            self.db.execute(
                "SELECT state, COUNT(*) FROM requests WHERE state IN ('queued', 'sending') GROUP BY state"
            ).fetchall()
        )
        return rows.get("queued", 0), rows.get("sending", 0)

    def request_states(self, batch_id: str) -> dict[str, int]:
        return dict(
            self.db.execute(
                "SELECT state, COUNT(*) FROM requests WHERE batch_id = ? GROUP BY state", (batch_id,)
            ).fetchall()
        )

    def _tx(self) -> "_Tx":
        return _Tx(self.db)


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT, nested calls join the outer transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.outer = False

    def __enter__(self) -> None:
        if not self.db.in_transaction:
            self.db.execute("BEGIN IMMEDIATE")
            self.outer = True

    def __exit__(self, exc_type, *_: object) -> None:
        if not self.outer:
            return
        if exc_type is None:
            self.db.execute("COMMIT")
        else:
            self.db.execute("ROLLBACK")
