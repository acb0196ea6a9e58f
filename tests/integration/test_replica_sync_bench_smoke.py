"""`python -m bench.replica_sync` in miniature: both arms run end to end and the report has their figures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_replica_sync_bench_smoke(tmp_path):
    out = tmp_path / "replica_sync.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.replica_sync",
            "--smoke",
            "--streams",
            "2",
            "--duration-s",
            "3",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    arms = json.loads(out.read_text())["arms"]
    assert [(a["streams"], a["sync"]) for a in arms] == [(2, False), (2, True)]
    for arm in arms:
        assert arm["turns"] > 0 and arm["failed_turns"] == 0 and arm["samples"] > 0
        assert 1.0 <= arm["max_over_mean_in_flight"]["mean"] <= 2.0
