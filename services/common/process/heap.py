"""A service process's garbage-collector settings: set once, by its main, after start-up (the scheduler,
the router).

Both processes allocate many short-lived container objects per unit of work that die as soon as it is
done: a control tick's events, plan steps and candidate lists (the scheduler); a turn's request, its
response objects, futures, tasks and protobuf messages (the router, hundreds of turns a second). With
CPython's default thresholds (700, 10, 10) a young collection runs every 700 net container allocations,
so such objects are still alive at several of them and are promoted; the churn makes full collections,
which walk the whole heap, run every few seconds, and each stalls the process's event loop.

- The scheduler: the tick benchmark measured 31 ms of collection per tick at 50,000 programs (23 ms of it
  full collections) with the defaults, and 1-3 ms with these settings (docs/scheduler.md, "Cost").
- The router, at 256 streams on 2 cores: 4.5 s of collection in 35 s with the defaults (about a tenth
  of its CPU), full collections of 85-150 ms each that set its event-loop lag's p99; 0.1 s with these
  settings (docs/benchmarks/router.md, "Issue 20, round 4").

`settle_heap`:

- collects, then freezes (`gc.freeze`) what start-up built: the modules, the configuration and the
  table restored from the store move to the permanent generation, which no collection walks again.
  Frozen objects are still freed by reference counting when their last reference goes (a restored
  program that is released is freed like any other); only a reference cycle that existed at the
  freeze and became garbage later is never collected. Collecting first leaves no garbage cycle to
  freeze;
- raises the young generation's threshold to YOUNG_THRESHOLD net allocations, so that a tick's or a
  turn's objects mostly die before a collection sees them. Garbage cycles then wait for at most that
  many allocations before they are collected: memory bounded by the threshold, not a leak.

`settle_if_grown` (the scheduler's tick loop calls it before each tick) does the same collect-and-freeze
when the table has grown by GROWTH_FACTOR since the last settle (and by GROWTH_FLOOR_PROGRAMS at least).
A table that grew while serving (10,000 programs admitted after start-up) is otherwise young: the first
tick after the growth met a young collection of everything admitted since (5 ms of a 20 ms tick at
10,000 programs), and the survivors, promoted, were walked again by every older collection. Settling
before the tick collects them once, at the tick loop's own time, and a tick then meets only its own
allocations. Its cost is that of a collection of what is not frozen (the growth, not the table), and it
runs only at a new high of the table times GROWTH_FACTOR: a handful of times over a process's life (8
settles on the way to 10,000 programs, 15 to 50,000), each logged. What a settle can keep for good is a
cycle that was alive at a settle and became garbage later (a request in flight at that moment); the
number of settles bounds it. The router has no table to settle again: what it grows while serving (its
KV index, its session chains) is walked only by full collections, which the collector's own rule (a
full collection once the objects promoted since the last one reach a quarter of the old generation)
makes rarer as it grows.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net container allocations between young collections (CPython's default: 700)."""
GROWTH_FACTOR = 1.25
"""The table's growth since the last settle that makes `settle_if_grown` settle again."""
GROWTH_FLOOR_PROGRAMS = 1_000
"""Nor before the table holds this many programs more than at the last settle (a small table's
young objects cost a tick little)."""


class _Settled:
    programs: int | None = None
    """The table's size at the last settle; None: this process has not settled its heap (tests that run
    many services in one process), and `settle_if_grown` does nothing."""


def settle_heap(programs: int = 0) -> None:
    """Freeze what start-up built and set the collector's thresholds (see the module docstring).
    Call once per process, after the table (`programs` of them) is restored and before serving at full
    rate."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    _Settled.programs = programs


def settle_if_grown(programs: int) -> bool:
    """Before a tick: collect and freeze again if the table (`programs`) has grown by GROWTH_FACTOR (and
    GROWTH_FLOOR_PROGRAMS) since the last settle, and only in a process that settled its heap. Returns
    whether it settled."""
    last = _Settled.programs
    if last is None or programs < max(last * GROWTH_FACTOR, last + GROWTH_FLOOR_PROGRAMS):
        return False
    gc.collect()
    gc.freeze()
    _Settled.programs = programs
    return True
