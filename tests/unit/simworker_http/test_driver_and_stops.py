"""Driver behaviour (failure, idle wake-up, virtual time) and stop strings through /generate."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from services.simworker.core.api import EngineRequest
from services.simworker.driver import DriverStopped, EngineDriver
from tests.support.eventually import assert_eventually


class _BrokenEngine:
    """Accepts requests, then fails on its first step (a test double for the failure path)."""

    def __init__(self):
        self.work = False

    def submit(self, request, now):
        self.work = True

    def abort(self, rid, now):
        return False

    def has_work(self):
        return self.work

    def step(self, now):
        raise RuntimeError("boom")


async def test_engine_failure_fails_requests_and_refuses_new_ones():
    driver = EngineDriver(_BrokenEngine(), speedup=10)
    driver.start()
    queue = driver.submit(EngineRequest("r", (1, 2, 3), 4))
    output, _ = await asyncio.wait_for(queue.get(), 5)
    assert output.finished and output.finish_reason["type"] == "abort"
    assert "boom" in output.finish_reason["message"]
    assert not driver.running
    try:
        driver.submit(EngineRequest("r2", (1,), 1))
    except DriverStopped:
        pass
    else:
        raise AssertionError("submit after failure must raise DriverStopped")
    await driver.stop()


async def test_idle_driver_wakes_on_submit_and_keeps_virtual_time(worker):
    driver = worker.driver
    steps_before = driver.steps
    await asyncio.sleep(0)  # idle: no steps while there is no work
    assert driver.steps == steps_before
    queue = driver.submit(EngineRequest("wake", tuple(range(300, 310)), 3, ignore_eos=True))
    outputs = []
    while not outputs or not outputs[-1][0].finished:
        outputs.append(await asyncio.wait_for(queue.get(), 10))
    assert sum(len(o.new_token_ids) for o, _ in outputs) == 3
    times = [t for _, t in outputs]
    assert times == sorted(times) and times[0] > 0
    assert driver.steps > steps_before


async def test_abort_of_queued_request_is_delivered_while_idle(worker):
    # max_new_tokens huge, abort immediately: the abort output arrives even if nothing else runs.
    queue = worker.driver.submit(EngineRequest("quick-abort", tuple(range(300, 310)), 10_000, ignore_eos=True))
    assert worker.driver.abort("quick-abort")
    while True:
        output, _ = await asyncio.wait_for(queue.get(), 10)
        if output.finished:
            break
    assert output.finish_reason["type"] == "abort"
    await assert_eventually(lambda: not worker.engine.has_work())


async def test_stop_string_truncates_and_frees_the_request(worker):
    async with aiohttp.ClientSession() as http:
        body = {
            "text": "tell me a story",
            "rid": "story",
            "sampling_params": {"max_new_tokens": 30, "ignore_eos": True},
        }
        async with http.post(worker.url + "/generate", json=body) as r:
            full = (await r.json())["text"]
        words = full.split(" ")
        stop = " " + words[len(words) // 2]
        expected = full[: full.find(stop)]
        body["sampling_params"]["stop"] = [stop]
        async with http.post(worker.url + "/generate", json={**body, "stream": True}) as r:
            lines = [line for line in (await r.read()).decode().split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    final = json.loads(lines[-2][len("data: ") :])
    assert final["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert final["text"] == expected
    await assert_eventually(lambda: not worker.engine.has_work() and worker.driver.in_flight() == [])


class _StuckEngine:
    """Has work that cannot progress (each step takes no time and yields nothing), so the driver waits
    for a submit or abort with a short timeout."""

    def submit(self, request, now):
        pass

    def abort(self, rid, now):
        return False

    def has_work(self):
        return True

    def step(self, now):
        from services.simworker.core.api import StepResult

        return StepResult(duration_s=0.0)


async def test_stop_ends_the_loop_when_a_wake_lands_with_the_cancellation():
    """On 3.11 `asyncio.wait_for` returned the wake in place of a cancellation that landed in the same
    loop iteration; the driver then kept looping and stop() waited forever."""
    driver = EngineDriver(_StuckEngine(), speedup=10)
    driver.start()
    loop_task = driver._task
    await asyncio.sleep(0.01)  # the loop waits on its wake event
    driver._wake.set()  # the wait completes in the same iteration as stop()'s cancellation
    stopping = asyncio.ensure_future(driver.stop())
    done, _ = await asyncio.wait({stopping}, timeout=5)
    assert done, "stop() did not return"
    assert loop_task.done(), "the engine loop kept running after stop()"


class _SlowLoopEngine:
    """Steps of a fixed virtual length, each of which also burns wall time in the loop (time.sleep):
    the loop's own overhead between steps (delivering, HTTP handlers, a loaded machine)."""

    def __init__(self, steps: int, duration_s: float, overhead_wall_s: float):
        self.left = steps
        self.duration_s = duration_s
        self.overhead_wall_s = overhead_wall_s
        self.starts: list[float] = []
        self.submitted: list[float] = []

    def submit(self, request, now):
        self.submitted.append(now)

    def abort(self, rid, now):
        return False

    def has_work(self):
        return self.left > 0

    def step(self, now):
        import time

        from services.simworker.core.api import StepResult

        self.starts.append(now)
        self.left -= 1
        time.sleep(self.overhead_wall_s)
        return StepResult(duration_s=self.duration_s)


