"""bench.tick_lockstep: two trees' ticks in turn, paired, and their decisions held alike."""

from __future__ import annotations

from pathlib import Path

from bench.tick_lockstep import drive

ROOT = Path(__file__).resolve().parents[3]


def test_two_runs_of_one_tree_tick_in_turn_and_decide_alike():
    report = drive([("a", ROOT), ("b", ROOT)], programs=200, replicas=8, ticks=3, pause_policy="threshold")
    assert report["programs"] == 200 and report["ticks"] == 3
    assert len(report["pauses_resumes_marks_per_tick"]) == 3
    for name in ("a", "b"):
        assert report[name]["cpu_ms"]["p50"] > 0 and report[name]["wall_ms"]["p99"] > 0
    assert report["a"]["cpu_ratio_to_a"] == 1.0 and report["b"]["cpu_ratio_to_a"] > 0
