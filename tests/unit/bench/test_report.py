"""bench/report.py: the targets as tables of made-up sweeps, the markdown, and the PNGs' existence."""

from __future__ import annotations

import pytest

from bench import report
from harness.simlib.simulator import TIMELINE_COLUMNS

BM = "bandmaster-threshold"


def _row(steps: float, hit: float = 0.9, ttft: float = 0.5, **extra) -> dict:
    return {
        "summary": {"steps_per_min": steps, "kv_hit_rate": hit, "ttft_p90_s": ttft, "turns_failed": 0},
        "scheduler": {"pauses": 3},
        **extra,
    }


def _sweep(workload: str, mode: str, points: list[tuple[int, float, dict]], fits: float = 10.0) -> dict:
    arms = list(dict.fromkeys(arm for _, _, rows in points for arm in rows))
    return {
        "mode": mode,
        "workload": workload,
        "arms": arms,
        "spec": {
            "workers": 2,
            "worker_kv_tokens": 16_384,
            "max_turns": 8,
            "token_scale": 1.0,
            "speedup": 4.0,
            "fits_programs": fits,
            "mean_context_tokens": 3_000.0,
            "pool_tokens": 32_768,
        },
        "points": [{"parallel": p, "programs": p, "oversubscription": o, "arms": rows} for p, o, rows in points],
    }


def _targets(*sweeps: dict) -> dict[str, report.Target]:
    return {t.name: t for t in report.evaluate_targets({"sweeps": list(sweeps)})}


def test_long_context_targets_use_the_worst_point_in_the_2_to_4x_range():
    sweep = _sweep(
        "swe",
        "live",
        [
            (5, 0.5, {"kv": _row(100), "sglang_cache_aware": _row(100), BM: _row(100, hit=0.5)}),
            (20, 2.0, {"kv": _row(40), "sglang_cache_aware": _row(30), BM: _row(120, hit=0.98)}),
            (40, 4.0, {"kv": _row(50), "sglang_cache_aware": _row(40), BM: _row(110, hit=0.99)}),
        ],
    )
    targets = _targets(sweep)
    vs_kv = targets["long context, 2-4x: steps/min >= 2.5x kv"]
    assert (vs_kv.value, vs_kv.status, vs_kv.points) == (2.2, "MISS", [20, 40])
    vs_sglang = targets["long context, 2-4x: steps/min >= 2.5x sglang_cache_aware"]
    assert (vs_sglang.value, vs_sglang.status) == (2.75, "PASS")
    hit = targets["long context, 2-4x: KV hit >= 97%"]
    assert (hit.value, hit.status) == (0.98, "PASS")  # the 0.5x point is outside the range
    flat = targets[report.FLAT_NAME]
    assert flat.value == pytest.approx(110 / 120, abs=1e-3) and flat.status == "PASS"


@pytest.mark.parametrize(
    "curve, value, status",
    [
        ((50, 100, 120, 140, 160), 1.0, "PASS"),  # still rising past saturation
        ((50, 100, 120, 110, 112), 0.917, "PASS"),  # dips 8% below the running peak
        ((50, 100, 120, 130, 110), 0.846, "MISS"),  # the last point falls 15% below 130
        ((50, 150, 120, 130, 140), 0.8, "MISS"),  # the peak at 1x counts: 120 is 80% of 150
        ((50, 100, 89, 95, 98), 0.89, "MISS"),  # just over 10% down at the first point past 1.5x
    ],
)
def test_flatness_holds_every_point_past_saturation_to_its_running_peak(curve, value, status):
    arms = [{"kv": _row(1), BM: _row(v)} for v in curve]
    sweep = _sweep(
        "short", "sim", [(p, o, rows) for p, o, rows in zip((5, 10, 20, 30, 40), (0.5, 1.0, 2.0, 3.0, 4.0), arms)]
    )
    flat = _targets(sweep)[report.FLAT_NAME]
    assert (flat.value, flat.status, flat.points) == (pytest.approx(value, abs=1e-3), status, [20, 30, 40])


def test_flatness_needs_two_points_past_saturation_and_no_gaps():
    one = _sweep("short", "sim", [(5, 0.5, {BM: _row(50)}), (20, 2.0, {BM: _row(40)})])
    assert report.FLAT_NAME not in _targets(one)
    gap = _sweep(
        "short",
        "sim",
        [
            (5, 0.5, {BM: _row(50)}),
            (10, 1.0, {BM: {"error": "boom"}}),
            (20, 2.0, {BM: _row(40)}),
            (30, 3.0, {BM: _row(45)}),
        ],
    )
    assert _targets(gap)[report.FLAT_NAME].status == "N/A"


