"""The admission fast path's cache (issue 20 item 4): per program, the last admission the scheduler gave
without holding it, valid only while the router's WatchEvents stream says nothing changed.

An ACTIVE program's next Admit is answered at once with what its last one said (PLACED on its replica, or
"any", and its priority); the router can start such a turn on the cached answer and send the Admit in the
background (`AdmitRequest.dispatched`), instead of waiting one round trip before the first byte goes to a
worker. The rules, all here (no I/O, the clock is passed in):

* Live only while the event stream is connected (`connected`); stream loss or a leader change (`lost`)
  clears every entry, and an admission that began before the stream (re)connected is never stored.
* Any event for a program but ADMITTED (paused, marked, soft-demoted, resumed, released, expired) drops
  its entry, and an admission that began before that event is not stored (its answer predates it).
* A pressure event (paused, marked, soft-demoted, for any program) drops every "any" entry too: the
  scheduler leaves placement to the router only while every replica is in the normal band. So does a
  kind this router does not know (a newer scheduler's): it may be one.
* A held or resumed admission (`was_paused`) is not stored; entries age out after `ttl_s` and the least
  recently used goes when `max_entries` is reached.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

IGNORED_EVENTS = frozenset({"admitted"})
"""Events that change nothing an Admit would answer (each admission emits one, the router's own included)."""
PRESSURE_EVENTS = frozenset({"paused", "marked", "soft_demoted"})
KNOWN_EVENTS = IGNORED_EVENTS | PRESSURE_EVENTS | {"resumed", "forced_resume", "released", "expired"}


@dataclass(frozen=True, slots=True)
class CachedAdmission:
    worker_id: str  # "" = any worker (the router picks by KV cost)
    dp_rank: int
    pinned: bool
    priority: int


@dataclass(frozen=True, slots=True)
class AdmitToken:
    """Taken as an Admit goes out: its answer is stored only if nothing happened to the program since."""

    epoch: int
    seq: int


@dataclass(frozen=True, slots=True)
class CacheParams:
    max_entries: int = 10_000
    ttl_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {self.max_entries}")
        if not (self.ttl_s > 0):
            raise ValueError(f"ttl_s must be > 0, got {self.ttl_s}")


class AdmissionCache:
    def __init__(self, params: CacheParams | None = None) -> None:
        self.params = params or CacheParams()
        self._entries: OrderedDict[str, tuple[CachedAdmission, float]] = OrderedDict()
        # The programs whose entry is "any" (not pinned): what a pressure event drops, without walking the
        # pinned ones (at fleet size a tick can bring a thousand pressure events, the cache 10,000 entries).
        self._unpinned: set[str] = set()
        self._live = False
        self._epoch = 0  # moves on at every connect and loss
        self._seq = 0  # moves on at every event
        # The seq of each program's last event (bounded: a program forgotten here had its event at or
        # before `_floor`, and an admission older than the floor is not stored).
        self._touched: OrderedDict[str, int] = OrderedDict()
        self._floor = 0

    @property
    def live(self) -> bool:
        return self._live

    def __len__(self) -> int:
        return len(self._entries)

    def connected(self) -> None:
        """The event stream is open (subscribed at the scheduler): from now on every change is seen."""
        self._live = True
        self._epoch += 1
        self._entries.clear()
        self._unpinned.clear()

    def lost(self) -> None:
        """Stream ended or broke, the leader changed, or the scheduler stopped answering."""
        self._live = False
        self._epoch += 1
        self._entries.clear()
        self._unpinned.clear()

    def begin(self) -> AdmitToken:
        return AdmitToken(self._epoch, self._seq)

    def event(self, kind: str, session_id: str) -> None:
        if kind in IGNORED_EVENTS:
            return
        self._seq += 1
        self._remove(session_id)
        self._touched[session_id] = self._seq
        self._touched.move_to_end(session_id)
        while len(self._touched) > self.params.max_entries:
            _, seq = self._touched.popitem(last=False)
            self._floor = max(self._floor, seq)
        if kind in PRESSURE_EVENTS or kind not in KNOWN_EVENTS:
            for sid in self._unpinned:
                del self._entries[sid]
            self._unpinned.clear()

    def put(
        self, now: float, session_id: str, token: AdmitToken, admission: CachedAdmission, *, was_paused: bool
    ) -> bool:
        """Store an admission the scheduler answered without holding; False when it may be stale. A held
        or resumed one (`was_paused`: the program was paused, perhaps by a pause whose event this router
        never got) drops the program's entry."""
        if was_paused:
            self._remove(session_id)
            return False
        if (
            not self._live
            or not session_id
            or token.epoch != self._epoch
            or token.seq < self._floor
            or self._touched.get(session_id, 0) > token.seq
        ):
            return False
        self._entries[session_id] = (admission, now)
        self._entries.move_to_end(session_id)
        if admission.pinned:
            self._unpinned.discard(session_id)
        else:
            self._unpinned.add(session_id)
        while len(self._entries) > self.params.max_entries:
            oldest, _ = self._entries.popitem(last=False)
            self._unpinned.discard(oldest)
        return True

    def get(self, now: float, session_id: str) -> CachedAdmission | None:
        if not self._live:
            return None
        found = self._entries.get(session_id)
        if found is None:
            return None
        entry, stored_at = found
        if now - stored_at > self.params.ttl_s:
            self._remove(session_id)
            return None
        self._entries.move_to_end(session_id)
        return entry

    def drop(self, session_id: str) -> None:
        self._remove(session_id)

    def _remove(self, session_id: str) -> None:
        self._entries.pop(session_id, None)
        self._unpinned.discard(session_id)
