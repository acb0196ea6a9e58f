"""The scheduler process's garbage-collector settings: set once, by its main, after start-up.

A control tick at fleet size allocates thousands of short-lived container objects (events, plan
steps, candidate lists) that die when the tick's result has been published. With CPython's default
thresholds (700, 10, 10) a young collection runs every 700 net container allocations, so a tick's
objects are still alive at several of them and are promoted; that churn makes full collections, which
walk the whole heap (hundreds of thousands of objects at 50,000 programs), run every few ticks. The
tick benchmark measured 31 ms of collection per tick at 50,000 programs (23 ms of it full
collections) with the defaults, and 1-3 ms with these settings (docs/scheduler.md, "Cost").

`settle_heap`:

- collects, then freezes (`gc.freeze`) what start-up built: the modules, the configuration and the
  table restored from the store move to the permanent generation, which no collection walks again.
  Frozen objects are still freed by reference counting when their last reference goes (a restored
  program that is released is freed like any other); only a reference cycle that existed at the
  freeze and became garbage later is never collected. Collecting first leaves no garbage cycle to
  freeze, and what is frozen is start-up's, once: this bounds what can be kept, it cannot grow;
- raises the young generation's threshold to YOUNG_THRESHOLD net allocations, so that a tick's
  objects mostly die before a collection sees them. Garbage cycles then wait for at most that many
  allocations before they are collected: memory bounded by the threshold, not a leak.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net container allocations between young collections (CPython's default: 700)."""


def settle_heap() -> None:
    """Freeze what start-up built and set the collector's thresholds (see the module docstring).
    Call once per process, after the table is restored and before serving at full rate."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