def test_running_peak_ratios():
    assert report.running_peak_ratios([1, 2, 1, 4, 3]) == [1.0, 1.0, 0.5, 1.0, 0.75]


@pytest.mark.parametrize("bm, best, status", [(97.0, 100.0, "PASS"), (96.9, 100.0, "MISS"), (105.0, 100.0, "PASS")])
def test_short_context_never_more_than_3_percent_slower_than_the_best_other_arm(bm, best, status):
    sweep = _sweep(
        "short",
        "sim",
        [
            (5, 0.5, {"round_robin": _row(50), "kv": _row(50), BM: _row(50)}),
            (30, 3.0, {"round_robin": _row(best - 10), "kv": _row(best), BM: _row(bm)}),
        ],
    )
    target = _targets(sweep)["short context: never > 3% slower than the best other arm"]
    assert target.status == status
    assert target.value == pytest.approx(min(1.0, bm / best), abs=1e-3)


def test_below_saturation_compares_with_the_best_arm_including_itself():
    sweep = _sweep(
        "swe",
        "sim",
        [
            (5, 0.5, {"kv": _row(100), BM: _row(98)}),
            (8, 0.8, {"kv": _row(100), BM: _row(120)}),
        ],
    )
    target = _targets(sweep)["below saturation: within 3% of the best arm"]
    assert (target.value, target.status, target.points) == (0.98, "PASS", [5, 8])


def test_missing_or_failed_arms_make_a_target_not_applicable():
    sweep = _sweep(
        "short",
        "sim",
        [
            (5, 0.5, {"kv": _row(100), BM: {"error": "boom"}}),
            (30, 3.0, {"kv": _row(100), BM: _row(100)}),
        ],
    )
    targets = _targets(sweep)
    assert targets["below saturation: within 3% of the best arm"].status == "N/A"
    assert targets["short context: never > 3% slower than the best other arm"].status == "N/A"
    # The simulator has no sglang-router: that target is simply not listed.
    assert not any("sglang" in name for name in targets)


def test_targets_are_listed_per_bandmaster_arm():
    sweep = _sweep("short", "sim", [(30, 3.0, {"kv": _row(100), BM: _row(100), "bandmaster-cost_aware": _row(90)})])
    rows = report.evaluate_targets({"sweeps": [sweep]})
    short = {t.arm: t.status for t in rows if t.name.startswith("short context")}
    assert short == {BM: "PASS", "bandmaster-cost_aware": "MISS"}
    assert "MISS" in report.targets_text(rows)


def _timeline() -> dict:
    columns = list(TIMELINE_COLUMNS)
    rows = [[5.0 * i, 0.5 + 0.05 * i, 0.4 + 0.05 * i, "normal", 1, 2, 0.6, 1, 0, 0, 0, 0, 0] for i in range(12)]
    return {
        "interval_s": 5.0,
        "columns": columns,
        "workers": {"worker-0": rows, "worker-1": rows},
        "bands": {"pause_threshold": 0.95, "soft_demote_threshold": 0.8, "pause_target": 0.8, "resume_ceiling": 0.85},
        "control_events": [[30.0, "pause", "worker-0", "p1", 1000], [45.0, "resume", "worker-0", "p1", 1000]],
    }


def _breakdown() -> dict:
    return {
        "prompt_tokens": 1000,
        "cached_tokens": 800,
        "hit_rate": 0.8,
        "hit_rate_ceiling": 0.9,
        "uncached_tokens": {
            "first_turn": 10,
            "new_observation": 50,
            "previous_answer": 40,
            "reprefill_after_pause": 70,
            "reprefill_other": 30,
        },
        "full_reprefills": {"after_pause": 2, "other": 1},
        "busy_share": 0.95,
        "recompute_share_of_busy": 0.123,
        "engine_queue": {"queued_mean": 1.25, "running_mean": 3.0},
        "steps_per_min_first_90pct": 42.0,
        "longest_program": {"program_id": "p", "turns": 9, "end_s": 600.0, "pauses": 2, "paused_s": 120.0},
    }


