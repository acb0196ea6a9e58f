"""Every `services/<svc>/core/` reads no clock and runs nothing concurrently: the clock is passed in.

import-linter (`make lint`, contract (b)) keeps I/O and transport modules out of the cores; this test covers what
an import graph cannot see: a clock read (`time.monotonic()`, `datetime.now()`) or `asyncio` / `threading` use.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
CORE_FILES = sorted(ROOT.glob("services/*/core/**/*.py"))

CLOCK_FUNCTIONS = frozenset(
    {
        "time",
        "time_ns",
        "monotonic",
        "monotonic_ns",
        "perf_counter",
        "perf_counter_ns",
        "process_time",
        "process_time_ns",
        "thread_time",
        "thread_time_ns",
        "clock_gettime",
        "clock_gettime_ns",
        "sleep",
    }
)
DATETIME_NOW = frozenset({"now", "utcnow", "today"})
CONCURRENCY_MODULES = frozenset({"asyncio", "threading"})


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def impurities(source: str) -> list[str]:
    """What in `source` reads a clock or uses asyncio/threading, as `line: what`."""
    tree = ast.parse(source)
    time_aliases = set()  # names bound to the time module
    datetime_names = set()  # names bound to datetime.datetime / datetime.date or the datetime module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in CONCURRENCY_MODULES:
                    found.append(f"{node.lineno}: import {alias.name}")
                if alias.name == "time":
                    time_aliases.add(alias.asname or "time")
                if alias.name == "datetime":
                    datetime_names.add(alias.asname or "datetime")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] in CONCURRENCY_MODULES:
                found.append(f"{node.lineno}: from {module} import ...")
            elif module == "time":
                for alias in node.names:
                    if alias.name in CLOCK_FUNCTIONS or alias.name == "*":
                        found.append(f"{node.lineno}: from time import {alias.name}")
            elif module == "datetime":
                for alias in node.names:
                    if alias.name in ("datetime", "date"):
                        datetime_names.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = _dotted(node.value)
        if base is None:
            continue
        if base in time_aliases and node.attr in CLOCK_FUNCTIONS:
            found.append(f"{node.lineno}: {base}.{node.attr}")
        elif node.attr in DATETIME_NOW and (base in datetime_names or base.split(".")[-1] in ("datetime", "date")):
            found.append(f"{node.lineno}: {base}.{node.attr}")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def test_there_are_cores_to_check():
    services = {p.relative_to(ROOT).parts[1] for p in CORE_FILES}
    assert {"capacity", "scheduler", "router", "planner", "batch", "simworker"} <= services


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(ROOT / "services")))
def test_core_reads_no_clock_and_runs_nothing_concurrently(path):
    assert impurities(path.read_text()) == [], f"{path.relative_to(ROOT)}: take the time as an argument"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import time\nt = time.monotonic()", ["2: time.monotonic"]),
        ("import time as t\nx = t.perf_counter()", ["2: t.perf_counter"]),
        ("from time import time\n", ["1: from time import time"]),
        ("import datetime\nx = datetime.datetime.now()", ["2: datetime.datetime.now"]),
        ("from datetime import datetime as dt\nx = dt.utcnow()", ["2: dt.utcnow"]),
        ("import asyncio\n", ["1: import asyncio"]),
        ("from threading import Lock\n", ["1: from threading import ..."]),
        ("import concurrent.futures, threading\n", ["1: import threading"]),
        # Allowed: arithmetic on a passed-in timestamp, a parameter named `now`, a method called `time` on a value.
        ("def f(now_s: float, clock) -> float:\n    return clock.monotonic() - now_s", []),
        ("import datetime\nd = datetime.timedelta(seconds=1)", []),
        ("def f(stats):\n    return stats.time", []),
    ],
)
def test_the_checker_finds_clock_reads(source, expected):
    assert impurities(source) == expected
