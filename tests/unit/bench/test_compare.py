"""bench/compare.py: the sweep specs and the simulator breakdown, on hand-made turn records."""

from __future__ import annotations

import pytest

from bench import compare
from clients.player import TurnRecord
from clients.workloads.model import Program, Turn
from services.common.settings.config import ConfigError


class _LinearProfile:
    """1 ms per prefilled token, whatever the prefix: prefill seconds = tokens / 1000."""

    def prefill_chunk_ms(self, tokens: int, prefix_tokens: int) -> float:
        return float(tokens)


def _program() -> Program:
    return Program("p", (Turn(100, 10, 2.0), Turn(150, 10, 1.0), Turn(200, 10, 0.0)))


def _turns(third_cached: int) -> list[TurnRecord]:
    # Turn 0: 0 -> 1 s; turn 1: sent at 3 s (tool 2 s), ends at 4 s; turn 2: sent at 5 s, first token at 8 s.
    return [
        TurnRecord("p", 0, True, ttft_s=0.5, turn_s=1.0, prompt_tokens=100, cached_tokens=0, completion_tokens=10),
        TurnRecord("p", 1, True, ttft_s=0.5, turn_s=1.0, prompt_tokens=150, cached_tokens=100, completion_tokens=10),
        TurnRecord(
            "p", 2, True, ttft_s=3.0, turn_s=4.0, prompt_tokens=200, cached_tokens=third_cached, completion_tokens=10
        ),
    ]


def _breakdown(turns, events) -> dict:
    return compare.run_breakdown(
        [_program()], turns, events, _LinearProfile(), chunk_tokens=64, busy_s=2.0, makespan_s=10.0, workers=1
    )


@pytest.mark.parametrize(
    "events, after_pause",
    [
        ([[4.5, "pause", "worker-0", "p", 150], [6.0, "resume", "worker-0", "p", 150]], True),
        ([[3.5, "pause", "worker-0", "p", 150]], False),  # during turn 1, before the turn-2 gap
        ([[4.5, "pause", "worker-0", "q", 150]], False),  # another program
        ([[8.5, "pause", "worker-0", "p", 150]], False),  # after turn 2's first token
    ],
)
def test_breakdown_splits_uncached_tokens_and_attributes_reprefill_to_pauses(events, after_pause):
    b = _breakdown(_turns(third_cached=0), events)
    # Turn 2 recomputes all 150 tokens of turn 1's prompt, then its answer (10) and observation (40).
    assert b["uncached_tokens"] == {
        "first_turn": 100,
        "new_observation": 80,
        "previous_answer": 20,
        "reprefill_after_pause": 150 if after_pause else 0,
        "reprefill_other": 0 if after_pause else 150,
    }
    assert b["full_reprefills"] == ({"after_pause": 1, "other": 0} if after_pause else {"after_pause": 0, "other": 1})
    assert (b["prompt_tokens"], b["cached_tokens"]) == (450, 100)
    assert b["hit_rate"] == pytest.approx(100 / 450, abs=1e-4)
    assert b["hit_rate_ceiling"] == pytest.approx(1 - 200 / 450, abs=1e-4)
    assert b["prefill_s"] == {"first_turn": 0.1, "new_tokens": 0.1, "reprefill": 0.15}
    assert (b["busy_share"], b["recompute_share_of_busy"]) == (0.2, 0.075)
    # Turns end at 1, 4 and 9 s: 90% of 3 turns is all 3, at 9 s.
    assert b["steps_per_min_first_90pct"] == pytest.approx(3 / (9 / 60), abs=1e-3)
    assert b["longest_program"] == {
        "program_id": "p",
        "turns": 3,
        "end_s": 9.0,
        "pauses": 1 if events[0][3] == "p" else 0,
        "paused_s": 1.5 if after_pause else 0.0,
    }


def test_a_partial_hit_is_reprefill_but_not_a_full_one():
    b = _breakdown(_turns(third_cached=100), [])
    assert b["uncached_tokens"]["reprefill_other"] == 50
    assert b["full_reprefills"] == {"after_pause": 0, "other": 0}


def test_failed_turns_are_left_out():
    turns = _turns(third_cached=150)
    turns[2].ok = False
    b = _breakdown(turns, [])
    assert b["prompt_tokens"] == 250 and b["uncached_tokens"]["new_observation"] == 40


def test_the_long_context_sweep_runs_full_length_programs_from_half_to_four_times_what_fits():
    spec = compare.SIM_SPECS["swe"]
    assert spec.max_turns is None and (spec.workers, spec.worker_kv_tokens) == (2, 131_072)
    described = spec.describe()
    # The trace's contexts: ~40K tokens at their peak, so only a handful of programs fit in 2 x 128K.
    assert described["mean_context_tokens"] > 35_000
    assert described["oversubscription"] == pytest.approx([0.5, 1.0, 2.0, 3.0, 4.0], abs=0.1)


