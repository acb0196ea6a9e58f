"""`bench.soak --quick`: programs in steady state through the full stack, none lost, every report field.
Nothing about memory growth or speed: a run of seconds on a shared machine is noise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import soak

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

REPORT_KEYS = {
    "benchmark",
    "quick",
    "config",
    "programs",
    "turns",
    "steps_per_min",
    "steady_steps_per_min",
    "programs_per_min",
    "turns_per_wall_min",
    "wall_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_max_s",
    "kv_hit_rate",
    "errors_by_kind",
    "scheduler",
    "services_exited",
    "service_log_problems",
    "memory",
    "machine",
    "targets",
    "timeline",
    "generated_at",
}
PROGRAM_KEYS = {
    "started",
    "completed",
    "lost",
    "lost_turn_failed",
    "lost_unfinished_after_drain",
    "running_at_deadline",
    "drain_s",
    "cancelled_at_drain",
}
SERVICE_KEYS = {
    "rss_warmup_kb",
    "rss_end_kb",
    "rss_after_drain_kb",
    "rss_max_kb",
    "growth_pct",
    "steady_slope_kb_per_min",
    "cpu_s",
    "growth_pct_from_warmup_fraction",
}
MACHINE_KEYS = {
    "cpus",
    "python",
    "platform",
    "loadavg",
    "cpu_busy",
    "late_fraction",
    "starved",
    "bench_client_cpu_s",
    "soak_cpu_share",
}


def test_soak_quick_loses_no_program_and_reports_every_field(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report) == REPORT_KEYS
    assert report["benchmark"] == "soak" and report["quick"] is True

    programs = report["programs"]
    assert set(programs) == PROGRAM_KEYS
    assert programs["lost"] == 0 and report["turns"]["failed"] == 0, (programs, report["errors_by_kind"])
    # Steady state: more programs ran than there are slots, so finished ones were replaced.
    assert programs["completed"] == programs["started"] > report["config"]["programs"]
    assert report["turns"]["ok"] > 0 and report["steps_per_min"] > 0 and report["steady_steps_per_min"] > 0
    assert report["services_exited"] == [] and report["errors_by_kind"] == {}
    assert report["scheduler"]["programs_active"] == 0 and report["scheduler"]["tickets_in_flight"] == 0

    names = {f"simworker-{i}" for i in range(report["config"]["workers"])} | {"capacity", "scheduler", "router"}
    services = report["memory"]["services"]
    assert set(services) == names
    for name, figures in services.items():
        assert set(figures) == SERVICE_KEYS, name
        assert 0 < figures["rss_warmup_kb"] <= figures["rss_max_kb"], (name, figures)
        assert 0 < figures["rss_end_kb"] <= figures["rss_max_kb"], (name, figures)
        assert figures["growth_pct"] is not None and figures["cpu_s"] > 0, (name, figures)
    assert set(report["machine"]) == MACHINE_KEYS

    timeline = report["timeline"]
    assert [row["phase"] for row in timeline][-1] == "after_drain"
    assert {"warmup", "steady", "drain"} <= {row["phase"] for row in timeline}
    assert all(set(row["rss_kb"]) == names for row in timeline)

    lost, memory = report["targets"]
    assert lost["name"] == "lost programs" and lost["status"] == "PASS" and lost["judged"] is True
    assert memory["status"] in ("PASS", "MISS") and memory["judged"] is False and memory["service"] in names
    assert "lost 0" in done.stdout


@pytest.mark.parametrize(
    "message, kind",
    [
        ("HTTP 429: too many programs", "http_429"),
        ("HTTP 503: no worker", "http_503"),
        ("finish_reason=abort", "finish_reason=abort"),
        ("no tokens", "no_tokens"),
        ("TimeoutError: ", "TimeoutError"),
        ("ClientPayloadError: Response payload is not completed", "ClientPayloadError"),
    ],
)
def test_error_kinds_are_short_labels(message, kind):
    assert soak.error_kind(message) == kind


def test_memory_growth_is_between_window_medians():
    # A transient peak inside a window does not move its median; growth is end / warm-up - 1.
    timeline = [
        {"t_s": t, "rss_kb": {"router": kb}}
        for t, kb in [(1, 90), (2, 100), (3, 500), (4, 100), (8, 110), (9, 110), (10, 900), (11, 120)]
    ]
    figures = soak.memory_figures(timeline, ["router"], warmup_s=4, end_s=10, window_s=3)["router"]
    assert figures == {
        "rss_warmup_kb": 100,
        "rss_end_kb": 110,
        "rss_after_drain_kb": 120,
        "rss_max_kb": 900,
        "growth_pct": 10.0,
        "steady_slope_kb_per_min": pytest.approx(5248.2, abs=0.1),
    }
    lost, growth = soak.targets(0, {"router": figures}, judge_memory=True)
    assert lost["status"] == "PASS" and growth["status"] == "MISS" and growth["service"] == "router"


def test_steady_slope_is_a_least_squares_fit_per_minute():
    climbing = [(t, 1000 + 2 * t) for t in range(0, 100, 5)]  # 2 kB/s
    assert soak.slope_kb_per_min(climbing, 20, 80) == 120.0
    assert soak.slope_kb_per_min(climbing, 20, 25) is None  # two samples: no slope


def test_a_service_without_samples_cannot_pass_the_memory_target():
    figures = soak.memory_figures([], ["scheduler"], warmup_s=4, end_s=10, window_s=3)
    assert figures["scheduler"]["growth_pct"] is None
    assert soak.targets(0, figures, judge_memory=True)[1]["status"] == "MISS"


def test_log_problems_counts_warnings_and_errors_and_keeps_a_few_examples():
    lines = [
        "2026-12-01 08:04:46,348 INFO services.router.server serving",
        "2026-12-01 08:04:47,001 WARNING services.router.control scheduler unreachable; failing open",
        "2026-12-01 08:04:48,001 WARNING services.router.control scheduler unreachable; failing open",
        "2026-12-01 08:04:49,001 ERROR services.router.turn.turns upstream reset",
        "Traceback (most recent call last):",
    ]
    assert soak.log_problems(lines) == {
        "warning": 2,
        "error": 1,
        "examples": [
            "WARNING services.router.control scheduler unreachable; failing open",
            "ERROR services.router.turn.turns upstream reset",
        ],
    }
    assert soak.log_problems(lines[:1]) == {}


def test_memory_is_judged_once_the_first_cohort_and_the_index_have_turned_over():
    """Regression (soak): judged from 20% of the run, the router's prefix index (TTL 120 s) was still filling
    and the scheduler still stepping up with the synchronised first programs' pause storm: +18% / +10.3%."""
    config = soak.SoakConfig(duration_s=600, ramp_s=10, window_s=30)
    assert soak.memory_warmup_end(config, 230.0, 120.0) == (230.0, "first_programs")
    assert soak.memory_warmup_end(config, 90.0, 120.0) == (130.0, "index_ttl")
    assert soak.memory_warmup_end(config, 90.0, 60.0) == (120.0, "warmup_fraction")
    assert soak.memory_warmup_end(config, None, 120.0) == (300.0, "capped")  # a slot never finished
    assert soak.memory_warmup_end(config, 450.0, 120.0) == (300.0, "capped")
