"""Every `services/<svc>/core/` reads no clock, runs nothing concurrently and touches no file: the clock is
passed in, and what a file holds is read by the shell and handed to the core as data.

import-linter (`make lint`, contract (b)) keeps I/O and transport modules out of the cores; this test covers what
an import graph cannot see: a clock read (`time.monotonic()`, `datetime.now()`), `asyncio` / `threading` use, and
file I/O through builtins and the standard library (`open()`, `Path.read_text()`, `json.load(f)`, `os`, `pathlib`,
`importlib.resources`, ...).
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
# Modules whose use is file system (or process environment) access; a core has no reason to import them.
FILE_MODULES = frozenset({"os", "pathlib", "shutil", "tempfile", "glob", "fileinput", "pkgutil", "io", "codecs"})
FILE_SUBMODULES = frozenset({"importlib.resources", "importlib.abc", "importlib.metadata"})
# Calls that read or write a file whatever they are called on (Path and Traversable methods)...
FILE_METHODS = frozenset(
    {"read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "rglob", "mkdir", "unlink", "rmdir", "touch"}
)
# ... and module functions that take an open file (`json.loads(text)` of data handed in is fine).
FILE_FUNCTIONS = frozenset(
    {"json.load", "json.dump", "tomllib.load", "pickle.load", "pickle.dump", "marshal.load", "marshal.dump"}
)
FILE_BUILTINS = frozenset({"open"})


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
    """What in `source` reads a clock, uses asyncio/threading or does file I/O, as `line: what`."""
    tree = ast.parse(source)
    time_aliases = set()  # names bound to the time module
    datetime_names = set()  # names bound to datetime.datetime / datetime.date or the datetime module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in CONCURRENCY_MODULES or root in FILE_MODULES or _file_submodule(alias.name):
                    found.append(f"{node.lineno}: import {alias.name}")
                if alias.name == "time":
                    time_aliases.add(alias.asname or "time")
                if alias.name == "datetime":
                    datetime_names.add(alias.asname or "datetime")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] in CONCURRENCY_MODULES | FILE_MODULES or _file_submodule(module):
                found.append(f"{node.lineno}: from {module} import ...")
            elif any(_file_submodule(f"{module}.{alias.name}") for alias in node.names):
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
        if isinstance(node, ast.Call):
            called = _dotted(node.func)
            if called in FILE_BUILTINS or called in FILE_FUNCTIONS:
                found.append(f"{node.lineno}: {called}()")
            elif isinstance(node.func, ast.Attribute) and node.func.attr in FILE_METHODS:
                found.append(f"{node.lineno}: .{node.func.attr}()")
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


def _file_submodule(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in FILE_SUBMODULES)


def test_there_are_cores_to_check():
    services = {p.relative_to(ROOT).parts[1] for p in CORE_FILES}
    assert {"capacity", "scheduler", "router", "planner", "batch", "simworker"} <= services


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(ROOT / "services")))
def test_core_reads_no_clock_runs_nothing_concurrently_and_touches_no_file(path):
    assert impurities(path.read_text()) == [], (
        f"{path.relative_to(ROOT)}: take the time as an argument; read files in the shell and pass the data in"
    )


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
        # File I/O: builtins, Path / Traversable methods, loaders taking a file, file-system modules.
        ("with open('p.json') as f:\n    pass", ["1: open()"]),
        ("def f(path):\n    return path.read_text()", ["2: .read_text()"]),
        ("def f(path, b):\n    path.write_bytes(b)", ["2: .write_bytes()"]),
        ("def f(folder):\n    return list(folder.iterdir())", ["2: .iterdir()"]),
        ("import json\ndef f(fh):\n    return json.load(fh)", ["3: json.load()"]),
        ("import tomllib\ndef f(fh):\n    return tomllib.load(fh)", ["3: tomllib.load()"]),
        ("import os\n", ["1: import os"]),
        ("import os.path\n", ["1: import os.path"]),
        ("from pathlib import Path\n", ["1: from pathlib import ..."]),
        ("from importlib import resources\n", ["1: from importlib import ..."]),
        ("import importlib.resources\n", ["1: import importlib.resources"]),
        ("from importlib.resources import files\n", ["1: from importlib.resources import ..."]),
        ("import io\n", ["1: import io"]),
        # Allowed: parsing text handed in, a method of the core's own named `open`, importlib's other parts.
        ("import json, tomllib\ndef f(text):\n    return json.loads(text), tomllib.loads(text)", []),
        ("def f(limits, conn):\n    return limits.open(conn, 'client', 0.0)", []),
        ("class L:\n    def open(self, conn):\n        return conn", []),
        ("from importlib import import_module\n", []),
    ],
)
def test_the_checker_finds_clock_reads_and_file_io(source, expected):
    assert impurities(source) == expected
