"""The image's build stage, done without Docker: the build context filtered by .dockerignore, the
Dockerfile's COPY lines, `pip install --no-deps .` into a fresh directory, and then the services run
from that install alone (never from the working tree), as they do in the container.

This catches what the compose-equivalent run cannot, since that run uses the editable working tree:
a package or data file (the simulated workers' timing profiles) that the image would not contain.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.deploy.compose_harness import ROOT
from tests.deploy.installs import pip_install_target, run_installed
from tests.support.processes import python_module, start

pytestmark = pytest.mark.integration

SERVICES = ("capacity", "scheduler", "router", "planner", "simworker")


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    """.dockerignore matching, as far as this file uses it: a pattern names a path or any of its parents;
    `**/` matches any number of leading directories."""
    parts = relative.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        bare = pattern[3:] if pattern.startswith("**/") else None
        for candidate in candidates:
            if fnmatch.fnmatchcase(candidate, pattern):
                return True
            if bare is not None and fnmatch.fnmatchcase(candidate.rsplit("/", 1)[-1], bare):
                return True
    return False


def build_stage_copies() -> list[str]:
    """Sources of every `COPY` of the build stage (not `COPY --from`)."""
    text = (ROOT / "Dockerfile").read_text()
    build = text.split(" AS runtime")[0]
    sources: list[str] = []
    for line in re.findall(r"^COPY (?!--from)(.+)$", build, re.M):
        sources += line.split()[:-1]
    return sources


def build_context(into: Path) -> Path:
    """The files the build stage copies, after .dockerignore, laid out as its WORKDIR."""
    patterns = dockerignore_patterns()
    for source in build_stage_copies():
        path = ROOT / source
        assert path.exists(), f"the Dockerfile copies {source}, which does not exist"
        assert not ignored(source, patterns), f"the Dockerfile copies {source}, which .dockerignore leaves out"
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for file in files:
            relative = file.relative_to(ROOT).as_posix()
            if not ignored(relative, patterns):
                (into / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, into / relative)
    return into


def test_dockerignore_matching():
    patterns = [".git", "**/__pycache__", "bench/results", "*.sqlite3"]
    assert ignored("services/x/__pycache__/a.pyc", patterns)
    assert ignored("bench/results/r.json", patterns)
    assert ignored("planner.sqlite3", patterns)
    assert not ignored("bench/run.py", patterns)
    assert not ignored("services/common/serve/healthcheck.py", patterns)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("image")
    context = build_context(work / "src")
    target = work / "site"
    pip_install_target(context, target, "--no-build-isolation", cwd=work)
    return target


def test_the_install_holds_every_service_and_its_data(installed):
    code = "\n".join(
        [
            "import importlib, services, bandmaster",
            f"assert services.__file__.startswith({str(installed)!r}), services.__file__",
            *[f"importlib.import_module('services.{s}.__main__')" for s in SERVICES],
            "import services.common.serve.healthcheck",
            "from services.simworker.profiles import builtin_profiles",
            "assert 'glm45-fp8-h200' in builtin_profiles(), builtin_profiles()",
        ]
    )
    done = run_installed(installed, "-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (installed / "tests").exists(), "the tests are not part of the image"


def test_a_service_from_the_install_serves_and_passes_its_healthcheck(installed, tmp_path):
    ready = tmp_path / "ready.json"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(installed), "HOME": str(tmp_path)}
    with start(
        "simworker",
        python_module("services.simworker", "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready)),
        tmp_path,
        env=env,
        cwd=tmp_path,
        ready_file=ready,
    ).wait_ready(timeout_s=60) as worker:
        port = worker.ready["port"]
        probe = run_installed(installed, "-m", "services.common.serve.healthcheck", f"http://127.0.0.1:{port}/health")
        assert probe.returncode == 0, probe.stdout + probe.stderr
