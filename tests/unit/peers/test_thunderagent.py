"""ThunderAgent's policy core (harness/peers/thunderagent.py): admission, pause order, marks, restore
order, λ, the 2^-t decay and the forced resume, as tables."""

from __future__ import annotations

import pytest

from harness.peers import ThunderAgentCore, ThunderAgentParams, Wake
from harness.peers.thunderagent import TaProgram
from services.common.settings.errors import ConfigError

B = 100  # the buffer per program


def core(capacities=(10_000,), **params) -> ThunderAgentCore:
    return ThunderAgentCore(ThunderAgentParams(**params), capacities)


def acting(c: ThunderAgentCore, pid: str, tokens: int, now: float = 0.0) -> int | None:
    """A program that ran one turn of `tokens` context and is now in a tool call."""
    backend = c.begin_turn(now, pid, tokens)
    c.end_turn(now, pid, tokens - 10, 10)
    return backend


def test_new_programs_go_to_the_backend_with_most_room():
    c = core((10_000, 10_000))
    assert acting(c, "a", 3_000) == 0
    assert c.begin_turn(0, "b", 1_000) == 1  # backend 1 is empty
    assert c.begin_turn(0, "c", 1_000) == 1  # 10,000 - 1,100 > 10,000 - 3,100
    assert c.begin_turn(1, "a", 3_500) == 0  # pinned: later turns stay on their backend


@pytest.mark.parametrize(
    "first, second, queued",
    [
        (4_000, 5_000, False),  # 4,100 + 5,100 <= 10,000
        (4_000, 5_801, True),  # 4,100 + 5,901 > 10,000: no room, the new program queues
    ],
)
def test_a_new_program_that_does_not_fit_queues(first, second, queued):
    c = core()
    acting(c, "a", first)
    assert (c.begin_turn(0, "b", second) is None) is queued
    assert (c.queue == ["b"]) is queued


def test_a_new_program_queues_behind_paused_work_even_with_room():
    c = core((10_000, 10_000))
    acting(c, "a", 9_000)
    acting(c, "b", 9_000)
    acting(c, "x", 2_000)  # 900 tokens of room left on either backend: x queues
    assert c.queue == ["x"]
    assert c.begin_turn(0, "y", 10) is None
    assert c.queue == ["x", "y"]


@pytest.mark.parametrize(
    "programs, expected",
    [
        # (id, tokens, acting): acting first, then the shortest (S_pause = 1/c + 1[acting])
        ([("r1", 1_000, False), ("a1", 3_000, True), ("a2", 2_000, True)], ["a2", "a1", "r1"]),
        ([("r1", 500, False), ("r2", 400, False)], ["r2", "r1"]),
        ([("a1", 5_000, True), ("r1", 100, False)], ["a1", "r1"]),
    ],
)
def test_pause_order(programs, expected):
    c = core((100_000,))
    for pid, tokens, is_acting in programs:
        c.begin_turn(0, pid, tokens)
        if is_acting:
            c.end_turn(0, pid, tokens, 0)
    assert c.pause_order(0) == expected


def test_the_monitor_pauses_acting_programs_first_until_the_backend_fits():
    c = core((10_000,))
    acting(c, "a", 2_000)
    acting(c, "b", 3_000)
    c.begin_turn(0, "r", 3_000)  # reasoning (turn in flight)
    # Turns grow: a new turn of b and the in-flight r push the backend past λ·C.
    c.programs["r"].tokens = 6_000
    assert c.used(0, 0) == 2_100 + 3_100 + 6_100  # 11,300 > 10,000
    c.tick(0)
    # The shortest acting program (a) frees 2,100: 9,200 <= 10,000, so b stays.
    assert c.queue == ["a"] and c.programs["a"].paused and not c.programs["b"].paused
    assert c.pauses_total == 1 and c.marks_total == 0


def test_reasoning_programs_are_marked_and_pause_at_their_tool_boundary():
    c = core((10_000,))
    c.begin_turn(0, "r", 4_000)
    c.begin_turn(0, "s", 4_000)
    c.programs["r"].tokens = c.programs["s"].tokens = 6_000  # both grew while reasoning
    c.tick(0)
    assert c.marks_total == 1 and c.pauses_total == 0  # marking one frees enough (6,100)
    marked = [p for p in c.programs.values() if p.marked]
    assert len(marked) == 1
    pid = marked[0].program_id
    assert c.end_turn(1, pid, 6_000, 10) == []
    assert c.programs[pid].paused and c.queue == [pid] and c.pauses_total == 1


