"""Smoke run of bench/simworker_live.py (no performance assertions: the machine is shared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_live_bench_smoke(tmp_path):
    out = tmp_path / "simworker_live.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.simworker_live",
            "--smoke",
            "--duration-s",
            "1",
            "--clients",
            "4",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    result = report["result"]
    assert report["benchmark"] == "simworker_live" and report["smoke"] is True
    assert result["requests"] > 0 and result["errors"] == 0
    assert result["streamed_tokens"] == result["requests"] * result["max_tokens"]
    assert result["worker"]["steps"] > 0
    assert "requests/s" in done.stdout
