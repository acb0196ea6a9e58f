"""The simulator's oracle arm, the steady-state figure, and runs from a trace file (`--trace`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench import sim
from harness.simlib import SimScenario, Simulator, simulate
from harness.simlib.simulator import steady_state
from services.common.settings.errors import ConfigError

# Enough pressure that the kv arm evicts and recomputes.
PRESSURE = dict(workload="swe", programs=8, max_turns=8, token_scale=0.5, workers=2, worker_kv_tokens=16_384)


def test_the_oracle_is_the_kv_arm_with_a_pool_that_never_evicts():
    kv = simulate(SimScenario(arm="kv", **PRESSURE))
    oracle_sim = Simulator(SimScenario(arm="oracle", **PRESSURE))
    oracle = oracle_sim.run()
    assert kv.worker_counters["worker-0"]["evicted_tokens"] + kv.worker_counters["worker-1"]["evicted_tokens"] > 0
    assert all(c["evicted_tokens"] == 0 and c["retractions"] == 0 for c in oracle.worker_counters.values())
    assert oracle_sim.router is not None and oracle_sim.scheduler is None
    summary = oracle.summary()
    assert summary["turns_ok"] == 64 and summary["steps_per_min"] >= kv.summary()["steps_per_min"]
    assert summary["oracle_worker_kv_tokens"] == 10 * 16_384  # the 10x floor holds these programs
    assert "oracle_worker_kv_tokens" not in kv.summary()
    assert summary["worker_recomputed_tokens"] <= kv.summary()["worker_recomputed_tokens"]


def test_the_oracle_pool_holds_every_program_with_its_answers_and_keeps_the_host_ratio():
    scenario = SimScenario(
        arm="oracle", workload="swe", programs=30, workers=2, worker_kv_tokens=1_024, worker_host_kv_tokens=4_096
    )
    programs = scenario.build_programs()
    held = 400 + sum(
        p.peak_context_tokens + sum(t.output_tokens for t in p.turns) + 64 * len(p.turns) for p in programs
    )
    pool = scenario.oracle_worker_kv_tokens(programs)
    assert pool >= held and pool % scenario.worker_page_size == 0 and pool < held + scenario.worker_page_size
    engines = scenario.engine_scenario(programs)
    assert (engines.worker_kv_tokens, engines.worker_host_kv_tokens) == (pool, 4 * pool)
    assert SimScenario(arm="kv").engine_scenario(programs) == SimScenario(arm="kv")


def test_the_oracle_needs_a_decode_cost_that_ignores_the_pool_size():
    with pytest.raises(ConfigError, match="context_k"):
        SimScenario(arm="oracle", worker_timing_profile="mocker-h100")


@pytest.mark.parametrize(
    "turn_ends, program_ends, last_start, parallel, programs, expected",
    [
        # 6 programs through 2 slots: warm-up ends at the 2nd program end (10), the window closes when
        # the last program starts (40); turns ending in (10, 40]: 15, 20, 40 -> 3 turns in 0.5 min.
        ([5, 10, 15, 20, 40, 50], [8, 10, 30, 40, 55, 60], 40.0, 2, 6, (6.0, [10.0, 40.0])),
        ([5, 10], [8, 10], 0.0, 2, 2, (None, None)),  # every program starts at once
        ([5, 10], [8, 10, 12], 9.0, 2, 3, (None, None)),  # the last start precedes warm-up's end
        ([5], [8], 0.0, 2, 4, (None, None)),  # fewer ends than slots (failed run)
    ],
)
def test_steady_state_counts_turns_between_warm_up_and_the_last_start(
    turn_ends, program_ends, last_start, parallel, programs, expected
):
    out = steady_state(turn_ends, program_ends, last_start, parallel, programs)
    assert (out["steady_steps_per_min"], out["steady_window_s"]) == expected


def test_a_steady_run_reports_its_window_and_a_closed_one_does_not():
    steady = simulate(SimScenario(arm="kv", parallel=2, **{**PRESSURE, "programs": 8})).summary()
    start, end = steady["steady_window_s"]
    assert 0 < start < end < steady["wall_s"] and steady["steady_steps_per_min"] > 0
    closed = simulate(SimScenario(arm="kv", **PRESSURE)).summary()
    assert closed["steady_steps_per_min"] is None and closed["steady_window_s"] is None


def test_the_cli_refuses_steady_mode_without_fewer_slots_than_programs(capsys):
    assert sim.main(["--mode", "steady", "--programs", "6"]) == 2
    assert "--mode steady needs" in capsys.readouterr().err
    assert sim.main(["--mode", "steady", "--programs", "6", "--parallel", "6"]) == 2


def test_a_simulation_runs_on_a_trace_file(tmp_path, capsys):
    """Anyone's agents: a small trace in the shipped format, scored with every arm of the CLI."""
    path = tmp_path / "mine.jsonl"
    with path.open("w") as fh:
        for i in range(6):
            turns = [
                {"input_tokens": 600 + 900 * k + 50 * i, "output_tokens": 30 + k, "tool_seconds_after": 0.4}
                for k in range(4)
            ]
            fh.write(json.dumps({"program_id": f"agent-{i}", "turns": turns}) + "\n")
    for arm in ("bandmaster", "kv", "oracle"):
        code = sim.main(
            [
                "--arm",
                arm,
                "--trace",
                str(path),
                "--split",
                "all",
                "--draw",
                "random",
                "--include-longest",
                "--programs",
                "5",
                "--workers",
                "2",
                "--worker-kv-tokens",
                "4096",
                "--seed",
                "1",
            ]
        )
        assert code == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["arm"] == arm and summary["turns_ok"] == 20 and summary["turns_failed"] == 0


def test_a_malformed_trace_exits_2_naming_the_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"program_id": "a", "turns": [{"input_tokens": 9}]}) + "\n")
    assert sim.main(["--arm", "kv", "--trace", str(path), "--split", "all"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:1" in err and "turns[0] has no output_tokens" in err


def test_the_split_and_draw_are_part_of_the_scenario():
    tune = SimScenario(workload="swe", programs=12)
    held = dataclasses.replace(tune, split="heldout", draw="random", include_longest=True)
    tune_ids = {p.program_id.split("#")[0] for p in tune.build_programs()}
    held_programs = held.build_programs()
    assert not tune_ids & {p.program_id.split("#")[0] for p in held_programs}
    assert max(len(p.turns) for p in held_programs) == 138
    with pytest.raises(ConfigError, match="split in"):
        SimScenario(split="train")
