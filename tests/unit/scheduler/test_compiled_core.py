"""The compiled scheduler core (scripts/compile_core.py) decides exactly as the pure Python one, and
a compiled core that no longer matches its sources never runs (services/scheduler/native.py)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys

import pytest

from bench.scheduler_bench import bench_tick
from services.scheduler import native
from services.scheduler.core import compiled
from services.scheduler.core.defaults import service_control_params
from services.scheduler.core.policies import CostAwarePauseParams, ThresholdPauseParams


def _pure_run(programs: int, replicas: int, ticks: int, policy: str, seed: int) -> dict:
    program = (
        "import json\n"
        "from bench.scheduler_bench import bench_tick\n"
        "from services.scheduler.core import compiled\n"
        f"run = bench_tick({programs}, {replicas}, {ticks}, seed={seed}, pause_policy={policy!r})\n"
        "print(json.dumps({'compiled': compiled(), 'run': run}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, native.PURE_ENV: "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["compiled"] is False
    return out["run"]


@pytest.mark.skipif(not compiled(), reason="the compiled core is not built here (python scripts/compile_core.py)")
@pytest.mark.parametrize(
    ("programs", "replicas", "ticks", "policy", "seed"),
    [(2_000, 16, 10, "cost_aware", 7), (2_000, 16, 10, "threshold", 8), (600, 4, 12, "cost_aware", 9)],
)
def test_the_compiled_core_decides_as_the_pure_one(programs: int, replicas: int, ticks: int, policy: str, seed: int):
    """Every tick's events, log lines and resolutions (the benchmark's digest), its pauses, resumes and
    marks, and the table's totals at the end, on the tick benchmark's mix: admissions, completions,
    pauses, marks, resumes and soft demotes on both policies."""
    here = bench_tick(programs, replicas, ticks, seed=seed, pause_policy=policy)
    pure = _pure_run(programs, replicas, ticks, policy, seed)
    assert here["scheduler_core"] == "compiled" and pure["scheduler_core"] == "pure Python"
    assert here["decisions_sha256"] == pure["decisions_sha256"]
    assert here["pauses_resumes_marks_per_tick"] == pure["pauses_resumes_marks_per_tick"]
    assert here["activity"] == pure["activity"]
    assert sum(map(sum, here["pauses_resumes_marks_per_tick"])) > 0  # the mix exercised the control law


def test_the_parameters_that_travel_to_worker_processes_pickle():
    """The simulator's and the benchmarks' process pools (bench.evaluate, bench.compare, bench.sim_scale)
    send the control law's and the policies' parameters to their workers: those classes stay Python
    (a compiled frozen dataclass cannot be unpickled), whichever core runs."""
    for params in (
        service_control_params("cost_aware", scheduler_interval_seconds=2.0),
        CostAwarePauseParams(min_hold_fraction=0.5),
        ThresholdPauseParams(mark_all_reasoning=True),
    ):
        assert pickle.loads(pickle.dumps(params)) == params
        assert copy.deepcopy(params) == params
    assert "services.scheduler.core.params" not in native.COMPILED_MODULES


def test_the_build_runs_when_it_matches_its_sources():
    stale = native.stale_modules()
    if stale is None:
        assert native.describe().startswith("pure Python (not compiled")
    elif stale:
        assert native.describe().startswith("pure Python (the compiled core is older than its sources")
        assert not compiled()
    else:
        assert native.describe() == "compiled (mypyc)" and compiled()


def test_a_source_that_changed_since_the_build_makes_every_module_stale_or_one(tmp_path, monkeypatch):
    """The manifest is compared source by source; a build for another interpreter is stale whole."""
    if native.stale_modules() is None:
        pytest.skip("nothing is compiled here")
    recorded = native.manifest_now()
    manifest = tmp_path / "compiled.json"
    monkeypatch.setattr(native, "MANIFEST", manifest)
    manifest.write_text(json.dumps(recorded))
    assert native.stale_modules() == []
    changed = dict(recorded, sources=dict(recorded["sources"]))
    changed["sources"][native.COMPILED_MODULES[2]] = "0" * 64
    manifest.write_text(json.dumps(changed))
    assert native.stale_modules() == [native.COMPILED_MODULES[2]]
    manifest.write_text(json.dumps(dict(recorded, python="cpython-399")))
    assert native.stale_modules() == list(native.COMPILED_MODULES)
    manifest.write_text("not json")
    assert native.stale_modules() == list(native.COMPILED_MODULES)
    # An extension module of a module no longer compiled (left by an earlier build) would still load.
    manifest.write_text(json.dumps(recorded))
    present = native.extensions_present()
    monkeypatch.setattr(
        native, "extensions_present", lambda: [*present, native.extension_path("services.scheduler.core.params")]
    )
    assert native.stale_modules() == list(native.COMPILED_MODULES)


@pytest.mark.parametrize("env", [{native.PURE_ENV: "1"}, {}])
def test_a_stale_or_unwanted_build_loads_every_module_from_source(tmp_path, env: dict):
    """In a fresh process: with BANDMASTER_PURE_CORE, or with the manifest saying a source changed,
    every compiled module loads from its .py (never a mix), and `describe` says why."""
    if native.stale_modules() is None:
        pytest.skip("nothing is compiled here")
    program = (
        "import json, sys\n"
        "from services.scheduler import native\n"
        "import services.scheduler.core as core\n"
        "files = [sys.modules[m].__file__ for m in native.COMPILED_MODULES]\n"
        "params = sys.modules['services.scheduler.core.params'].__file__\n"
        "out = {'files': files, 'params': params, 'describe': native.describe(), 'compiled': core.compiled()}\n"
        "print(json.dumps(out))\n"
    )
    if not env:
        # The manifest copied aside with one source's hash changed, and the package pointed at it before it
        # selects: what an edit of that source after the build looks like.
        recorded = native.manifest_now()
        recorded["sources"][native.COMPILED_MODULES[0]] = "0" * 64
        manifest = tmp_path / "compiled.json"
        manifest.write_text(json.dumps(recorded))
        program = (
            "import services.scheduler.native as native\n"
            f"native.MANIFEST = __import__('pathlib').Path({str(manifest)!r})\n"
            "native._Selected.reason = None\n"
            "native.select()\n"
        ) + program
    done = subprocess.run(
        [sys.executable, "-c", program],
        env={**{k: v for k, v in os.environ.items() if k != native.PURE_ENV}, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(f.endswith(".py") for f in out["files"]), out["files"]
    assert out["params"].endswith(".py")  # every module of the core's packages, not only the compiled ones
    assert out["compiled"] is False
    assert out["describe"].startswith(
        "pure Python (" + ("BANDMASTER_PURE_CORE" if env else "the compiled core is older")
    )
