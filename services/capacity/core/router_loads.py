"""The router-load table: the latest report of every live router (router replica sync).

Each router reports the active load it caused itself (docs/router.md "Router replica sync"); the table
keeps the newest report per router id and drops one that is not replaced within its own TTL (a killed
router's load leaves every peer's view). Reports are opaque payloads here: the shell stores what it
fans out, the table only orders and ages them.

    table = RouterLoadTable()
    table.report("r1", sequence=7, ttl_s=1.0, payload=msg, now=t)   # True: kept; False: older than known
    table.expire(now)                                              # ids dropped
    table.live()                                                   # payloads, by router id
    table.version                                                  # bumps on every change
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")


@dataclass(frozen=True)
class _Entry(Generic[P]):
    sequence: int
    expires_at: float
    payload: P


class RouterLoadTable(Generic[P]):
    def __init__(self) -> None:
        self._entries: dict[str, _Entry[P]] = {}
        self.version = 0

    def report(self, router_id: str, sequence: int, ttl_s: float, payload: P, now: float) -> bool:
        """Keep `payload` as `router_id`'s load until `now + ttl_s`. A sequence not above the one held
        is a late duplicate (a retried call) and is ignored: False."""
        held = self._entries.get(router_id)
        if held is not None and sequence <= held.sequence and held.expires_at > now:
            return False
        self._entries[router_id] = _Entry(sequence, now + ttl_s, payload)
        self.version += 1
        return True

    def expire(self, now: float) -> list[str]:
        """Drop the routers whose last report outlived its TTL; returns their ids, sorted."""
        gone = sorted(rid for rid, entry in self._entries.items() if entry.expires_at <= now)
        for router_id in gone:
            del self._entries[router_id]
        if gone:
            self.version += 1
        return gone

    def next_expiry(self) -> float | None:
        return min((e.expires_at for e in self._entries.values()), default=None)

    def live(self) -> list[P]:
        return [self._entries[rid].payload for rid in sorted(self._entries)]

    def __len__(self) -> int:
        return len(self._entries)
