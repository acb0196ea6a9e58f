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
    # The tick under the service's policy first (the headline figures), then the reference's.
    assert [run["pause_policy"] for run in report["tick_runs"]] == ["cost_aware", "threshold"]
    assert report["tick"] == report["tick_runs"][0]["tick"] and report["tick"]["pause_policy"] == "cost_aware"
    assert report["tick"]["acting_decay_tau_seconds"] == 1.0  # the service's default
    for run in report["tick_runs"]:
        tick = run["tick"]
        assert tick["pause_policy"] == run["pause_policy"] == run["tick_scaling"]["pause_policy"]
        assert tick["programs"] == 500 and tick["replicas"] == 8
        assert tick["tick_ms"]["p50"] > 0 and tick["activity"]["paused"] > 0
        scaling = run["tick_scaling"]
        assert [r["programs"] for r in scaling["runs"]] == [200, 1000]
        assert all(r["p50_ms"] > 0 and r["p99_us_per_program"] > 0 for r in scaling["runs"])
        assert scaling["p50_growth"] > 0 and f"tick scaling, {run['pause_policy']}" in proc.stdout
    assert report["rpc"]["round_trips"] > 0 and report["rpc"]["replicas"] == 8
    assert report["rpc"]["held"] == 0 and report["rpc"]["pauses_total"] == 0
    assert "round trips/s" in proc.stdout
    rpc = report["rpc"]
    assert rpc["caller_processes"] == 2 and rpc["errors"] == 0
    assert rpc["scheduler_cpu"]["us_per_round_trip"] > 0 and rpc["scheduler_rss_kb"] > 0
    memory = rpc["memory"]
    assert memory["programs"] >= 300 and memory["load_errors"] == 0
    assert memory["loaded_rss_kb"] >= memory["idle_rss_kb"] > 0 and "rss_kb_per_10k_programs" in memory
    assert memory["soak"]["round_trips"] > 0 and len(memory["soak"]["samples"]) >= 2
    assert "RSS MiB per 10,000 programs" in proc.stdout
    router_state = report["router_state"]
    assert router_state["programs"] == 300 and router_state["programs_kept"]["admission_cache"] == 300
    assert all(size > 0 for size in router_state["bytes_per_10k_programs"].values())
    recovery = report["recovery"]
    assert recovery["programs"] == 500 and recovery["sqlite"]["programs"] == 500
    assert 0 < recovery["sqlite"]["recovery_s"] and recovery["sqlite"]["paused"] > 0
    assert recovery["redis"] is None or recovery["redis"]["programs"] == 500