async def test_busy_engine_runs_its_steps_back_to_back_in_virtual_time():
    """The loop's overhead between steps must not stretch the engine's timeline: at --speedup 4 on a
    loaded machine it made live decode ~14% slower than the simulator's (each step started when the
    loop got round to it, now(), not where the previous one ended). Failed before the fix: the gaps
    were the overhead times the speedup."""
    # 1 virtual second per step = 2 ms wall at speedup 500; the loop burns 6 ms wall per step.
    engine = _SlowLoopEngine(steps=8, duration_s=1.0, overhead_wall_s=0.006)
    driver = EngineDriver(engine, speedup=500)
    driver.start()
    driver._wake.set()
    await assert_eventually(lambda: not engine.has_work() and len(engine.starts) == 8)
    gaps = [b - a for a, b in zip(engine.starts, engine.starts[1:])]
    assert gaps == [1.0] * 7
    # It fell behind its clock (6 ms of work per 2 ms step), and says so.
    assert driver.late_s_total > 0.02
    await driver.stop()


async def test_a_request_arriving_while_the_loop_is_behind_joins_at_the_next_step_start():
    engine = _SlowLoopEngine(steps=40, duration_s=1.0, overhead_wall_s=0.006)
    driver = EngineDriver(engine, speedup=500)
    driver.start()
    driver._wake.set()
    await assert_eventually(lambda: len(engine.starts) >= 5)
    assert engine.has_work()
    behind_s = driver.now() - (engine.starts[-1] + 1.0)
    driver.submit(EngineRequest("late", (1,), 1))
    # At the start of the engine's next step (the end of the one in progress), not at now(): a real
    # scheduler sees it there, and a step must never start before a request it admits arrived.
    assert behind_s > 0
    assert engine.submitted[0] == engine.starts[-1] + 1.0
    await assert_eventually(lambda: not engine.has_work())
    await driver.stop()


class _OneSlowStepEngine(_SlowLoopEngine):
    """The loop is held up once (50 ms wall), then steps cost it nothing."""

    def step(self, now):
        result = super().step(now)
        self.overhead_wall_s = 0.0
        return result


async def test_a_backlog_carried_over_several_steps_counts_once_as_lateness():
    # 20 steps of 2 ms wall (1 virtual second at speedup 500); the first holds the loop 50 ms, after
    # which it runs behind for the rest of the steps, catching up 2 ms a step without sleeping.
    engine = _OneSlowStepEngine(steps=20, duration_s=1.0, overhead_wall_s=0.05)
    driver = EngineDriver(engine, speedup=500)
    driver.start()
    driver._wake.set()
    await assert_eventually(lambda: not engine.has_work() and len(engine.starts) == 20)
    assert [b - a for a, b in zip(engine.starts, engine.starts[1:])] == [1.0] * 19
    # ~48 ms behind once; summing the backlog at every step would give ~0.5 s.
    assert 0.04 < driver.late_s_total < 0.1
    await driver.stop()
