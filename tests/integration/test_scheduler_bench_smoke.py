"""The scheduler benchmark in miniature: both parts run end to end and write their report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_scheduler_bench_smoke(tmp_path):
    out = tmp_path / "scheduler.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scheduler_bench", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["smoke"] is True
    assert report["tick"]["programs"] == 500 and report["tick"]["replicas"] == 8
    assert report["tick"]["tick_ms"]["p50"] > 0 and report["tick"]["activity"]["paused"] > 0
    scaling = report["tick_scaling"]
    assert [run["programs"] for run in scaling["runs"]] == [200, 1000]
    assert all(run["p50_ms"] > 0 and run["p99_us_per_program"] > 0 for run in scaling["runs"])
    assert scaling["p50_growth"] > 0 and "tick scaling" in proc.stdout
    assert report["rpc"]["round_trips"] > 0 and report["rpc"]["replicas"] == 8
    assert report["rpc"]["held"] == 0 and report["rpc"]["pauses_total"] == 0
    assert "round trips/s" in proc.stdout
    recovery = report["recovery"]
    assert recovery["programs"] == 500 and recovery["sqlite"]["programs"] == 500
    assert 0 < recovery["sqlite"]["recovery_s"] and recovery["sqlite"]["paused"] > 0
    assert recovery["redis"] is None or recovery["redis"]["programs"] == 500
