"""The live loop: steps the engine in (scaled) real time and hands results to HTTP streams.

Virtual time is wall-clock time since start multiplied by `speedup`, so a step that the
timing model says takes `d` seconds occupies `d / speedup` wall seconds. One task runs

    result = engine.step(now_v)
    sleep until the wall time at which now_v + result.duration_s is reached
    deliver result.outputs to per-request queues, result.kv_events to the publisher

and parks on an event when the engine has no work; `submit` and `abort` wake it. Sleeping
until an absolute deadline (rather than for `duration`) keeps the loop's own overhead from
accumulating as extra latency. Nothing here logs per token.

While the engine stays busy, each step starts in virtual time where the previous one ended, as a
GPU runs them back to back, not when the loop gets round to it: the loop's own wall time between
two steps (waking up, delivering outputs, the HTTP handlers that run meanwhile, every other process
on the machine) would otherwise be added to every step, times `speedup`, and the engine would run
slower than the hardware it models (at --speedup 4 on a loaded 2-core machine, decode ran ~14%
slower than the same engine in the simulator; docs/simulator.md "The live path"). A request that
arrives while the loop is between two such steps is submitted at the next step's start, the
moment a real scheduler would see it. Only an idle engine (no work, or none that can progress)
takes the wall clock again. When the loop is behind, the steps run back to back without sleeping
until it has caught up. `late_s_total` adds up how far the loop fell behind: each increase of its
backlog when a step's end has passed before the loop could wait for it (a backlog carried over
several steps counts once; a single late step counts as it always did).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

from services.common.sglang.kv_events import KvEvent
from services.simworker.core.api import Engine, EngineRequest, RequestOutput

log = logging.getLogger(__name__)

# A delivered item: the output and the virtual time at which it became visible.
Delivery = tuple[RequestOutput, float]


class DriverStopped(RuntimeError):
    """The driver is not running (not started, stopped, or the engine failed)."""


class EngineDriver:
    def __init__(
        self,
        engine: Engine,
        speedup: float,
        *,
        publish_kv_events: Callable[[float, tuple[KvEvent, ...]], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if speedup <= 0:
            raise ValueError("speedup > 0")
        self.engine = engine
        self.speedup = speedup
        self._publish = publish_kv_events
        self._monotonic = monotonic
        self._wall = wall
        self._t0 = monotonic()
        self._queues: dict[str, asyncio.Queue[Delivery]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.failure: BaseException | None = None
        self.steps = 0
        # While the engine is busy: the virtual time at which its next step starts (the end of the
        # step in progress); None when idle, and the next step starts at now().
        self._next_start_v: float | None = None
        # Wall seconds the loop fell behind the engine's clock, summed over the times it did (CPU-bound
        # at high speedup, or a loaded machine), and its current lag (wall seconds, 0 when idle).
        self.late_s_total = 0.0
        self._lag_s = 0.0

    # -- time ---------------------------------------------------------------------------
    def now(self) -> float:
        """Current virtual time (seconds since the driver was created, times speedup)."""
        return (self._monotonic() - self._t0) * self.speedup

    def engine_now(self) -> float:
        """The virtual time the engine is at for a submit or an abort: now(), or, while the engine is
        busy and the loop is late, the start of its next step (never after it)."""
        now_v = self.now()
        next_v = self._next_start_v
        return now_v if next_v is None or next_v > now_v else next_v

    def _wall_at(self, virtual_s: float) -> float:
        return self._t0 + virtual_s / self.speedup

    def epoch_ns_at(self, virtual_times: Sequence[float]) -> list[int]:
        """The Unix times (ns) at which the engine's clock reads each of `virtual_times` (span event
        timestamps), all through one reading of the wall and monotonic clocks, so that they keep their order."""
        offset_s = self._wall() - self._monotonic()
        return [int((offset_s + self._wall_at(v)) * 1e9) for v in virtual_times]

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="simworker-engine-loop")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and self.failure is None

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._fail_all("server shutting down")

    # -- requests -------------------------------------------------------------------------
    def submit(self, request: EngineRequest) -> asyncio.Queue[Delivery]:
        """Queue `request`; its outputs arrive on the returned queue until one has finished=True.

        Raises ValueError (from the engine) for a request that can never be served, and
        KeyError when the rid is already in flight.
        """
        if not self.running:
            raise DriverStopped(str(self.failure) if self.failure else "engine loop is not running")
        if request.rid in self._queues:
            raise KeyError(request.rid)
        self.engine.submit(request, self.engine_now())
        queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._queues[request.rid] = queue
        self._wake.set()
        return queue

    def abort(self, rid: str) -> bool:
        """Ask the engine to abort `rid`; its queue still receives the finishing abort output."""
        known = self.engine.abort(rid, self.engine_now())
        self._wake.set()
        return known

    def release(self, rid: str) -> None:
        """The consumer is gone: abort the request if it is still in flight and drop its queue."""
        if self._queues.pop(rid, None) is not None:
            self.engine.abort(rid, self.engine_now())
            self._wake.set()

    def finish(self, rid: str) -> None:
        """The consumer saw the final output; forget the queue (no abort)."""
        self._queues.pop(rid, None)

    def flush_cache(self) -> bool:
        """Flush the engine's cache; publish its AllBlocksCleared right away (the idle loop would not step)."""
        if self._queues or not self.engine.flush_cache():
            return False
        result = self.engine.step(self.now())  # no work: duration 0, just the drained events
        if result.kv_events and self._publish is not None:
            self._publish(self._wall(), result.kv_events)
        return True

    def in_flight(self) -> list[str]:
        return list(self._queues)

    # -- the loop -------------------------------------------------------------------------
    async def _run(self) -> None:
        engine = self.engine
        queues = self._queues
        try:
            while True:
                self._wake.clear()
                if not engine.has_work():
                    self._next_start_v = None
                    self._lag_s = 0.0
                    await self._wake.wait()
                    continue
                start_v = self.engine_now()
                result = engine.step(start_v)
                self.steps += 1
                end_v = start_v + result.duration_s
                if result.duration_s > 0:
                    self._next_start_v = end_v
                    delay = self._wall_at(end_v) - self._monotonic()
                    # Behind when the step's end has already passed: count only what the backlog grew
                    # by, so that a lag carried over several steps counts once (a sleep's jitter, when
                    # the loop is on time, is no lag).
                    lag_s = max(0.0, -delay)
                    self.late_s_total += max(0.0, lag_s - self._lag_s)
                    self._lag_s = lag_s
                    await asyncio.sleep(max(0.0, delay))
                elif not result.outputs and not result.kv_events:
                    self._next_start_v = None
                    self._lag_s = 0.0
                    # Work that cannot progress right now: wait for a submit/abort, but
                    # look again soon in case the engine is waiting on time alone.
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can return the wake in place of a
                    # cancellation (stop) that lands in the same iteration, and the loop would run on.
                    try:
                        async with asyncio.timeout(0.05):
                            await self._wake.wait()
                    except TimeoutError:
                        pass
                    continue
                for output in result.outputs:
                    queue = queues.get(output.rid)
                    if queue is not None:
                        queue.put_nowait((output, end_v))
                        if output.finished:
                            # The consumer may still be draining; it has the queue object.
                            del queues[output.rid]
                if result.kv_events and self._publish is not None:
                    self._publish(self._wall(), result.kv_events)
                if result.duration_s <= 0:
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine broke: fail every request, report unhealthy
            self.failure = exc
            log.exception("simworker engine loop failed; failing %d in-flight requests", len(queues))
            self._fail_all(f"engine failure: {exc}")

    def _fail_all(self, message: str) -> None:
        now_v = self.now()
        for rid, queue in list(self._queues.items()):
            queue.put_nowait(
                (
                    RequestOutput(
                        rid=rid,
                        new_token_ids=(),
                        prompt_tokens=0,
                        completion_tokens=0,
                        cached_tokens=0,
                        finished=True,
                        finish_reason={"type": "abort", "message": message},
                    ),
                    now_v,
                )
            )
        self._queues.clear()
