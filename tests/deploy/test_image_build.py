"""The image's build stage run as the Dockerfile writes it, without a container engine: its `RUN` lines in
order (a fresh virtualenv, the runtime lock with `--require-hashes`, then `pip install --no-deps .`) in the
build context that its `COPY` lines and .dockerignore make, with the image's prefix replaced by a
temporary one. Then the result is used as the container would be: from outside the repository, with
nothing but that virtualenv, `bandmaster up` starts a cluster and stops it cleanly.

test_image_install.py checks what the install carries, with the test venv's dependencies; this one checks
that requirements-runtime.lock alone is enough to run, and that no development tool comes with it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.deploy.compose_harness import ROOT
from tests.deploy.test_image_install import build_context
from tests.support.processes import session_clusters_dir

pytestmark = pytest.mark.integration
IMAGE_PREFIX = "/opt/bandmaster"
DEVELOPMENT_TOOLS = ("pytest", "mypy", "matplotlib", "ruff", "hypothesis")


def build_stage_runs() -> list[str]:
    """The build stage's `RUN` commands, continuation lines joined, in order."""
    build = (ROOT / "Dockerfile").read_text().split(" AS runtime")[0]
    joined = re.sub(r"\\\n\s*", " ", build)
    return [m.strip() for m in re.findall(r"^RUN (.+)$", joined, re.M)]


def test_the_build_stage_is_what_this_test_runs():
    runs = build_stage_runs()
    assert runs[0] == f"python -m venv {IMAGE_PREFIX}"
    assert any("--require-hashes -r requirements-runtime.lock" in run for run in runs)
    assert any(run.startswith("pip install --no-deps .") for run in runs)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build stage's virtualenv, built by its own RUN lines (pip's cache makes a re-run quick)."""
    work = tmp_path_factory.mktemp("image-build")
    context = build_context(work / "src")
    shutil.copy2(ROOT / "requirements-runtime.lock", context / "requirements-runtime.lock")
    prefix = work / "opt-bandmaster"
    env = {
        "PATH": f"{prefix}/bin:{os.environ.get('PATH', '')}",
        "HOME": os.environ.get("HOME", str(work)),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CACHE_DIR", "PIP_TRUSTED_HOST"):
        if key in os.environ:
            env[key] = os.environ[key]
    for run in build_stage_runs():
        # The image's `python` is its base Python; here, the interpreter of the tests' own base install.
        command = run.replace(IMAGE_PREFIX, str(prefix))
        if command.startswith("python -m venv"):
            command = command.replace("python", shlex.quote(base_python()), 1)
        done = subprocess.run(
            ["bash", "-c", command], cwd=context, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"RUN {run}\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
    return prefix


def base_python() -> str:
    """The interpreter the tests' venv was made from (a venv made from a venv would see its packages
    only with --system-site-packages, which the image does not use; this keeps the venv bare)."""
    return getattr(sys, "_base_executable", sys.executable)


def _env(prefix: Path, home: Path) -> dict[str, str]:
    return {
        "PATH": f"{prefix}/bin:/usr/bin:/bin",
        "HOME": str(home),
        "PYTHONDONTWRITEBYTECODE": "1",
        "BANDMASTER_CLUSTERS_DIR": session_clusters_dir(),
    }


def test_the_image_holds_the_product_and_no_development_tool(image, tmp_path):
    code = "\n".join(
        [
            "import importlib.util, services, clients, bandmaster",
            f"assert services.__file__.startswith({str(image)!r}), services.__file__",
            f"missing = [m for m in {DEVELOPMENT_TOOLS!r} if importlib.util.find_spec(m) is None]",
            f"assert missing == list({DEVELOPMENT_TOOLS!r}), 'development tools in the image: ' + str(missing)",
            "assert importlib.util.find_spec('harness') is None and importlib.util.find_spec('bench') is None",
            # The build stage compiled the scheduler core, and the image loads it (no compiler or mypy there).
            "from services.scheduler import native",
            "import services.scheduler.core as core",
            "assert native.describe() == 'compiled (mypyc)' and core.compiled(), native.describe()",
        ]
    )
    done = subprocess.run(
        [str(image / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=_env(image, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_bandmaster_up_runs_from_the_image_alone(image, tmp_path):
    """`bandmaster up` (the console script the image's venv holds) starts a whole cluster with a simulated
    worker from outside the repository, serves, and stops cleanly on SIGINT."""
    state = tmp_path / "state"
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [
            str(image / "bin" / "bandmaster"),
            "up",
            "--workers",
            "1",
            "--ports",
            "auto",
            "--name",
            f"image-{os.getpid()}",
            "--no-planner",
            "--state-dir",
            str(state),
        ],
        cwd=tmp_path,
        env=_env(image, tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        text = ""
        while time.monotonic() < deadline and up.poll() is None:
            text = (tmp_path / "up.log").read_text()
            if "Bandmaster is up" in text:
                break
            time.sleep(0.2)
        assert "Bandmaster is up" in text, text[-3000:]
        url = re.search(r"http://127\.0\.0\.1:\d+", text.split("Bandmaster is up", 1)[1])
        assert url is not None, text[-2000:]
        probe = subprocess.run(
            [str(image / "bin" / "python"), "-m", "services.common.serve.healthcheck", url.group(0) + "/health"],
            cwd=tmp_path,
            env=_env(image, tmp_path),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert probe.returncode == 0, probe.stdout + probe.stderr
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0, (tmp_path / "up.log").read_text()[-3000:]
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(timeout=10)
        log.close()
