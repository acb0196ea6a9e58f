"""Installing the project with `pip --target` into a fresh directory, and running Python from that install
alone: the wheel and image-install tests' shared steps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def pip_install_target(source: Path | str, target: Path, *extra: str, cwd: Path | None = None) -> Path:
    """`pip install --no-deps --target` of `source` (a wheel or a source tree); fails the test with pip's
    stderr when pip does."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", *extra, "--target"]
        + [str(target), str(source)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return target


def run_installed(target: Path, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Python with the install first on the path, from a directory outside the repository."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(target),
        "HOME": str(target.parent),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout_s, cwd=target.parent, env=env
    )
