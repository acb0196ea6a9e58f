"""`python -m bench.planner_bench --smoke` runs end to end and writes its report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_planner_bench_smoke(tmp_path):
    out = tmp_path / "planner.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.planner_bench", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["core_tick"]["median_ms"] > 0
    process = report["process"]
    if "skipped" not in process:
        assert process["lease_publish_redis"]["count"] > 0 and process["last_plan"]["active_jobs"] == 50
