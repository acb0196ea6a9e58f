"""Other routers' active load per replica (router replica sync, `--router-replica-sync`).

Each router counts only the requests it routed itself (`load.py`); with N routers in front of one
fleet each sees about 1/N of a worker's load. With the flag, every router reports its own per-replica
aggregate to the capacity service and watches the table of every router's latest report; this module
holds that table minus this router's own entry, summed per replica, for `ActiveLoad` to add.

Peers' decode blocks are added as counts: their block sets are not shared, so a prompt block active
through two routers counts twice (within one router it counts once). The view is as old as the last
table received; `expire(now)` drops it all once no table arrived for `ttl_s` (capacity unreachable),
and the router goes on routing on its own count.

    peers = PeerLoads(own_id="router-a", ttl_s=1.0)
    peers.replace([PeerReport("router-b", {replica: ReplicaLoad(2, 300, 40)})], now)
    peers.get(replica)          # ReplicaLoad(2, 300, 40), or None
    peers.expire(now)           # True when the view was dropped as stale
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from services.router.core.load import ReplicaLoad
from services.router.core.types import Replica


@dataclass(frozen=True)
class PeerReport:
    router_id: str
    loads: Mapping[Replica, ReplicaLoad]


class PeerLoads:
    def __init__(self, own_id: str, ttl_s: float) -> None:
        if not own_id:
            raise ValueError("own_id is required")
        if not ttl_s > 0:
            raise ValueError("ttl_s > 0")
        self.own_id = own_id
        self.ttl_s = ttl_s
        self._sums: dict[Replica, ReplicaLoad] = {}
        self._received_at: float | None = None
        self.peers = 0
        """Routers other than this one in the last table (0 once it went stale)."""
        self.generation = 0
        """Counts the changes of the view (a table taken, the view dropped): what was derived from it is
        current while this is unchanged."""

    def replace(self, reports: Iterable[PeerReport], now: float) -> None:
        """A fresh table from the capacity service: replaces the whole view (no deltas)."""
        sums: dict[Replica, list[int]] = {}
        peers = 0
        for report in reports:
            if report.router_id == self.own_id:
                continue
            peers += 1
            for replica, load in report.loads.items():
                acc = sums.setdefault(replica, [0, 0, 0])
                acc[0] += load.active_requests
                acc[1] += load.active_prefill_tokens
                acc[2] += load.active_decode_blocks
        self._sums = {replica: ReplicaLoad(*acc) for replica, acc in sums.items()}
        self.peers = peers
        self._received_at = now
        self.generation += 1

    def get(self, replica: Replica) -> ReplicaLoad | None:
        return self._sums.get(replica)

    def items(self) -> list[tuple[Replica, ReplicaLoad]]:
        return sorted(self._sums.items())

    def age_s(self, now: float) -> float | None:
        """Seconds since the last table; None before the first (or after it was dropped)."""
        return None if self._received_at is None else now - self._received_at

    def expire(self, now: float) -> bool:
        """Drop the whole view once the last table is `ttl_s` old. True when it was dropped now."""
        if self._received_at is None or now - self._received_at < self.ttl_s:
            return False
        self._sums = {}
        self.peers = 0
        self._received_at = None
        self.generation += 1
        return True
