"""The leadership lease of a shared SQLite table, kept in plain files so that no replica can hold it hostage.

A lease kept as a row of an SQLite file needs that file's write lock for every take and every renewal. A
replica frozen while it holds the lock (SIGSTOP, a stalled VM, a swapped-out process) keeps every other
replica from taking the lease until it wakes up: the very fault that leader election is there to survive.
Here no operation holds anything between two system calls.

- The lease of epoch E is the file `epoch-<E>` in the lease directory (`<table>.lease/`), JSON with the
  holder, its address and `expires_at` on the wall clock (the replicas share one machine, hence one clock).
  The current epoch is the highest such file.
- Taking epoch E+1 creates `epoch-<E+1>` whole and exclusively: the record is written to a private temporary
  file, then hard-linked to its name, which fails if the name exists. Of replicas racing for an epoch, one
  wins.
- Renewing epoch E replaces `epoch-<E>` atomically (os.replace), only while E is the highest epoch, checked
  before the replacement and again after it: a renewal that finds a later epoch afterwards has failed.
- The successor's wait. A successor takes E+1 because it read E's lease expired; the leader may have renewed
  between that read and the take (its check before the replacement saw no E+1). So after taking E+1 the
  successor reads E's lease again, and it leads only once that expiry is past. The leader's deadline comes
  from its last successful renewal, whose record was written before the successor's take (its check after
  the replacement saw no E+1), so the successor's second read sees that record or a later one: by then the
  old leader has stopped deciding. Until then the successor answers as a standby naming the old leader.
- A table write reads the current epoch inside its own write transaction (the fence); old epochs' files are
  removed by the replica that takes a new one (the two highest are kept).

Files are not fsynced: every replica sharing the table runs on this machine, so only a machine crash, which
takes every replica with it, could lose a lease write, and then nobody holds a lease to lose.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson

from services.scheduler.core.leadership import LeaseRead, LeaseRecord

_NAME = re.compile(r"^epoch-(\d{1,18})$")
_TEMP_PREFIX = ".tmp-"
_TEMP_STALE_S = 60.0
_KEEP = 2


class LeaseFileError(Exception):
    """The lease directory cannot be read or written (the message names the path)."""


@dataclass(frozen=True)
class Lease:
    record: LeaseRecord
    expires_at: float


class FileLease:
    """The lease directory of one shared table. Blocking calls (file system): run them off the event loop."""

    def __init__(self, directory: str | os.PathLike, wall: Callable[[], float] = time.time) -> None:
        self.directory = Path(directory)
        self._wall = wall

    def open(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LeaseFileError(f"cannot create the lease directory {self.directory}: {exc.strerror}") from None

    # -- reads ------------------------------------------------------------------------------------

    def epochs(self) -> list[int]:
        """Every epoch that has a lease file, ascending."""
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            raise LeaseFileError(f"cannot list the lease directory {self.directory}: {exc.strerror}") from None
        return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)

    def current_epoch(self) -> int:
        """The highest epoch taken so far (0: none): what a table write is fenced with."""
        epochs = self.epochs()
        return epochs[-1] if epochs else 0

    def read(self, epoch: int) -> Lease | None:
        """The lease of `epoch`, or None if it has no file (never taken, or removed as old)."""
        path = self._path(epoch)
        try:
            data = orjson.loads(path.read_bytes())
            return Lease(LeaseRecord(str(data["holder"]), epoch, str(data["address"])), float(data["expires_at"]))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LeaseFileError(f"cannot read the lease {path}: {exc.strerror}") from None
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise LeaseFileError(f"the lease {path} is not a lease record ({exc}); remove it to go on") from None

    # -- the lease calls ----------------------------------------------------------------------------

    def acquire(self, holder: str, address: str, ttl_s: float, min_epoch: int) -> LeaseRead:
        """Take the lease if nobody holds it: at an epoch above the highest taken and above `min_epoch`."""
        epochs = self.epochs()
        top = epochs[-1] if epochs else 0
        current = self.read(top) if top else None
        now = self._wall()
        if current is not None and current.record.holder == holder:
            # Our own take, waiting for its predecessor's lease to run out (or a retried call).
            if current.expires_at > now:
                before = self._below(epochs, top)
                if before is not None and before.expires_at > now:
                    self._write(self._path(top), current.record, now + ttl_s, replace=True)  # keep the take
                    return LeaseRead(False, before.record.epoch, before.record)
                return self._extend(holder, address, top, ttl_s)
        elif current is not None and current.expires_at > now:
            return LeaseRead(False, top, current.record)
        epoch = max(top, min_epoch) + 1
        if not self._create(epoch, holder, address, now + ttl_s):
            taken = self.read(epoch)
            return LeaseRead(False, epoch, taken.record if taken else None)
        self._prune()
        before = self.read(top) if top else None  # read again: a renewal may have landed before our take
        if before is not None and before.expires_at > self._wall():
            return LeaseRead(False, top, before.record)
        return LeaseRead(True, epoch, LeaseRecord(holder, epoch, address))

    def renew(self, holder: str, address: str, epoch: int, ttl_s: float) -> LeaseRead:
        """Extend the lease of `epoch` if `holder` still holds it, unexpired, and no later epoch exists."""
        epochs = self.epochs()
        top = epochs[-1] if epochs else 0
        current = self.read(top) if top else None
        if top != epoch or current is None or current.record.holder != holder or current.expires_at <= self._wall():
            return LeaseRead(False, top, current.record if current else None)
        return self._extend(holder, address, epoch, ttl_s)

    def release(self, holder: str, epoch: int) -> None:
        """Give the lease up at once (a graceful stop): the next replica need not wait for it to expire."""
        current = self.read(epoch)
        if current is not None and current.record.holder == holder and self.current_epoch() == epoch:
            self._write(self._path(epoch), current.record, 0.0, replace=True)

    # -- files ----------------------------------------------------------------------------------------

    def _extend(self, holder: str, address: str, epoch: int, ttl_s: float) -> LeaseRead:
        record = LeaseRecord(holder, epoch, address)
        self._write(self._path(epoch), record, self._wall() + ttl_s, replace=True)
        top = self.current_epoch()
        if top != epoch:  # a successor took a later epoch while we wrote: this renewal does not count
            later = self.read(top)
            return LeaseRead(False, top, later.record if later else None)
        return LeaseRead(True, epoch, record)

    def _below(self, epochs: list[int], top: int) -> Lease | None:
        earlier = [e for e in epochs if e < top]
        return self.read(earlier[-1]) if earlier else None

    def _create(self, epoch: int, holder: str, address: str, expires_at: float) -> bool:
        """Create epoch's file whole, exclusively: False if another replica took that epoch first."""
        return self._write(self._path(epoch), LeaseRecord(holder, epoch, address), expires_at, replace=False)

    def _write(self, path: Path, record: LeaseRecord, expires_at: float, *, replace: bool) -> bool:
        body = orjson.dumps({"holder": record.holder, "address": record.address, "expires_at": expires_at})
        temp = self.directory / f"{_TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with open(temp, "wb") as out:
                out.write(body)
            if replace:
                os.replace(temp, path)
                return True
            try:
                os.link(temp, path)
            except FileExistsError:
                return False
            return True
        except OSError as exc:
            raise LeaseFileError(f"cannot write the lease {path}: {exc.strerror}") from None
        finally:
            temp.unlink(missing_ok=True)  # gone already after a replace; the link's spare name otherwise

    def _prune(self) -> None:
        """Remove all but the two highest epochs' files, and temporary files a killed replica left behind."""
        epochs = self.epochs()
        for epoch in epochs[:-_KEEP]:
            self._path(epoch).unlink(missing_ok=True)
        now = time.time()
        for name in os.listdir(self.directory):
            if name.startswith(_TEMP_PREFIX):
                path = self.directory / name
                try:
                    if now - path.stat().st_mtime > _TEMP_STALE_S:
                        path.unlink(missing_ok=True)
                except OSError:
                    pass  # another replica removed it first

    def _path(self, epoch: int) -> Path:
        return self.directory / f"epoch-{epoch}"
