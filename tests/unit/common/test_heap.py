"""The service processes' collector settings (services/common/process/heap.py) and where the scheduler's and the
router's mains apply them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import services.scheduler.__main__ as scheduler_main
from services.common.process.heap import YOUNG_THRESHOLD

ROOT = Path(__file__).resolve().parents[3]

# Run in a child process: the collector's settings are the process's, and this one runs the suite.
PROBE = """
import gc
import json
from services.common.process.heap import settle_heap

freed = []

class Kept:
    def __del__(self):
        freed.append(type(self).__name__)

class Cycle:
    def __init__(self):
        self.me = self

table = {"restored": Kept()}  # built at start-up, like a restored table
defaults = gc.get_threshold()
settle_heap()
frozen = gc.get_freeze_count()
del table["restored"]  # released after the freeze: freed by reference counting all the same
after_freeze = list(freed)
cycle = Cycle()
del cycle  # a cycle made while serving is collected as before
found = gc.collect()
print(json.dumps({"defaults": defaults, "now": gc.get_threshold(), "frozen": frozen, "freed": after_freeze,
                  "cycle_collected": found >= 1}))
"""


def test_settle_heap_freezes_start_up_raises_the_young_threshold_and_frees_as_before():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    probe = json.loads(out)
    assert probe["defaults"] == [700, 10, 10]  # CPython's
    assert probe["now"] == [YOUNG_THRESHOLD, 10, 10]  # only the young generation's threshold moves
    assert probe["frozen"] > 1_000  # start-up's objects (the modules and the table) are frozen
    assert probe["freed"] == ["Kept"]  # and still freed when their last reference goes
    assert probe["cycle_collected"]


GROWTH_PROBE = """
import gc
import json
from services.common.process.heap import settle_heap, settle_if_grown

unsettled = settle_if_grown(100_000)  # a process that never settled its heap (the test suite's): nothing
settle_heap(2_000)
table = [[i] for i in range(5_000)]  # admitted while serving: young (tracked) objects
frozen = gc.get_freeze_count()
small = settle_if_grown(2_400)  # below 1.25x the last settle
settled = settle_if_grown(3_000)
frozen_after = gc.get_freeze_count()
again = settle_if_grown(3_700)  # below the floor (the last settle + 1,000)
print(json.dumps({"unsettled": unsettled, "small": small, "settled": settled, "again": again,
                  "grew": frozen_after - frozen, "young": gc.get_count()[0]}))
"""


def test_settle_if_grown_freezes_what_the_table_grew_by_only_at_a_new_high():
    out = subprocess.run(
        [sys.executable, "-c", GROWTH_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    probe = json.loads(out)
    assert probe["unsettled"] is False
    assert (probe["small"], probe["settled"], probe["again"]) == (False, True, False)
    assert probe["grew"] >= 5_000  # the growth is frozen: no later collection walks it
    assert probe["young"] < 1_000  # and a tick after the settle starts with an empty young generation


def test_main_settles_the_heap_once_the_service_has_started_with_the_restored_table_size(monkeypatch):
    calls: list[str] = []
    restored = {"p1": object(), "p2": object(), "p3": object()}
    running = SimpleNamespace(runtime=SimpleNamespace(core=SimpleNamespace(ledger=SimpleNamespace(programs=restored))))

    async def start(config: Any, **kwargs: Any) -> Any:
        calls.append("start")  # start_scheduler restores the table before it returns
        return running

    monkeypatch.setattr(scheduler_main, "start_scheduler", start)
    monkeypatch.setattr(scheduler_main, "settle_heap", lambda programs: calls.append(f"settle {programs}"))
    assert asyncio.run(scheduler_main.start_and_settle(object(), telemetry=None)) is running  # type: ignore[arg-type]
    assert calls == ["start", "settle 3"]
    running.runtime = None  # a standby (leader election) has no table yet
    calls.clear()
    asyncio.run(scheduler_main.start_and_settle(object(), telemetry=None))  # type: ignore[arg-type]
    assert calls == ["start", "settle 0"]


def test_the_routers_main_settles_the_heap_once_the_router_has_started(monkeypatch):
    """The router's loop lag at 256 streams was set by full collections of 85-150 ms: its main settles too."""
    import services.router.__main__ as router_main
    import services.router.server as router_server

    calls: list[str] = []
    running = object()

    async def start(config: Any, **kwargs: Any) -> Any:
        calls.append("start")
        return running

    monkeypatch.setattr(router_server, "start_router", start)
    monkeypatch.setattr(router_main, "settle_heap", lambda: calls.append("settle"))
    assert asyncio.run(router_main._start(object(), telemetry=None)) is running
    assert calls == ["start", "settle"]
