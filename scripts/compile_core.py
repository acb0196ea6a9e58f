"""Compile the scheduler's pure core with mypyc, in place, next to its sources.

    python scripts/compile_core.py            # build if a source changed since the last build
    python scripts/compile_core.py --check    # exit 1, naming the modules, if the build is stale
    python scripts/compile_core.py --clean    # remove the compiled modules (the pure Python runs)
    python scripts/compile_core.py --require  # fail instead of falling back when there is no compiler

The modules (`services.scheduler.native.COMPILED_MODULES`) are the control tick's and the admission's
hot code: the program table, the control law, the pause policies. Compiled, the same Python runs as C
extension modules: the same decisions (tests/unit/scheduler/test_compiled_core.py holds the compiled
core to the pure one on the tick benchmark's mix, digest for digest) at about two thirds of the CPU
(docs/scheduler.md, "The compiled core"). The extension modules sit next to their sources, where
Python's import system prefers them to the .py, and the build records the sha256 of every source in
services/scheduler/core/compiled.json. `services.scheduler.native` compares them when the scheduler
package is imported and loads the pure Python instead of a stale build, so an edited source always
runs as edited; `make` rebuilds before the suite, the demo and the benchmarks.

Without a C compiler or Python's headers the build is skipped with a message and the pure Python
runs (about 1.4x the tick's CPU); `make system-deps` installs gcc where apt-get is available.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.scheduler.native import (  # noqa: E402  (the checkout's own, whatever the working directory)
    COMPILED_MODULES,
    GROUP,
    MANIFEST,
    ROOT,
    extension_path,
    extensions_present,
    group_library_path,
    manifest_now,
    source_path,
    stale_modules,
)


def _built() -> list[Path]:
    """Every artefact a build leaves in the tree (present or not), the manifest last."""
    return [extension_path(module) for module in COMPILED_MODULES] + [group_library_path(), MANIFEST]


def clean() -> None:
    """Remove every extension module of the core's packages (those of an earlier set of modules too)
    and the manifest."""
    for path in {*_built(), *extensions_present()}:
        path.unlink(missing_ok=True)


def _toolchain_missing() -> str | None:
    """Why a build cannot run here, or None."""
    include = sysconfig.get_paths().get("include", "")
    if not (Path(include) / "Python.h").exists():
        return f"Python's headers are not installed (no {include}/Python.h; Debian: python3-dev)"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None and shutil.which("cc") is None:
        return f"no C compiler ({compiler}; Debian: gcc)"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (it comes with mypy: pip install mypy)"
    return None


def build() -> None:
    """Compile COMPILED_MODULES into extension modules next to the sources, then write the manifest. The build
    runs in a subprocess whose working directory is the repository (mypyc names the modules by their
    paths) and whose build files go to a temporary directory."""
    clean()
    manifest = manifest_now()  # the sources as they are when the build starts
    sources = [str(source_path(module).relative_to(ROOT)) for module in COMPILED_MODULES]
    with tempfile.TemporaryDirectory(prefix="bandmaster-core-") as tmp:
        program = (
            "import sys\n"
            "from setuptools import Distribution\n"
            "from mypyc.build import mypycify\n"
            f"extensions = mypycify({sources!r}, opt_level='3', group_name={GROUP!r}, target_dir={tmp!r})\n"
            "dist = Distribution({'name': 'bandmaster-core', 'ext_modules': extensions,"
            " 'script_args': ['build_ext', '--inplace', '--build-temp', " + repr(tmp + "/temp") + "]})\n"
            "dist.parse_command_line()\n"
            "dist.run_commands()\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
    if done.returncode != 0:
        clean()
        raise SystemExit(f"compile_core: mypyc failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    missing = [str(path) for path in _built()[:-1] if not path.exists()]
    if missing:
        clean()
        raise SystemExit(f"compile_core: the build left out {', '.join(missing)}")
    if manifest_now() != manifest:
        clean()
        raise SystemExit("compile_core: a source changed during the build; run it again")
    MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if the compiled core is stale")
    mode.add_argument("--clean", action="store_true", help="remove the compiled modules")
    parser.add_argument("--require", action="store_true", help="fail when the toolchain is missing")
    args = parser.parse_args(argv)
    if args.clean:
        clean()
        print("compile_core: removed the compiled core; the pure Python runs")
        return 0
    stale = stale_modules()
    if args.check:
        if stale:
            print(f"compile_core: stale compiled modules: {', '.join(stale)} (run: python scripts/compile_core.py)")
            return 1
        print("compile_core: " + ("not compiled (pure Python)" if stale is None else "compiled core is current"))
        return 0
    if stale == []:
        print("compile_core: compiled core is current")
        return 0
    why = _toolchain_missing()
    if why is not None:
        clean()
        if args.require:
            print(f"compile_core: cannot compile the scheduler core: {why}", file=sys.stderr)
            return 1
        print(f"compile_core: {why}: the scheduler core runs as pure Python (about 1.4x the tick's CPU)")
        return 0
    build()
    print(f"compile_core: compiled {len(COMPILED_MODULES)} modules of the scheduler core (mypyc)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