@pytest.mark.parametrize("fraction, pauses", [(1.0, 0), (0.8, 1)])
def test_lambda_sets_the_working_set_the_monitor_keeps(fraction, pauses):
    c = core((10_000,), capacity_fraction=fraction)
    c.begin_turn(0, "a", 3_000)
    c.end_turn(0, "a", 3_000, 0)
    c.begin_turn(0, "b", 4_000)  # 3,100 + 4,100 fits 8,000
    c.end_turn(0, "b", 4_000, 0)
    c.programs["a"].tokens = 4_500  # 8,700 in use: > 8,000 only
    c.tick(0)
    assert c.pauses_total == pauses


def test_restore_order_waiting_programs_first_then_the_shortest():
    c = core((10_000,))
    for pid, tokens, waiting in (
        ("big", 3_000, False),
        ("small", 1_000, False),
        ("w2", 2_500, True),
        ("w1", 900, True),
    ):
        c.programs[pid] = TaProgram(pid, tokens, acting=not waiting, paused=True, waiting=waiting)
        c.queue.append(pid)
    assert c.restore_order() == ["w1", "w2", "small", "big"]


def test_restore_goes_to_the_backend_with_most_decayed_room_and_skips_what_does_not_fit():
    c = core((10_000, 10_000))
    acting(c, "a", 6_000, now=0)  # backend 0
    acting(c, "b", 8_000, now=0)  # backend 1

    c.programs["w"] = TaProgram("w", 9_000, paused=True, waiting=True)
    c.programs["v"] = TaProgram("v", 3_000, paused=True, waiting=True)
    c.queue += ["w", "v"]
    # At t = 0 the rooms are 3,900 and 1,900: w (9,100) does not fit, v (3,100) goes to backend 0.
    assert c.tick(0) == [Wake("v", 0)]
    assert c.queue == ["w"]
    # 3 s into their tools a and b count 2^-3 of their tokens: backend 1 has 10,000 - 1,100 = 8,900 room
    # (raw: 1,900), backend 0 has 10,000 - 850 - 3,100 = 6,050: w still needs 9,100.
    assert c.tick(3) == []
    # At t = 10 backend 1 counts ~108 tokens for b: room 9,892 >= 9,100.
    assert c.tick(10) == [Wake("w", 1)]


@pytest.mark.parametrize("half_life, t, expected", [(1.0, 0, 8_000), (1.0, 1, 4_000), (1.0, 3, 1_000), (2.0, 2, 4_000)])
def test_acting_tokens_decay_by_two_to_the_minus_t(half_life, t, expected):
    c = core(decay_half_life_s=half_life, buffer_tokens_per_program=0)
    c.begin_turn(0, "a", 8_000)
    c.end_turn(0, "a", 8_000, 0)
    assert c.used(0, t, decayed=True) == pytest.approx(expected)
    assert c.used(0, t) == 8_000  # the thrashing check counts raw tokens


def test_a_program_paused_longer_than_the_bound_is_force_resumed():
    c = core((10_000,), force_resume_s=1_800)
    c.begin_turn(0, "a", 9_500)  # a long turn in flight: its tokens never decay
    assert c.begin_turn(0, "b", 5_000) is None
    assert c.tick(1_799) == []
    assert c.tick(1_800) == [Wake("b", 0)]
    assert c.forced_resumes_total == 1 and c.queue == []


def test_release_forgets_the_program_and_frees_its_room():
    c = core()
    acting(c, "a", 9_500)
    assert c.begin_turn(0, "b", 5_000) is None
    c.release(1, "b")
    assert c.queue == [] and "b" not in c.programs
    c.release(1, "a")
    assert c.used(0, 1) == 0


@pytest.mark.parametrize(
    "field, value",
    [
        ("monitor_interval_s", 0),
        ("capacity_fraction", 0),
        ("capacity_fraction", 1.5),
        ("decay_half_life_s", 0),
        ("buffer_tokens_per_program", -1),
        ("force_resume_s", 0),
    ],
)
def test_invalid_params_name_the_rule(field, value):
    with pytest.raises(ConfigError) as exc:
        ThunderAgentParams(**{field: value})
    assert exc.value.field == field
