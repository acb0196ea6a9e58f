"""bench/evaluate.py: the grid, the aggregation over draws, the targets, and a quick run end to end."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bench import evaluate
from bench.evaluate import QUICK, Job
from clients.workloads import split_programs, swe_agent_programs
from services.scheduler.config import load_config

ALL = list(evaluate.GROUPS)
FULL = evaluate.FULL.with_fits(split_programs(swe_agent_programs(), "tune"))


def test_about_six_programs_fit_so_2_3_4x_are_12_18_24_programs():
    assert FULL.fits_programs == pytest.approx(6.04, abs=0.01)
    assert [FULL.parallel(f) for f in (2, 3, 4)] == [12, 18, 24]
    assert QUICK.with_fits([]) is QUICK


def test_the_points_follow_the_traces_contexts():
    from clients.workloads import Program, Turn

    small = [Program(f"s{i}", (Turn(1_000, 10, 0.5), Turn(4_000, 90, 0.0))) for i in range(3)]
    spec = evaluate.FULL.with_fits(small)
    assert spec.fits_programs == round(2 * 131_072 / 4_090, 2) and spec.parallel(3) == 192


def _jobs(spec=FULL, groups=ALL, factors=(2, 3, 4), arms=evaluate.ARMS, split="tune"):
    return evaluate.build_jobs(spec, groups, factors, arms, split, spec.draws, spec.heldout_draws)


def test_the_default_grid():
    jobs = _jobs()
    points = Counter((j.group, j.factor, j.programs, j.parallel) for j in jobs)
    # Per point: 3 arms x 6 draws (held-out: 3 draws).
    assert points == {
        ("closed", 2, 12, 12): 18,
        ("closed", 3, 18, 18): 18,
        ("closed", 4, 24, 24): 18,
        ("tool_x3", 3, 18, 18): 18,
        ("tool_x10", 3, 18, 18): 18,
        ("host", 3, 18, 18): 18,
        ("host", 4, 24, 24): 18,
        ("steady", 3, 54, 18): 18,
        ("heldout", 2, 12, 12): 9,
        ("heldout", 3, 18, 18): 9,
        ("heldout", 4, 24, 24): 9,
    }
    assert len(jobs) == 171
    assert {j.host_kv_tokens for j in jobs if j.group == "host"} == {4 * 131_072}
    assert {j.tool_time_scale for j in jobs if j.group.startswith("tool")} == {3.0, 10.0}
    assert {j.split for j in jobs} == {"tune", "heldout"} and {j.split for j in jobs if j.group == "heldout"} == {
        "heldout"
    }


def test_subsets_of_points_groups_and_arms():
    jobs = _jobs(groups=["closed", "host"], factors=(3,), arms=("bandmaster", "kv"))
    assert {(j.group, j.factor) for j in jobs} == {("closed", 3), ("host", 3)}
    assert {j.arm for j in jobs} == {"bandmaster", "kv"}
    assert _jobs(groups=["tool_x3"], factors=(2,)) == []  # tool scales run at 3x only


def test_scheduler_flags_reach_the_bandmaster_arm_only():
    scheduler = load_config(
        ["--pause-policy", "threshold", "--pause-threshold", "0.9", "--router-temperature", "0.5"], {}
    )
    job = Job("steady", "tune", 3, 0, "bandmaster", 54, 18, 1.0, 0)
    bm = evaluate.scenario_for(job, FULL, None, scheduler)
    assert (bm.pause_policy, bm.control.pause_threshold, bm.kv_router.router_temperature) == ("threshold", 0.9, 0.5)
    assert (bm.programs, bm.parallel, bm.draw, bm.include_longest, bm.seed) == (54, 18, "random", True, 0)
    kv = evaluate.scenario_for(Job("closed", "tune", 3, 2, "kv", 18, 18, 1.0, 0), FULL, None, scheduler)
    assert kv.kv_router.router_temperature != 0.5 and (kv.parallel, kv.include_longest, kv.seed) == (0, False, 2)


def _row(metric: float, error: str = "") -> dict:
    return {"metric": metric, **({"error": error} if error else {})}


def test_aggregate_takes_mean_and_worst_over_draws_of_the_same_programs():
    jobs = [Job("closed", "tune", 3, d, arm, 18, 18, 1.0, 0) for d in range(3) for arm in evaluate.ARMS]
    metrics = {0: (50, 40, 60), 1: (45, 45, 50), 2: (30, 10, 60)}  # (bandmaster, kv, oracle) per draw
    rows = {j: _row(metrics[j.draw][evaluate.ARMS.index(j.arm)]) for j in jobs}
    rows[jobs[-1]] = _row(0, error="boom")  # draw 2's oracle failed
    (point,) = evaluate.aggregate(jobs, rows)
    assert point["ratios"]["bandmaster/kv"] == {
        "mean": pytest.approx((1.25 + 1.0 + 3.0) / 3, abs=1e-4),
        "worst": 1.0,
        "worst_draw": 1,
        "draws": 3,
        "values": [1.25, 1.0, 3.0],
    }
    assert point["ratios"]["bandmaster/oracle"]["draws"] == 2
    assert point["ratios"]["bandmaster/oracle"]["worst"] == pytest.approx(0.8333, abs=1e-4)
    assert set(point["draws"]) == {"0", "1", "2"}


def _point(group: str, factor: int, bm_kv: tuple[float, float], bm_oracle: tuple[float, float] | None = None) -> dict:
    ratios = {"bandmaster/kv": {"mean": bm_kv[0], "worst": bm_kv[1], "worst_draw": 1}}
    if bm_oracle:
        ratios["bandmaster/oracle"] = {"mean": bm_oracle[0], "worst": bm_oracle[1], "worst_draw": 0}
    return {"group": group, "factor": factor, "ratios": ratios}


def test_targets_mean_where_the_issue_says_mean_and_worst_case_for_never_below_kv():
    points = [
        _point("closed", 2, (1.1, 1.0), (0.9, 0.85)),
        _point("closed", 3, (1.5, 1.2), (0.84, 0.8)),
        _point("closed", 4, (1.3, 0.96), (0.8, 0.7)),
        _point("host", 3, (1.2, 1.1)),
        _point("host", 4, (1.05, 1.0)),
        _point("heldout", 3, (1.0, 0.99), (0.95, 0.9)),
    ]
    targets = {t.name: t for t in evaluate.evaluate_targets(points, [2, 3, 4])}
    oracle = targets["tune, closed batch, 2-3x: mean over draws >= 0.85x oracle"]
    assert (oracle.value, oracle.status, oracle.points) == (0.84, "MISS", [2, 3])
    assert targets["tune, closed batch, 3x: mean over draws >= 1.4x kv"].status == "PASS"
    assert targets["host tier, 3-4x: mean over draws >= 1.1x kv with the same tier"].value == 1.05
    never = targets["never below kv (closed): every draw >= 0.97x kv"]
    assert (never.value, never.status) == (0.96, "MISS") and "4x, draw 1" in never.detail
    assert targets["never below kv (heldout): every draw >= 0.97x kv"].status == "PASS"
    # The held-out 2x point is missing: its oracle target cannot be judged.
    assert targets["held-out, closed batch, 2-3x: mean over draws >= 0.85x oracle"].status == "N/A"
    assert not any("steady" in name for name in targets)


def test_quick_run_writes_the_report_with_every_group(tmp_path):
    assert evaluate.main(["--quick", "--jobs", "2", "--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "evaluate.json").read_text())
    assert report["meta"]["runs"] == len(_jobs(QUICK, factors=QUICK.factors)) and not report["errors"]
    assert {p["group"] for p in report["points"]} == set(ALL)
    for point in report["points"]:
        assert set(point["ratios"]) == {"bandmaster/oracle", "bandmaster/kv", "kv/oracle"}
        for arms in point["draws"].values():
            assert arms["oracle"]["evicted_tokens"] == 0 and arms["oracle"]["oracle_worker_kv_tokens"] >= 10_240
    steady = next(p for p in report["points"] if p["group"] == "steady")
    assert steady["programs"] == 3 * steady["parallel"]
    assert all(
        arms[a]["metric"] == arms[a]["steady_steps_per_min"] for arms in steady["draws"].values() for a in evaluate.ARMS
    )
    assert {t["status"] for t in report["targets"]} <= {"PASS", "MISS", "N/A"} and len(report["targets"]) == 11
    markdown = (tmp_path / "evaluate.md").read_text()
    assert "| steady 3x (18 programs through 6 slots) | tune |" in markdown and "## Targets" in markdown


def test_a_subset_on_a_trace_file_with_a_policy_variant(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "program_id": f"a{i}",
                    "turns": [
                        {"input_tokens": 300 + 200 * k, "output_tokens": 20, "tool_seconds_after": 0.3}
                        for k in range(3)
                    ],
                }
            )
            + "\n"
            for i in range(5)
        )
    )
    argv = [
        "--quick",
        "--jobs",
        "1",
        "--trace",
        str(path),
        "--split",
        "all",
        "--points",
        "2x",
        "--groups",
        "closed",
        "--draws",
        "1",
        "--pause-policy",
        "threshold",
        "--out-dir",
        str(tmp_path),
    ]
    assert evaluate.main(argv) == 0
    report = json.loads((tmp_path / "evaluate.json").read_text())
    (point,) = report["points"]
    assert (point["group"], point["split"], point["factor"]) == ("closed", "all", 2)
    assert report["meta"]["pause_policy"] == "threshold" and report["meta"]["trace"] == str(path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--points", "5"], "points"),
        (["--arms", "round_robin"], "arms"),
        (["--groups", "tool_x3", "--split", "heldout"], "nothing to run"),
        (["--pause-threshold", "0.5", "--pause-target", "0.9"], "pause_target"),
        (["--no-such-flag", "1"], "no-such-flag"),
        (["--draws", "0"], "draws"),
    ],
)
def test_bad_options_exit_2(tmp_path, capsys, argv, message):
    assert evaluate.main(["--quick", "--out-dir", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_malformed_trace_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text("{}\n")
    assert evaluate.main(["--quick", "--trace", str(path), "--out-dir", str(tmp_path)]) == 2
    assert f"{path}:1" in capsys.readouterr().err
