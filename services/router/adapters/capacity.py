"""The router's side of the capacity watch (the client is services/common/outbound/capacity_watch.py): each
snapshot's routable workers replace the fleet's (recompute from a fresh snapshot, not deltas). Only
HEALTHY workers with replicas are routable; a worker that leaves this set (unhealthy, gone) has its
not-yet-started turns moved (turns.py). The card's `context_length` is kept: prompts that cannot fit are
refused before Admit. While the stream is down the last view stays in force: the
data plane keeps running through a control-plane outage.
"""

from __future__ import annotations

import logging
from typing import Callable

from bandmaster.capacity.v1 import capacity_pb2 as pb
from services.router.core.types import Replica, WorkerView
from services.router.observe.metrics import RouterMetrics

log = logging.getLogger(__name__)


def view_from_snapshot(snapshot: pb.WorkersSnapshot) -> dict[str, WorkerView]:
    out: dict[str, WorkerView] = {}
    for w in snapshot.workers:
        if w.health != pb.WORKER_HEALTH_HEALTHY or not w.replicas:
            continue
        replicas = tuple(sorted(Replica(w.worker_id, r.dp_rank) for r in w.replicas))
        out[w.worker_id] = WorkerView(
            w.worker_id, w.url.rstrip("/"), w.card.model_name, w.card.page_size, replicas, w.card.context_length
        )
    return out


class WorkerSet:
    """The callbacks the router gives the capacity watch: `take` each snapshot, `connected` the stream state.
    Logs the transition (workers added and gone) and hands the new view to `on_change`."""

    def __init__(self, metrics: RouterMetrics, on_change: Callable[[dict[str, WorkerView]], None]) -> None:
        self._metrics = metrics
        self._on_change = on_change
        self.workers: dict[str, WorkerView] = {}

    def take(self, snapshot: pb.WorkersSnapshot) -> None:
        view = view_from_snapshot(snapshot)
        if view != self.workers:
            added = sorted(view.keys() - self.workers.keys())
            gone = sorted(self.workers.keys() - view.keys())
            if added or gone:
                log.info(
                    "workers: %d healthy (+%s -%s)", len(view), ",".join(added) or "none", ",".join(gone) or "none"
                )
        self.workers = view
        self._metrics.workers.set(len(view))
        self._on_change(view)

    def connected(self, up: bool) -> None:
        self._metrics.capacity_connected.set(1 if up else 0)
