"""Which scheduler core runs: the compiled one (mypyc extension modules built next to the sources by
`scripts/compile_core.py`) or the pure Python.

Python's import system prefers an extension module to the .py beside it, so a compiled module whose
source has changed since the build would silently run the old code. `select`, called when the
package `services.scheduler` is imported (before anything imports the core), compares the sources
with the manifest the build wrote (the sha256 of each) and, when any differs, or when
BANDMASTER_PURE_CORE is set, makes every compiled module load from its .py instead (all of them:
compiled modules call each other directly, so they are never mixed with pure ones). `describe` says
which core runs and why; the scheduler logs it at start-up and the benchmarks report it.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent.parent
CORE_PACKAGE = "services.scheduler.core"
COMPILED_MODULES = (
    f"{CORE_PACKAGE}.model",
    f"{CORE_PACKAGE}.accounting",
    f"{CORE_PACKAGE}.control",
    f"{CORE_PACKAGE}.scheduler",
    f"{CORE_PACKAGE}.policies.threshold",
    f"{CORE_PACKAGE}.policies.cost_aware",
    f"{CORE_PACKAGE}.policies.context",
)
"""The control tick's and the admission's hot code: the program table, the control law, the policies.
Not `params`: `ControlParams` travels to the simulator's and the benchmarks' worker processes, and a
compiled frozen dataclass cannot be unpickled (nor deep-copied)."""
GROUP = "services.scheduler.core.native"
"""mypyc's shared library of the group, the module `services.scheduler.core.native__mypyc` (inside the
package, so that a wheel's package data carries it)."""
MANIFEST = ROOT / "services" / "scheduler" / "core" / "compiled.json"
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
PURE_ENV = "BANDMASTER_PURE_CORE"


def source_path(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def extension_path(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + EXT_SUFFIX)


def group_library_path() -> Path:
    return ROOT / (GROUP.replace(".", "/") + "__mypyc" + EXT_SUFFIX)


def manifest_now() -> dict:
    """What a build of the sources as they are would record."""
    return {
        "python": sys.implementation.cache_tag,
        "ext_suffix": EXT_SUFFIX,
        "sources": {
            module: hashlib.sha256(source_path(module).read_bytes()).hexdigest() for module in COMPILED_MODULES
        },
    }


def extensions_present() -> list[Path]:
    """Every extension module in the core's package directories (a build's, current or not)."""
    core = ROOT / CORE_PACKAGE.replace(".", "/")
    return sorted(core.rglob("*" + EXT_SUFFIX))


def stale_modules() -> list[str] | None:
    """None when no module is compiled; else the modules whose compiled form does not match their
    source (empty: the build is current). A build of another set of modules (one left out since, say)
    is stale whole: its extension of a module no longer compiled would still load."""
    present = extensions_present()
    if not present:
        return None
    try:
        recorded = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return list(COMPILED_MODULES)
    now = manifest_now()
    if recorded.get("python") != now["python"] or recorded.get("ext_suffix") != now["ext_suffix"]:
        return list(COMPILED_MODULES)
    sources = recorded.get("sources", {})
    expected = {extension_path(module) for module in COMPILED_MODULES} | {group_library_path()}
    if set(sources) != set(now["sources"]) or set(present) - expected:
        return list(COMPILED_MODULES)
    return [
        module
        for module in COMPILED_MODULES
        if sources.get(module) != now["sources"][module] or not extension_path(module).exists()
    ] + ([] if group_library_path().exists() else [GROUP + "__mypyc"])


class _FromSource(importlib.abc.MetaPathFinder):
    """Loads every module of the core's packages from its .py file: the compiled modules, and any
    extension module an earlier build left beside a source."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(CORE_PACKAGE + "."):
            return None
        source = source_path(fullname)
        if not source.is_file():
            return None  # a package (its __init__.py, never compiled) or nothing: the usual finders
        return importlib.util.spec_from_file_location(fullname, source)


class _Selected:
    reason: str | None = None  # None: not selected yet


def select() -> None:
    """Decide, once per process, whether the compiled modules may load (see the module docstring)."""
    if _Selected.reason is not None:
        return
    if os.environ.get(PURE_ENV, "").strip().lower() in ("1", "true", "yes"):
        reason = f"pure Python ({PURE_ENV} is set)"
    else:
        try:
            stale = stale_modules()
        except OSError as exc:  # a source unreadable: the build cannot be trusted
            stale = [f"{exc}"]
        if stale is None:
            reason = "pure Python (not compiled: python scripts/compile_core.py builds it)"
        elif stale:
            reason = (
                f"pure Python (the compiled core is older than its sources: {', '.join(stale)}; "
                "python scripts/compile_core.py rebuilds it)"
            )
        else:
            _Selected.reason = "compiled (mypyc)"
            return
    if not any(isinstance(finder, _FromSource) for finder in sys.meta_path):
        sys.meta_path.insert(0, _FromSource())
    _Selected.reason = reason


def describe() -> str:
    """Which core this process runs, and why."""
    select()
    assert _Selected.reason is not None
    loaded = sys.modules.get(COMPILED_MODULES[0])
    if _Selected.reason.startswith("compiled") and loaded is not None and str(loaded.__file__).endswith(".py"):
        return "pure Python (the compiled modules did not load)"
    return _Selected.reason
