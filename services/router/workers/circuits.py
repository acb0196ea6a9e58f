"""Which workers are in rotation: one circuit breaker (core/breaker.py) per worker.

A worker that fails `worker_failure_threshold` turns in a row (refused, reset, 5xx, first-token or
inter-token timeout) is taken out of rotation for `worker_eject_seconds`; then the next turn picked
for it is its probe (one at a time): a first token or a complete answer brings it back, another
failure keeps it out twice as long (up to `worker_eject_max_seconds`). A worker's own 4xx counts as
alive. The capacity service's health still decides which workers exist; this only narrows them.
Transitions are logged (out of rotation: WARNING; probe, back: INFO) and counted.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Sequence

from services.router.core.breaker import BreakerParams, CircuitBreaker, CircuitState, Transition
from services.router.core.types import WorkerView
from services.router.observe.metrics import RouterMetrics

log = logging.getLogger(__name__)


class WorkerCircuits:
    def __init__(
        self, params: BreakerParams, metrics: RouterMetrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.params = params
        self._metrics = metrics
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}

    def state(self, worker_id: str) -> CircuitState:
        breaker = self._breakers.get(worker_id)
        return breaker.state if breaker is not None else CircuitState.CLOSED

    def routable(self, views: Sequence[WorkerView]) -> list[WorkerView]:
        """The views whose worker may take a turn now (in rotation, or due for its probe)."""
        if not self._breakers:
            return list(views)
        now = self._clock()
        return [v for v in views if (b := self._breakers.get(v.worker_id)) is None or b.available(now)]

    def retry_after(self, views: Iterable[WorkerView]) -> float:
        """Seconds until the first of `views` is due for a probe."""
        now = self._clock()
        waits = [b.retry_after(now) for v in views if (b := self._breakers.get(v.worker_id)) is not None]
        return min(waits, default=0.0)

    def dispatched(self, worker_id: str) -> None:
        breaker = self._breakers.get(worker_id)
        if breaker is not None:
            self._note(worker_id, breaker.on_dispatch(self._clock()), "")

    def succeeded(self, worker_id: str) -> None:
        breaker = self._breakers.get(worker_id)
        if breaker is not None:
            self._note(worker_id, breaker.on_success(self._clock()), "")
            if breaker.state is CircuitState.CLOSED:
                self._breakers.pop(worker_id, None)  # a closed breaker with no failures is the default

    def failed(self, worker_id: str, why: str) -> None:
        if not self.params.failure_threshold:
            return
        breaker = self._breakers.get(worker_id)
        if breaker is None:
            breaker = self._breakers[worker_id] = CircuitBreaker(self.params)
        self._note(worker_id, breaker.on_failure(self._clock()), why)

    def abandoned(self, worker_id: str) -> None:
        breaker = self._breakers.get(worker_id)
        if breaker is not None:
            self._note(worker_id, breaker.on_abandon(self._clock()), "")

    def forget(self, live: Iterable[str]) -> None:
        """Drop the breakers of workers that left the fleet."""
        keep = set(live)
        for worker_id in [w for w in self._breakers if w not in keep]:
            del self._breakers[worker_id]
        self._update_gauge()

    def _note(self, worker_id: str, transition: Transition | None, why: str) -> None:
        if transition is None:
            return
        self._metrics.circuit_transitions.labels(transition.new.value, transition.reason.value).inc()
        if transition.new is CircuitState.OPEN and transition.old is CircuitState.CLOSED:
            log.warning(
                "worker %s out of rotation after %d consecutive failures (last: %s); probe in %.1fs",
                worker_id,
                transition.failures,
                why,
                transition.open_s,
            )
        elif transition.new is CircuitState.OPEN:
            log.info(
                "worker %s stays out of rotation (%s%s); next probe in %.1fs",
                worker_id,
                transition.reason.value,
                f": {why}" if why else "",
                transition.open_s,
            )
        elif transition.new is CircuitState.HALF_OPEN:
            log.info("worker %s: probing with one turn", worker_id)
        else:
            log.info("worker %s back in rotation (probe answered)", worker_id)
        self._update_gauge()

    def _update_gauge(self) -> None:
        self._metrics.workers_out_of_rotation.set(
            sum(1 for b in self._breakers.values() if b.state is not CircuitState.CLOSED)
        )
