"""The peer arms in the simulator (harness/peers through harness/simlib): they complete, are
deterministic, and hold, pause and pin as their cores decide."""

from __future__ import annotations

import pytest

from harness.simlib import SimScenario, simulate
from harness.simlib.scenario import ARMS, PEER_ARMS

# SWE programs at about 3x the two small pools: ThunderAgent must pause, Continuum must queue.
PRESSURE = dict(
    workload="swe", programs=6, max_turns=8, workers=2, worker_kv_tokens=16_384, router_prompt="tokens", seed=1
)


def _essential(result) -> dict:
    return {
        "summary": {k: v for k, v in result.summary().items() if not k.startswith("sim_")},
        "workers": result.worker_counters,
        "scheduler": result.scheduler_counters,
        "turns": result.run.turns,
    }


def test_the_peer_arms_are_registered():
    assert set(PEER_ARMS) <= set(ARMS)
    assert SimScenario(arm="kv").make_peer() is None


@pytest.mark.parametrize("arm", PEER_ARMS)
def test_a_peer_arm_completes_deterministically(arm):
    scenario = SimScenario(arm=arm, **PRESSURE)
    first = simulate(scenario)
    summary = first.summary()
    assert first.completed and summary["turns_failed"] == 0
    assert summary["programs_done"] == 6 and summary["turns_ok"] == 48
    assert _essential(first) == _essential(simulate(scenario))


def test_thunderagent_pauses_marks_and_restores_under_pressure():
    result = simulate(SimScenario(arm="thunderagent", **PRESSURE))
    counters = result.scheduler_counters
    assert counters["pauses"] + counters["queued_new"] >= 1, counters
    assert counters["held_admissions"] >= 1 and counters["resumes"] >= 1
    assert counters["paused_now"] == 0  # everything was restored before the end
    # Its pauses, resumes and marks are the timeline's control events, as the scheduler's are.
    kinds = [e[1] for e in result.timeline["control_events"]]
    assert kinds.count("pause") == counters["pauses"] and kinds.count("mark") == counters["marks"]
    assert kinds.count("resume") + kinds.count("forced_resume") == counters["resumes"]


def test_thunderagent_without_pressure_never_holds():
    counters = simulate(
        SimScenario(arm="thunderagent", **{**PRESSURE, "worker_kv_tokens": 1_000_000})
    ).scheduler_counters
    assert counters["pauses"] == counters["marks"] == counters["held_admissions"] == 0


def test_continuum_pins_tool_calls_and_returns_to_the_pin():
    counters = simulate(SimScenario(arm="continuum", **PRESSURE)).scheduler_counters
    # A turn's end pins its context unless the program's tools average past the break-even (a few
    # do here); the last turn's pin lasts until the final request releases it.
    assert 36 <= counters["pins"] <= 48, counters
    assert counters["pin_hits"] >= 1 and counters["queued_now"] == 0


def test_the_peer_arms_are_scored_on_the_same_programs_as_kv():
    kv = simulate(SimScenario(arm="kv", **PRESSURE)).run.turns
    peer = simulate(SimScenario(arm="thunderagent", **PRESSURE)).run.turns
    assert sorted((t.program_id, t.turn, t.completion_tokens) for t in kv) == sorted(
        (t.program_id, t.turn, t.completion_tokens) for t in peer
    )