def test_max_turns_is_none_or_positive():
    with pytest.raises(ConfigError):
        compare.SweepSpec("swe", workers=2, worker_kv_tokens=1_024, max_turns=0, token_scale=1.0, parallel=(1,))


def test_metered_engine_counts_decode_runs_as_busy_time():
    from bench.compare import _MeteredEngine
    from services.simworker.core.api import EngineRequest
    from tests.unit.simworker.helpers import make_engine

    engine = _MeteredEngine(make_engine())
    engine.submit(EngineRequest("a", tuple(range(1000, 1010)), 30, ignore_eos=True), 0.0)
    first = engine.step(0.0)
    ends = engine.plan_decode(first.duration_s, 10)
    engine.commit_decode(4)
    engine.commit_decode(len(ends) - 4)
    assert engine.busy_s == pytest.approx(ends[-1])


def test_the_oracle_runs_in_the_simulator_only_and_sglang_live_only():
    selected = ["round_robin", "kv", "sglang_cache_aware", "oracle", "bandmaster"]
    assert compare.arms_for("sim", selected, ["cost_aware"]) == ["round_robin", "kv", "oracle", "bandmaster-cost_aware"]
    assert compare.arms_for("live", selected, ["cost_aware"]) == [
        "round_robin",
        "kv",
        "sglang_cache_aware",
        "bandmaster-cost_aware",
    ]
    # The live ÷ sim checks simulate every arm of a live sweep that the simulator models, and the oracle,
    # the bound the live arms are reported against.
    assert compare.live_sim_arms(["round_robin", "kv", "sglang_cache_aware", "bandmaster-threshold"]) == [
        "round_robin",
        "kv",
        "bandmaster-threshold",
        "oracle",
    ]
    assert compare.live_sim_arms(["sglang_cache_aware"]) == []  # nothing to check: no twin sweep at all


def test_a_live_point_simulated_as_live_runs_the_live_control_law():
    spec = compare.SweepSpec(
        "short", workers=2, worker_kv_tokens=4_096, max_turns=2, token_scale=0.2, parallel=(3,), speedup=20.0
    )
    row = compare.sim_run(spec, "bandmaster-threshold", 3, as_live=True)
    assert row["summary"]["turns_ok"] == 6 and "breakdown" not in row and "timeline" not in row


def test_the_live_twin_is_the_median_of_its_draws(monkeypatch):
    spec = compare.SweepSpec(
        "short", workers=2, worker_kv_tokens=4_096, max_turns=2, token_scale=0.2, parallel=(3,), twin_draws=4
    )
    steps = {1: 40.0, 2: 44.0, 3: 41.0, 4: 43.0}
    seen = []

    def fake_sim_run(spec, arm, parallel, *, as_live=False, variant=0):
        seen.append((arm, parallel, as_live, variant))
        return {"summary": {"steps_per_min": steps[variant], "kv_hit_rate": 0.5}}

    monkeypatch.setattr(compare, "sim_run", fake_sim_run)
    row = compare.twin_run(spec, "kv", 3)
    # Variants 1..4 of the live run, and the lower middle of the four stands for the arm.
    assert seen == [("kv", 3, True, v) for v in (1, 2, 3, 4)]
    assert row["summary"]["steps_per_min"] == 41.0
    assert [d["steps_per_min"] for d in row["draws"]] == [40.0, 44.0, 41.0, 43.0]
    # The pool's job takes the twin's path for a live-sim sweep.
    assert compare._job((spec, "kv", 3, True))[3]["summary"]["steps_per_min"] == 41.0


def test_bad_twin_draws_are_refused(tmp_path, capsys):
    assert compare.main(["--mode", "live", "--smoke", "--twin-draws", "0", "--out-dir", str(tmp_path)]) == 2
    assert "--twin-draws must be from 1 to 50" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="twin_draws"):
        compare.SweepSpec(
            "short", workers=2, worker_kv_tokens=4_096, max_turns=2, token_scale=0.2, parallel=(3,), twin_draws=0
        )


def test_a_bad_trace_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    assert (
        compare.main(["--mode", "sim", "--workload", "swe", "--smoke", "--trace", str(bad), "--out-dir", str(tmp_path)])
        == 2
    )
    assert f"{bad}:1" in capsys.readouterr().err


def _live_row(steps: float, error: str | None = None) -> dict:
    row = {"summary": {"steps_per_min": steps, "kv_hit_rate": 0.5, "ttft_p90_s": 1.0}, "scheduler": {}}
    if error:
        row["error"] = error
    return row


