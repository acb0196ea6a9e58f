"""`bench.compare` end to end, small: every simulated arm on both workloads, and a live run of the
Bandmaster and KV-aware arms, each followed by the report. Shapes and errors only, never speed."""

from __future__ import annotations

import json

import pytest

from bench import compare
from services.scheduler.core.policies import PAUSE_POLICIES

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path) -> None:
    assert path.exists(), path
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000, path


def _assert_sweep(sweep: dict, mode: str, arms: list[str], points: int) -> None:
    assert sweep["mode"] == mode
    assert sweep["arms"] == arms
    spec = sweep["spec"]
    assert spec["fits_programs"] > 0 and spec["mean_context_tokens"] > 0
    assert len(sweep["points"]) == points
    for point in sweep["points"]:
        assert point["oversubscription"] == pytest.approx(point["parallel"] / spec["fits_programs"], abs=0.01)
        assert sorted(point["arms"]) == sorted(arms)
        for arm, row in point["arms"].items():
            assert "error" not in row, (arm, row)
            summary = row["summary"]
            assert summary["turns_failed"] == 0 and summary["turns_ok"] > 0, (arm, summary)
            assert summary["programs_done"] == point["programs"], (arm, summary)
            assert summary["steps_per_min"] > 0 and 0 <= summary["kv_hit_rate"] <= 1
            if arm.startswith("bandmaster-"):
                assert "pauses" in row["scheduler"]


def test_full_specs_span_below_saturation_to_about_4x():
    for spec in (*compare.SIM_SPECS.values(), compare.LIVE_SPECS["short"]):
        factors = spec.describe()["oversubscription"]
        assert factors[0] < 1.0 and 2.5 <= factors[-1] <= 4.5, (spec.workload, factors)
    # The live long-context sweep tests memory pressure only: 3x and 4x, at real token counts.
    assert [round(f) for f in compare.LIVE_SPECS["swe"].describe()["oversubscription"]] == [3, 4]
    # The published short-context scenario is one point of the sim sweep: 2 x 16K, 32 x 8 turns, ~3x.
    short = compare.SIM_SPECS["short"]
    assert (short.workers, short.worker_kv_tokens, short.max_turns) == (2, 16_384, 8) and 32 in short.parallel


def test_sim_smoke_every_arm_both_workloads(tmp_path):
    assert compare.main(["--mode", "sim", "--workload", "both", "--smoke", "--out-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    arms = ["round_robin", "kv", "thunderagent", "continuum", "oracle", *[f"bandmaster-{p}" for p in PAUSE_POLICIES]]
    assert [s["workload"] for s in results["sweeps"]] == ["swe", "short"]
    for sweep in results["sweeps"]:
        _assert_sweep(sweep, "sim", arms, points=2)
        for point in sweep["points"]:
            assert point["ratio_to_oracle"]["oracle"] == 1.0 and set(point["ratio_to_oracle"]) == set(arms)
        for point in sweep["points"]:
            timeline = point["arms"]["bandmaster-threshold"]["timeline"]
            assert {"bands", "columns", "workers", "control_events"} <= set(timeline)
        for kind in ("steps", "kv_hit", "timeline"):
            _assert_png(tmp_path / f"sim_{sweep['workload']}_{kind}.png")
    summary = (tmp_path / "summary.md").read_text()
    assert "## Targets" in summary and "| bandmaster-threshold |" in summary
    assert "ratio to the oracle" in summary
    targets = json.loads((tmp_path / "targets.json").read_text())
    assert targets and {t["status"] for t in targets} <= {"PASS", "MISS", "N/A"}


def test_live_smoke_bandmaster_and_kv(tmp_path):
    argv = [
        "--mode",
        "live",
        "--workload",
        "short",
        "--smoke",
        "--arms",
        "kv,bandmaster",
        "--pause-policy",
        "threshold",
        "--breakdown",
        "--out-dir",
        str(tmp_path),
    ]
    assert compare.main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    sweep, twin = results["sweeps"]
    _assert_sweep(sweep, "live", ["kv", "bandmaster-threshold"], points=1)
    # The simulator at the same point: the reference of the live-ratio check, and the oracle there.
    _assert_sweep(twin, "live-sim", ["kv", "bandmaster-threshold", "oracle"], points=1)
    # Every live run reports how far its simulated workers fell behind their clock.
    for row in sweep["points"][0]["arms"].values():
        assert row["lateness"]["late_fraction"] is not None and row["lateness"]["wall_s"] > 0
    # --breakdown: each live run's turns joined from its services' spans, and the simulator's model of them.
    for arm in ("kv", "bandmaster-threshold"):
        live, sim = sweep["points"][0]["arms"][arm]["turn_phases"], twin["points"][0]["arms"][arm]["turn_phases"]
        assert live["source"] == "live" and live["turns"] > 0 and "prefill" in live["phases"], arm
        assert sim["source"] == "sim" and sim["turns"] > 0, (arm, sim["turns"], live["turns"])
    assert "Where a turn's time went" in (tmp_path / "summary.md").read_text()
    _assert_png(tmp_path / "live_short_steps.png")
    _assert_png(tmp_path / "live_short_kv_hit.png")
    assert "## live: short-context tool agents" in (tmp_path / "summary.md").read_text()
    targets = json.loads((tmp_path / "targets.json").read_text())
    (check,) = [t for t in targets if t["name"].startswith("live ratio to kv")]
    assert check["status"] in ("PASS", "MISS") and check["value"] is not None


@pytest.mark.slow
def test_live_full_sweep(tmp_path):
    """The full live sweep (`make bench` runs it too): ~15 minutes, every arm incl. sglang-router."""
    assert compare.main(["--mode", "live", "--workload", "both", "--out-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    live = [s for s in results["sweeps"] if s["mode"] == "live"]
    assert [s["workload"] for s in live] == ["swe", "short"]
    arms = [
        "round_robin",
        "kv",
        "sglang_cache_aware",
        "thunderagent",
        "continuum",
        *[f"bandmaster-{p}" for p in PAUSE_POLICIES],
    ]
    for sweep in live:
        _assert_sweep(sweep, "live", arms, points=len(compare.LIVE_SPECS[sweep["workload"]].parallel))
