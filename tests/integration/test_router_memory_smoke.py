"""`bench.router_memory --quick`: a real router process holds hundreds of distinct programs, a steady run
churns and returns them, every turn and final answered, every report field. Nothing about the memory
figures themselves: a run of seconds on a shared machine is noise (the full run is marked slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

REPORT_KEYS = {
    "benchmark",
    "quick",
    "config",
    "flat_mib_per_min",
    "idle",
    "load",
    "steady",
    "release",
    "scheduler",
    "router_index_ttl_s",
    "cpu_s",
    "services_exited",
    "service_log_problems",
    "machine",
    "targets",
    "timeline",
    "generated_at",
}
TREND_KEYS = {
    "settle_s",
    "samples_settled",
    "rss_kb_slope_per_min",
    "rss_kb_median_first_half",
    "rss_kb_median_second_half",
    "rss_kb_band_settled",
    "rss_kb_max",
}


def _run(tmp_path: Path, *flags: str, timeout_s: float) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "router_memory.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.router_memory", *flags, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    return done, report


def test_router_memory_quick_answers_every_turn_and_reports_every_field(tmp_path):
    done, report = _run(tmp_path, "--quick", timeout_s=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert set(report) == REPORT_KEYS and report["benchmark"] == "router_memory" and report["quick"] is True
    config = report["config"]
    assert report["services_exited"] == []

    load = report["load"]
    assert load["turns_ok"] == config["programs"] * config["turns"] and load["turns_failed"] == 0, load
    assert load["finals_ok"] == 0  # the programs stay open
    assert load["rss_kb"]["router"] > 0 and load["router_kb_per_10k_programs"] is not None
    assert load["router_cpu_ms_per_turn"] > 0 and load["turns_per_s"] > 0

    steady = report["steady"]
    assert steady["turns_failed"] == 0 and steady["finals_failed"] == 0, steady["errors_by_kind"]
    assert steady["churn"] > 0 and steady["returning"] > 0 and steady["new_programs"] == steady["churn"]
    assert steady["finals_ok"] == steady["churn"] and steady["open_programs"] == config["programs"]
    assert steady["turns_ok"] == steady["churn"] * config["turns"] + steady["returning"]
    for name in ("router", "scheduler"):
        trend = steady["trend"][name]
        assert set(trend) == TREND_KEYS, name
        assert trend["samples_settled"] >= 3 and trend["rss_kb_slope_per_min"] is not None, (name, trend)

    release = report["release"]
    assert release["finals_ok"] == release["programs"] == config["programs"] and release["finals_failed"] == 0
    # Every program the run opened ended at the scheduler: its table is empty again.
    assert report["scheduler"]["programs_active"] == 0 and report["scheduler"]["tickets_in_flight"] == 0

    phases = [row["phase"] for row in report["timeline"]]
    assert {"idle", "load", "loaded", "steady", "release"} <= set(phases)
    assert all({"router", "scheduler", "capacity"} <= set(row["rss_kb"]) for row in report["timeline"])
    assert report["machine"]["loadavg_start"] is not None and report["idle"]["loadavg"] is not None

    lost, held, per_10k, router_flat, scheduler_flat = report["targets"]
    assert lost["status"] == "PASS" and lost["judged"] is True
    # The open programs stayed open (at the scheduler, hence in the router) through the load and the steady run.
    assert held["status"] == "PASS" and held["value"] == [config["programs"]] * 2
    assert load["scheduler_programs_active"] == steady["scheduler_programs_active"] == config["programs"]
    assert per_10k["status"] == "REPORTED" and per_10k["value_mib"] is not None
    assert router_flat["judged"] is False and scheduler_flat["judged"] is False
    assert "MiB per 10,000 programs" in done.stdout


def test_invalid_flags_exit_2(tmp_path):
    done, report = _run(tmp_path, "--quick", "--new-share", "2", timeout_s=60)
    assert done.returncode == 2 and report == {} and "new_share" in done.stderr


@pytest.mark.slow
def test_router_memory_full_run_is_flat(tmp_path):
    """What `make bench-router-memory` runs: 10,000 programs, then 10 minutes of churn; router and
    scheduler RSS flat."""
    done, report = _run(tmp_path, timeout_s=1800)
    assert done.returncode == 0, done.stdout[-5000:]
    assert all(t["status"] in ("PASS", "REPORTED") for t in report["targets"]), report["targets"]
