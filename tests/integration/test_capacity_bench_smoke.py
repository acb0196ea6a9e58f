"""`make bench-capacity` in miniature: the scale benchmark runs end to end and writes its report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_capacity_scale_smoke(tmp_path):
    out = tmp_path / "capacity_scale.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.capacity_scale", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["smoke"] is True
    assert report["recompute"]["workers"] == 50 and report["recompute"]["excluded_workers"] > 0
    assert report["fanout"]["watchers"] == 3 and report["fanout"]["snapshot_bytes"] > 0
    assert report["fanout"]["change_to_all_watchers_ms"]["p50"] > 0
    assert "change -> all 3 watchers" in proc.stdout
    loads = report["router_load_fanout"]
    assert loads["routers"] == 16 and loads["watchers"] == 3 and loads["table_bytes"] > 0
    assert loads["report_to_all_watchers_ms"]["p50"] > 0