def test_write_report_writes_plots_markdown_and_targets(tmp_path):
    scheduler = {"pauses": 3, "forced_resumes": 1, "held_admissions": 4, "hold_p50_s": 12.4, "hold_max_s": 60.0}
    sweep = _sweep(
        "swe",
        "sim",
        [
            (
                5,
                0.5,
                {
                    "round_robin": _row(90),
                    "kv": _row(100, breakdown=_breakdown(), scheduler={}),
                    BM: {**_row(100, timeline=_timeline(), breakdown=_breakdown()), "scheduler": scheduler},
                },
            ),
            (30, 3.0, {"round_robin": _row(40), "kv": _row(50), BM: _row(130, hit=0.99, timeline=_timeline())}),
        ],
    )
    results = {"meta": {"argv": ["--mode", "sim"], "git_commit": "abc", "created": "now"}, "sweeps": [sweep]}
    written = report.write_report(results, tmp_path)
    names = {p.name for p in written}
    assert {"sim_swe_steps.png", "sim_swe_kv_hit.png", "sim_swe_timeline.png", "summary.md", "targets.json"} <= names
    for path in written:
        assert path.stat().st_size > 0
    markdown = (tmp_path / "summary.md").read_text()
    assert "| arm | 5 (0.5x) | 30 (3.0x) |" in markdown
    assert f"| {BM} | 100.0 / 90.0% / 0.50 | 130.0 / 99.0% / 0.50 |" in markdown
    assert (
        "| MISS | sim | swe | bandmaster-threshold | long context, 2-4x: steps/min >= 2.5x kv | 2.600" not in markdown
    )
    assert "| PASS | sim | swe | bandmaster-threshold | long context, 2-4x: steps/min >= 2.5x kv | 2.600" in markdown
    # The simulator's breakdown: one row per arm that has one, scheduler columns for Bandmaster only.
    assert (
        "| 5 (0.5x) | kv | 80.0% | 90.0% | 1.0% | 5.0% | 4.0% | 7.0% / 3.0% | 2 / 1 | 95% | 12.3% | 1.2 "
        "| - | - | 42.0 | 9 turns, 10.0 / 2 / 2.0 |"
    ) in markdown
    assert f"| 5 (0.5x) | {BM} | 80.0% |" in markdown and "| 3 / 1 | 4 (12 / 60) |" in markdown


def test_timeline_point_prefers_about_3x():
    sweep = _sweep(
        "swe",
        "sim",
        [(p, o, {BM: _row(1, timeline=_timeline())}) for p, o in ((5, 0.5), (20, 2.0), (32, 3.2), (40, 4.0))],
    )
    assert report.timeline_point(sweep, BM)["parallel"] == 32


def test_the_oracle_is_a_reference_never_the_best_other_arm():
    sweep = _sweep(
        "short",
        "sim",
        [
            (5, 0.5, {"kv": _row(100), "oracle": _row(200), BM: _row(100)}),
            (30, 3.0, {"kv": _row(100), "oracle": _row(200), BM: _row(98)}),
        ],
    )
    targets = _targets(sweep)
    assert targets["short context: never > 3% slower than the best other arm"].value == 0.98
    assert targets["below saturation: within 3% of the best arm"].value == 1.0
    assert report.oracle_ratios(sweep) == [{"kv": 0.5, "oracle": 1.0, BM: 0.5}, {"kv": 0.5, "oracle": 1.0, BM: 0.49}]
    assert report.oracle_ratios(_sweep("short", "sim", [(5, 0.5, {"kv": _row(100)})])) == [{}]


@pytest.mark.parametrize(
    "live_bm, sim_bm, value, status",
    [
        (110.0, 100.0, 1.1, "PASS"),  # live 1.10x kv, sim 1.00x: 10% apart, the edge
        (120.0, 100.0, 1.2, "MISS"),
        (80.0, 100.0, 0.8, "MISS"),
        (95.0, 100.0, 0.95, "PASS"),
    ],
)
def test_live_ratio_to_kv_must_be_within_10_percent_of_the_simulated_one(live_bm, sim_bm, value, status):
    live = _sweep(
        "swe", "live", [(6, 0.5, {"kv": _row(100), BM: _row(100)}), (36, 2.9, {"kv": _row(100), BM: _row(live_bm)})]
    )
    twin = _sweep(
        "swe", "live-sim", [(6, 0.5, {"kv": _row(50), BM: _row(50)}), (36, 2.9, {"kv": _row(100), BM: _row(sim_bm)})]
    )
    rows = report.evaluate_targets({"sweeps": [twin, live]})
    (check,) = [t for t in rows if t.name == report.LIVE_RATIO_NAME]
    assert (check.value, check.status, check.mode, check.needs) == (pytest.approx(value), status, "live", "0.9..1.1")
    assert "36 programs" in check.detail
    # The twin is a reference: no targets of its own.
    assert all(t.mode != "live-sim" for t in rows)


