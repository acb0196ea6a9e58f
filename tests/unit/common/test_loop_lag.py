"""LoopLag: stalls are measured, remembered for `stalled_within`, and warned about once per episode."""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CollectorRegistry

from services.common.observe.loop_lag import LoopLag


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_stall_is_seen_within_its_window_and_forgotten_after():
    clock = Clock()
    lag = LoopLag("svc", CollectorRegistry(), interval_s=0.1, monotonic=clock)
    clock.t += 0.1
    lag.observe(0.002)
    assert lag.stalled_within(2.0) == 0.0
    clock.t += 1.6
    lag.observe(1.5)  # the loop woke 1.5 s late
    assert lag.stalled_within(2.0) == 1.5
    clock.t += 1.0
    lag.observe(0.0)
    assert lag.stalled_within(2.0) == 1.5  # ended 1 s ago: inside a 2 s window
    clock.t += 1.5
    lag.observe(0.0)
    assert lag.stalled_within(2.0) == 0.0


def test_a_stall_still_under_way_counts():
    clock = Clock()
    lag = LoopLag("svc", CollectorRegistry(), interval_s=0.1, monotonic=clock)
    lag.observe(0.0)
    clock.t += 0.9  # the sampler has not run for 0.9 s
    assert abs(lag.stalled_within(2.0) - 0.8) < 1e-9


def test_one_warning_per_episode_with_the_count_of_the_rest(caplog):
    clock = Clock()
    lag = LoopLag("svc", CollectorRegistry(), interval_s=0.1, warn_s=1.0, warn_every_s=60.0, monotonic=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            clock.t += 2.0
            lag.observe(1.2)
        clock.t += 60.0
        lag.observe(1.1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "blocked for 1.20s" in lines[0] and "2 more since the last warning" in lines[1]


async def test_the_sampler_measures_a_blocked_loop():
    registry = CollectorRegistry()
    lag = LoopLag("svc", registry, interval_s=0.05)
    lag.start()
    try:
        await asyncio.sleep(0.06)
        time.sleep(0.3)  # block the loop
        await asyncio.sleep(0.1)
        assert lag.stalled_within(5.0) >= 0.2
        assert registry.get_sample_value("bandmaster_event_loop_lag_seconds_count") >= 1
    finally:
        await lag.stop()


def test_the_lag_clock_adds_every_lag_and_a_stall_under_way_only_while_sampling():
    clock = Clock()
    lag = LoopLag("svc", CollectorRegistry(), interval_s=0.1, monotonic=clock)
    for late in (0.05, 0.0, 0.2, 0.03):  # short lags count too: a saturated loop has only those
        clock.t += 0.1 + late
        lag.observe(late)
    assert abs(lag.lag_clock() - 0.28) < 1e-9
    clock.t += 0.6  # the sampler is not running: nothing is under way
    assert abs(lag.lag_clock() - 0.28) < 1e-9


async def test_a_saturated_loop_advances_the_on_time_clock_about_one_interval_a_turn():
    lag = LoopLag("svc", CollectorRegistry(), interval_s=0.05)
    lag.start()
    try:
        await asyncio.sleep(0.06)
        start_wall, start_lag = time.monotonic(), lag.lag_clock()
        for _ in range(8):  # eight slow loop turns, none idle
            time.sleep(0.15)
            await asyncio.sleep(0)
        wall = time.monotonic() - start_wall
        on_time = wall - (lag.lag_clock() - start_lag)
        assert wall >= 1.2 and on_time < 0.6 * wall
    finally:
        await lag.stop()