def test_the_median_run_stands_for_a_live_arm_and_keeps_every_run():
    row = compare.median_run([_live_row(300.0), _live_row(280.0), _live_row(320.0)])
    assert row["summary"]["steps_per_min"] == 300.0
    assert row["repeats"] == [300.0, 280.0, 320.0]
    assert "error" not in row
    # An even count takes the lower median: never the better of two.
    assert compare.median_run([_live_row(310.0), _live_row(290.0)])["summary"]["steps_per_min"] == 290.0


def test_a_failed_live_repeat_is_an_error_of_the_row():
    row = compare.median_run([_live_row(300.0), {"error": "RuntimeError: stack did not start"}])
    assert row["summary"]["steps_per_min"] == 300.0
    assert row["repeats"] == [300.0, None]
    assert row["error"].startswith("1 of 2 runs failed; first: RuntimeError")
    only_failed = compare.median_run([{"error": "boom"}])
    assert "summary" not in only_failed and only_failed["error"].startswith("1 of 1 runs failed")


def test_live_repeats_run_round_by_round_and_report_the_median(tmp_path):
    spec = compare.SweepSpec("short", workers=2, worker_kv_tokens=4_096, max_turns=2, token_scale=0.2, parallel=(3,))
    sweeps = {"short": compare.new_sweep("live", spec, ["kv", "bandmaster-cost_aware"])}
    order: list[tuple[str, str]] = []
    steps = iter([100.0, 110.0, 90.0, 130.0, 95.0, 120.0])

    def fake_run(spec, arm, parallel, state_dir):
        order.append((arm, state_dir.name))
        return _live_row(next(steps))

    saves = []
    compare.run_live(sweeps, {"short": spec}, lambda: saves.append(1), tmp_path, repeats=3, run=fake_run)
    # Each round runs every arm once, so a slow spell of the machine hits both arms alike.
    assert [arm for arm, _ in order] == ["kv", "bandmaster-cost_aware"] * 3
    assert order[-1][1] == "short-3-bandmaster-cost_aware-3"
    point = sweeps["short"]["points"][0]["arms"]
    assert point["kv"]["repeats"] == [100.0, 90.0, 95.0] and point["kv"]["summary"]["steps_per_min"] == 95.0
    assert point["bandmaster-cost_aware"]["summary"]["steps_per_min"] == 120.0
    assert len(saves) == 6


def test_live_repeats_below_one_exit_2(tmp_path, capsys):
    assert compare.main(["--mode", "live", "--live-repeats", "0", "--out-dir", str(tmp_path)]) == 2
    assert "--live-repeats must be >= 1" in capsys.readouterr().err


def test_the_live_swe_sweep_runs_real_token_counts_at_three_and_four_times_what_fits():
    spec = compare.LIVE_SPECS["swe"]
    assert spec.token_scale == 1.0 and spec.max_turns == 32 and spec.cache_report
    assert [round(x) for x in spec.describe()["oversubscription"]] == [3, 4]


def test_lateness_is_the_worst_workers_lag_over_the_run():
    before = {"a": 1.0, "b": 0.0}
    after = {"a": 1.5, "b": 2.0, "c": 9.0}  # c: not read before, left out
    assert compare.lateness(before, after, 100.0) == {"late_s_max": 2.0, "late_fraction": 0.02, "wall_s": 100.0}
    # Real SGLang servers report no lateness: nothing to judge.
    assert compare.lateness({}, {}, 100.0)["late_fraction"] is None


@pytest.mark.parametrize(
    "late_fraction, refused", [(None, False), (0.0, False), (0.02, False), (0.021, True), (0.3, True)]
)
def test_a_run_whose_workers_fell_behind_their_clock_is_refused(late_fraction, refused):
    summary = {"late_fraction": late_fraction, "late_s_max": 3.0, "wall_s": 100.0}
    reason = compare.late_refusal(summary, 0.02)
    assert (reason is not None) == refused
    if refused:
        assert reason.startswith("refused: the workers fell") and "limit 2%" in reason


def test_a_refused_run_is_an_error_and_never_the_median():
    row = compare.median_run([_live_row(300.0), _live_row(900.0, error="refused: the workers fell 5.0% behind")])
    assert row["summary"]["steps_per_min"] == 300.0 and row["error"].startswith("1 of 2 runs failed")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--late-limit", "0"], "--late-limit must be in (0, 1)"),
        (["--late-limit", "1.5"], "--late-limit must be in (0, 1)"),
        (["--live-points", "x"], "--live-points must be a comma list"),
        (["--live-points", "0,4"], "--live-points must be a comma list"),
    ],
)
def test_bad_live_options_exit_2_naming_the_rule(tmp_path, capsys, argv, message):
    assert compare.main(["--mode", "live", *argv, "--out-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_late_limit_is_validated_in_the_spec():
    with pytest.raises(ConfigError, match="late_limit"):
        compare.SweepSpec(
            "short", workers=2, worker_kv_tokens=4_096, max_turns=2, token_scale=0.2, parallel=(3,), late_limit=0
        )