def test_live_ratio_is_not_applicable_without_a_simulated_point():
    live = _sweep("swe", "live", [(36, 2.9, {"kv": _row(100), BM: _row(100)})])
    twin = _sweep("swe", "live-sim", [(36, 2.9, {"kv": _row(100), BM: {"error": "boom"}})])
    (check,) = [t for t in report.evaluate_targets({"sweeps": [twin, live]}) if t.name == report.LIVE_RATIO_NAME]
    assert check.status == "N/A"


def test_live_repeats_are_listed_under_the_table_of_medians():
    sweep = _sweep(
        "short",
        "live",
        [
            (6, 0.4, {"kv": _row(75.8, repeats=[74.7, 75.8, 76.4]), BM: _row(76.1, repeats=[76.1, None, 75.8])}),
            (40, 2.8, {"kv": _row(312.2, repeats=[312.2]), BM: _row(311.5)}),
        ],
    )
    markdown = report.summary_markdown({"meta": {}, "sweeps": [sweep]}, [])
    assert "| kv | 75.8 / 90.0% / 0.50 | 312.2 / 90.0% / 0.50 |" in markdown
    assert "kv runs per point (steps/min, the table shows the median): 74.7 / 75.8 / 76.4; 312.2" in markdown
    assert f"{BM} runs per point (steps/min, the table shows the median): 76.1 / failed / 75.8; -" in markdown
    # A single run per point (the smoke sweep, the simulator) lists nothing.
    single = _sweep("short", "live", [(6, 0.4, {"kv": _row(75.8, repeats=[75.8])})])
    assert "runs per point" not in report.summary_markdown({"meta": {}, "sweeps": [single]}, [])


BMC = "bandmaster-cost_aware"


def _live_peers(bm: float, ta: float, sg: float, *, cache_report: bool = True) -> dict:
    sweep = _sweep(
        "swe",
        "live",
        [
            (14, 3.07, {"kv": _row(100), "sglang_cache_aware": _row(sg), "thunderagent": _row(ta), BMC: _row(bm)}),
            (18, 3.95, {"kv": _row(100), "sglang_cache_aware": _row(sg), "thunderagent": _row(ta), BMC: _row(bm)}),
        ],
    )
    sweep["spec"]["cache_report"] = cache_report
    return sweep


@pytest.mark.parametrize(
    "bm, ta, sg, vs_ta, vs_sg",
    [
        (150.0, 130.0, 100.0, "PASS", "PASS"),  # 1.154x ThunderAgent, 1.5x sglang-router
        (149.0, 130.0, 100.0, "MISS", "MISS"),
        (160.0, 150.0, 90.0, "MISS", "PASS"),
    ],
)
def test_live_peer_targets_at_three_to_four_times(bm, ta, sg, vs_ta, vs_sg):
    targets = _targets(_live_peers(bm, ta, sg))
    assert targets["live long context, 3-4x: steps/min >= 1.15x thunderagent"].status == vs_ta
    assert targets["live long context, 3-4x: steps/min >= 1.5x sglang_cache_aware"].status == vs_sg
    assert targets["live long context, 3-4x: steps/min >= 1.15x thunderagent"].points == [14, 18]


def test_without_cache_reports_bandmaster_must_still_match_thunderagent():
    targets = _targets(_live_peers(131.0, 130.0, 100.0, cache_report=False))
    check = targets["live long context, 3-4x, workers without cache reports: steps/min >= 1.0x thunderagent"]
    assert check.status == "PASS"
    # The 1.15x and sglang-router targets are for workers with cache reports only.
    assert not [name for name in targets if "1.15x" in name or "sglang_cache_aware" in name and "live long" in name]
    assert _targets(_live_peers(129.0, 130.0, 100.0, cache_report=False))[check.name].status == "MISS"


