"""The product apart from its workshop: the wheel `pip install .` builds carries the services, the CLI with its
local-cluster launcher, the clients and the generated protobuf package, and none of the development tools
(the simulator in harness/, the benchmarks in bench/, tests/, scripts/).

The wheel is built from a copy of the tree (setuptools writes build/ and *.egg-info next to the sources), installed
with `pip install --no-deps --target` into a fresh directory, and the documented commands' parsers are run from that
install alone with harness and bench made unimportable, as they are in a runtime install (the test venv's editable
install would otherwise find them in a checkout).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deploy.compose_harness import ROOT
from tests.deploy.installs import pip_install_target, run_installed

pytestmark = pytest.mark.integration

# What setuptools' package discovery sees at the top of the tree: the product and the workshop both.
TREE = ("pyproject.toml", "README.md", "services", "clients", "bandmaster", "harness", "bench", "tests", "scripts")
WORKSHOP = ("harness", "bench", "tests", "scripts")
COMMANDS = ("up", "status", "programs", "plan", "trace", "bench", "demo")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    for name in TREE:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "results", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    out = work / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), "."],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=src,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = out.glob("bandmaster-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path) -> Path:
    return pip_install_target(wheel, wheel.parent.parent / "site")


def test_the_wheel_carries_the_product_and_no_development_tool(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"services", "clients", "bandmaster"}, tops
    assert not [n for n in names if n.split("/", 1)[0] in WORKSHOP]
    # The launcher `bandmaster up` uses, the player `bandmaster bench` plays, and their data.
    for needed in (
        "services/launcher/cluster.py",
        "services/launcher/supervisor.py",
        "clients/player.py",
        "clients/workloads/data/swe_agent_programs.jsonl.gz",
        "services/cli/__init__.py",
    ):
        assert needed in names, needed
    assert any(n.startswith("services/simworker/core/profiles/") and n.endswith(".json") for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "bandmaster = services.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


# Runs `bandmaster <command> --help` from the install with harness and bench unimportable, then reports any module
# imported from outside the install for the product's packages.
PROBE = """
import importlib.abc, runpy, sys
class NoWorkshop(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("harness", "bench"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoWorkshop())
sys.argv = ["bandmaster", *sys.argv[1:]]
try:
    runpy.run_module("services.cli", run_name="__main__")
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
outside = [
    m for m, mod in list(sys.modules.items())
    if m.split(".")[0] in ("services", "clients") and getattr(mod, "__file__", None)
    and not mod.__file__.startswith(INSTALL)
]
assert not outside, outside
"""


@pytest.mark.parametrize("command", COMMANDS)
def test_every_documented_command_runs_from_the_install_without_the_workshop(installed, command):
    code = f"INSTALL = {str(installed)!r}\n" + PROBE
    done = run_installed(installed, "-c", code, command, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: bandmaster" in done.stdout
