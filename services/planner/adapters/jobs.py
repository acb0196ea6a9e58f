"""The planner's durable record of batch jobs (SQLite): demand only.

A job is what a dispatcher (the batch service, or another gateway) submitted with `SubmitBatchJob`: an
id, a request count, a deadline, and the progress counts it reports with `ReportDispatch`. No request
body, prompt or completion is ever stored here: the planner carries no tokens (docs/architecture.md).

    in_progress --report: completed + failed >= total--> completed
    in_progress --report: final_status--> completed | cancelled | expired | failed
    in_progress --deadline passed--> expired

Timestamps are wall-clock Unix seconds, passed in by the caller.
"""

from __future__ import annotations

import builtins
import sqlite3

from services.planner.core.jobs import FINAL_STATUSES, TERMINAL_STATUSES
from services.planner.core.types import JobDemand

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, pool_id TEXT NOT NULL, status TEXT NOT NULL,
  created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, ended_at INTEGER, total INTEGER NOT NULL,
  dispatched INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0
);
"""
_FIELDS = "id, pool_id, status, created_at, expires_at, ended_at, total, dispatched, completed, failed"


class NotFound(KeyError):
    """An unknown job id."""


class Conflict(ValueError):
    """A request that contradicts existing state (a job id reused with a different payload)."""


class JobStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        if path != ":memory:":
            self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    def submit(self, job_id: str, total: int, deadline: int, now: int, pool_id: str) -> dict:
        """Idempotent: the same id with the same payload returns the existing job."""
        row = self.db.execute("SELECT total, expires_at, pool_id FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is not None:
            if (row["total"], row["expires_at"], row["pool_id"]) != (total, deadline, pool_id):
                raise Conflict(f"job {job_id} exists with a different payload")
            return self.get(job_id)
        self.db.execute(
            "INSERT INTO jobs (id, pool_id, status, created_at, expires_at, total) "
            "VALUES (?, ?, 'in_progress', ?, ?, ?)",
            (job_id, pool_id, now, deadline, total),
        )
        return self.get(job_id)

    def report(
        self, job_id: str, dispatched: int, completed: int, failed: int, now: int, final_status: str = ""
    ) -> dict:
        """Progress of one job; counts never go back. `final_status` (an OpenAI terminal status) ends it."""
        if final_status and final_status not in FINAL_STATUSES:
            raise ValueError(f"final_status must be one of {sorted(FINAL_STATUSES)} (or empty)")
        job = self.get(job_id)
        if job["status"] in TERMINAL_STATUSES:
            return job
        total = job["total"]
        completed = max(job["completed"], min(completed, total))
        failed = max(job["failed"], min(failed, total - completed))
        status = final_status or ("completed" if completed + failed >= total else "in_progress")
        self.db.execute(
            "UPDATE jobs SET dispatched = MAX(dispatched, ?), completed = ?, failed = ?, status = ?, "
            "ended_at = CASE WHEN ? = 'in_progress' THEN NULL ELSE ? END WHERE id = ?",
            (dispatched, completed, failed, status, status, now, job_id),
        )
        return self.get(job_id)

    def get(self, job_id: str) -> dict:
        row = self.db.execute(f"SELECT {_FIELDS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(job_id)
        return dict(row)

    def list(self, pool_id: str) -> list[dict]:
        """Every job of the pool, newest first."""
        rows = self.db.execute(f"SELECT {_FIELDS} FROM jobs WHERE pool_id = ? ORDER BY seq DESC", (pool_id,))
        return [dict(r) for r in rows]

    def advance(self, now: int) -> builtins.list[tuple[str, str, str]]:  # (list: the method above)
        """Jobs past their deadline expire; returns (job_id, old, new) transitions."""
        rows = self.db.execute(
            "SELECT id, status FROM jobs WHERE status = 'in_progress' AND expires_at <= ?", (now,)
        ).fetchall()
        for r in rows:
            self.db.execute("UPDATE jobs SET status = 'expired', ended_at = ? WHERE id = ?", (now, r["id"]))
        return [(r["id"], r["status"], "expired") for r in rows]

    def job_demands(self, observed_at_s: float, work_class: str = "default") -> tuple[JobDemand, ...]:
        rows = self.db.execute(
            "SELECT id, status, total, completed, failed, expires_at, pool_id FROM jobs WHERE status = 'in_progress'"
        ).fetchall()
        return tuple(
            JobDemand(
                r["id"],
                r["status"],
                r["total"],
                min(r["completed"], r["total"]),
                min(r["failed"], r["total"] - min(r["completed"], r["total"])),
                float(r["expires_at"]),
                observed_at_s,
                work_class,
                r["pool_id"],
            )
            for r in rows
        )