@pytest.mark.parametrize(
    "live, sim, status",
    [(95.0, 100.0, "PASS"), (90.0, 100.0, "PASS"), (89.0, 100.0, "MISS"), (120.0, 100.0, "PASS")],
)
def test_live_over_sim_steps_per_minute_for_every_arm(live, sim, status):
    live_sweep = _sweep("swe", "live", [(18, 3.95, {"kv": _row(live), "thunderagent": _row(100), BMC: _row(100)})])
    twin = _sweep("swe", "live-sim", [(18, 3.95, {"kv": _row(sim), "thunderagent": _row(100), BMC: _row(100)})])
    checks = {
        t.arm: t for t in report.evaluate_targets({"sweeps": [twin, live_sweep]}) if t.name == report.LIVE_SIM_NAME
    }
    assert set(checks) == {"kv", "thunderagent", BMC}
    assert checks["kv"].status == status and checks["thunderagent"].status == "PASS"


@pytest.mark.parametrize("live_hit, status", [(0.80, "PASS"), (0.76, "PASS"), (0.74, "MISS"), (0.86, "MISS")])
def test_live_kv_hit_within_five_points_of_the_sims(live_hit, status):
    live_sweep = _sweep("swe", "live", [(18, 3.95, {"kv": _row(100), BMC: _row(100, hit=live_hit)})])
    twin = _sweep("swe", "live-sim", [(18, 3.95, {"kv": _row(100), BMC: _row(100, hit=0.80)})])
    (check,) = [t for t in report.evaluate_targets({"sweeps": [twin, live_sweep]}) if t.name == report.LIVE_HIT_NAME]
    assert check.status == status and check.arm == BMC


def test_the_summary_shows_live_over_sim_and_the_workers_lateness():
    live_sweep = _sweep("swe", "live", [(18, 3.95, {"kv": _row(90, lateness={"late_fraction": 0.004})})])
    twin = _sweep("swe", "live-sim", [(18, 3.95, {"kv": _row(100)})])
    markdown = report.summary_markdown({"meta": {}, "sweeps": [twin, live_sweep]}, [])
    assert "| kv | 0.900 (90.0 / 100.0) |" in markdown
    assert "Workers' lateness behind their clock (worst worker, share of the run's wall time): kv 0.40%" in markdown


def test_the_summary_gives_each_live_arm_as_a_share_of_the_oracle_simulated_at_its_point():
    live_sweep = _sweep("swe", "live", [(18, 3.95, {"kv": _row(36), BMC: _row(45)})])
    twin = _sweep("swe", "live-sim", [(18, 3.95, {"kv": _row(35), BMC: _row(44), "oracle": _row(72)})])
    markdown = report.summary_markdown({"meta": {}, "sweeps": [twin, live_sweep]}, [])
    assert "Live steps/min ÷ the oracle (kv with unlimited KV) simulated at the same point:" in markdown
    assert "| kv | 0.500 (36.0 / 72.0) |" in markdown and f"| {BMC} | 0.625 (45.0 / 72.0) |" in markdown
    # The oracle is no live arm: no live ÷ sim row and no target of its own.
    assert "| oracle | " not in markdown.split("Live ÷ simulated")[1].split("Live steps/min ÷ the oracle")[0]
    assert all(t.arm != "oracle" for t in report.evaluate_targets({"sweeps": [twin, live_sweep]}))
    # A twin without the oracle (results of an older run): no such table.
    older = _sweep("swe", "live-sim", [(18, 3.95, {"kv": _row(35), BMC: _row(44)})])
    assert "÷ the oracle" not in report.summary_markdown({"meta": {}, "sweeps": [older, live_sweep]}, [])


def test_turn_phases_are_tabled_live_against_the_simulated_model():
    def phases(prefill: float) -> dict:
        entry = {"sim_s": {"mean": prefill}, "wall_s": {"mean": prefill / 4}}
        return {"phases": {"prefill": entry}, "total": {"sim_s": {"mean": 2 * prefill}, "wall_s": {"mean": 0.0}}}

    live_sweep = _sweep("swe", "live", [(18, 3.95, {"kv": _row(90, turn_phases=phases(1.5))})])
    twin = _sweep("swe", "live-sim", [(18, 3.95, {"kv": _row(100, turn_phases=phases(1.25))})])
    markdown = report.summary_markdown({"meta": {}, "sweeps": [twin, live_sweep]}, [])
    assert "| 18 | kv | prefill | 1.500 | 1.250 |" in markdown and "| 18 | kv | total | 3.000 | 2.500 |" in markdown
    # Without --breakdown there is no such table.
    plain = _sweep("swe", "live", [(18, 3.95, {"kv": _row(90)})])
    assert "Where a turn's time went" not in report.summary_markdown({"meta": {}, "sweeps": [plain]}, [])
