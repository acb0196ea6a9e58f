"""`bandmaster demo` as a user starts it: both arms on fresh real clusters, one table, the ratio."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_both_arms_and_prints_the_ratio(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "demo", "--programs", "2", "--max-turns", "2", "--speedup", "50"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "[Bandmaster] cluster stopped." in out and "[KV routing only] cluster stopped." in out
    assert "ratio" in out and "the steps per minute of KV-aware routing alone" in out
    assert "The offline simulator predicts" in out
    # Both clusters' temporary state dirs went with them.
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("bandmaster-")]
