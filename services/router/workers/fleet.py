"""The fleet view: the routable workers (from each capacity snapshot) and the selection core over them.

    fleet = Fleet(lambda page_size: resolve_params(config.kv, scheduler_config, page_size), seed)
    fleet.update(workers)          # each capacity snapshot: the whole set, not deltas
    fleet.serving(model)           # the workers a turn may go to (503 / 404 when there are none)

The selection core is made with the first workers seen, so that its block size can follow their page size.
"""

from __future__ import annotations

import logging
import random
from typing import Callable

from services.common.sglang.kv_events import KvEvent
from services.router.config import KvOverrides
from services.router.core.events import EventOutcome
from services.router.core.kv_router import KvRouterCore
from services.router.core.params import KvRouterParams, SchedulerKvSettings
from services.router.core.peer_loads import PeerLoads
from services.router.core.types import Replica, WorkerView
from services.router.errors import ModelNotFound, NoHealthyWorker

log = logging.getLogger(__name__)


def resolve_params(
    overrides: KvOverrides, scheduler_config: SchedulerKvSettings | None, page_size: int | None
) -> KvRouterParams:
    """Flags win; then the scheduler's GetRouterConfig; then the core's defaults. The block size
    follows the flag, else the workers' page size (the index must use the engine's pages), else
    the scheduler's router_block_size."""
    defaults = KvRouterParams()
    sc = scheduler_config

    def pick(flag, from_scheduler, default):
        if flag is not None:
            return flag
        return from_scheduler if sc is not None else default

    block_size = (
        overrides.block_size
        or page_size
        or (sc.router_block_size if sc is not None and sc.router_block_size > 1 else None)
        or defaults.block_size
    )
    return KvRouterParams(
        router_temperature=pick(
            overrides.router_temperature, sc and sc.router_temperature, defaults.router_temperature
        ),
        kv_overlap_score_weight=pick(
            overrides.kv_overlap_score_weight, sc and sc.kv_overlap_score_weight, defaults.kv_overlap_score_weight
        ),
        use_kv_events=pick(overrides.use_kv_events, sc and sc.use_kv_events, defaults.use_kv_events),
        router_track_output_blocks=pick(
            overrides.router_track_output_blocks,
            sc and sc.router_track_output_blocks,
            defaults.router_track_output_blocks,
        ),
        # Scheduler-only settings (the router has no flag for them).
        router_track_active_blocks=sc.router_track_active_blocks if sc else defaults.router_track_active_blocks,
        router_track_prefill_tokens=sc.router_track_prefill_tokens if sc else defaults.router_track_prefill_tokens,
        block_size=block_size,
        router_ttl_s=pick(
            overrides.router_ttl_secs,
            sc.router_ttl_secs if sc is not None and sc.router_ttl_secs > 0 else defaults.router_ttl_s,
            defaults.router_ttl_s,
        ),
    )


class Fleet:
    """The routable workers and the selection core over them."""

    def __init__(
        self, params_for: Callable[[int | None], KvRouterParams], seed: int, peers: PeerLoads | None = None
    ) -> None:
        self._params_for = params_for
        self.peers = peers  # other routers' loads (--router-replica-sync), handed to the core
        self._rng = random.Random(None if seed < 0 else seed)
        self.core: KvRouterCore | None = None
        self.workers: dict[str, WorkerView] = {}
        self.on_workers: list[Callable[[dict[str, WorkerView]], None]] = []

    def update(self, workers: dict[str, WorkerView]) -> None:
        if self.core is None and workers:
            page = next(iter(sorted(workers.items())))[1].page_size or None
            self.core = KvRouterCore(self._params_for(page), self._rng, peers=self.peers)
            p = self.core.params
            log.info(
                "selection: block_size=%d temperature=%g overlap_weight=%g kv_events=%s output_blocks=%s "
                "active_blocks=%s prefill_tokens=%s ttl=%gs",
                p.block_size,
                p.router_temperature,
                p.kv_overlap_score_weight,
                p.use_kv_events,
                p.router_track_output_blocks,
                p.router_track_active_blocks,
                p.router_track_prefill_tokens,
                p.router_ttl_s,
            )
        if self.core is not None:
            for view in workers.values():
                if view.page_size and view.page_size != self.core.params.block_size:
                    log.warning(
                        "worker %s has page_size %d but the router's block size is %d: its KV events are dropped",
                        view.worker_id,
                        view.page_size,
                        self.core.params.block_size,
                    )
            for worker_id, old in self.workers.items():
                new = workers.get(worker_id)
                for replica in old.replicas:
                    if new is None or replica not in new.replicas:
                        self.core.remove_worker(replica)
        self.workers = workers
        for listener in self.on_workers:
            listener(workers)

    @property
    def model_names(self) -> list[str]:
        return sorted({w.model_name for w in self.workers.values() if w.model_name})

    def serving(self, model: str | None) -> list[WorkerView]:
        """Workers that serve `model` (None = any). Raises NoHealthyWorker / ModelNotFound."""
        if not self.workers:
            raise NoHealthyWorker("no healthy worker")
        if model is None:
            return list(self.workers.values())
        views = [w for w in self.workers.values() if w.model_name == model or not w.model_name]
        if not views:
            raise ModelNotFound(model)
        return views

    @property
    def subscribes_to_kv_events(self) -> bool:
        return self.core is not None and self.core.params.subscribes_to_kv_events

    def apply_kv_event(self, replica: Replica, event: KvEvent) -> EventOutcome | None:
        if self.core is None or not self.core.params.use_kv_events:
            return None
        return self.core.apply_kv_event(replica, event)
