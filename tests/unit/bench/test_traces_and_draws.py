"""clients/workloads: trace files (`load_trace`), the held-out split and the draws."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from clients.player import build_workload
from clients.workloads import (
    draw_programs,
    is_held_out,
    load_trace,
    longest_program,
    split_programs,
    swe_agent_programs,
    trace_programs,
)
from clients.workloads.model import Program, Turn
from services.common.settings.errors import ConfigError

SHARED_TRACE = Path("/work/shared/traces/swe_agent_trace.jsonl")


def _line(program_id: str = "p", turns=None, **extra) -> str:
    turns = (
        turns
        if turns is not None
        else [
            {"input_tokens": 500, "output_tokens": 40, "tool_seconds_after": 0.5},
            {"input_tokens": 900, "output_tokens": 0, "tool_seconds_after": 0.0},
        ]
    )
    return json.dumps({"program_id": program_id, "turns": turns, **extra})


def _write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------------- trace files


def test_a_trace_file_reads_into_programs(tmp_path):
    path = _write(tmp_path, _line("a", run_concurrency=4, task="x", llm_seconds=3.0), "", _line("b"))
    a, b = load_trace(path)
    assert a.program_id == "a" and a.run_concurrency == 4 and b.run_concurrency == 0
    # An output of 0 tokens counts as 1: every call generates at least its end token.
    assert a.turns == (Turn(500, 40, 0.5), Turn(900, 1, 0.0))


@pytest.mark.parametrize(
    "line, rule",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "one JSON object per line"),
        (_line(""), "program_id=''"),
        (json.dumps({"turns": []}), "program_id=None"),
        (_line(turns=[]), "turns: expected a non-empty list"),
        (_line(turns=[{"input_tokens": 5, "output_tokens": 1}]), "turns[0] has no tool_seconds_after"),
        (_line(turns=[{"input_tokens": 0, "output_tokens": 1, "tool_seconds_after": 0}]), "turns[0].input_tokens=0"),
        (_line(turns=[{"input_tokens": 5.5, "output_tokens": 1, "tool_seconds_after": 0}]), "input_tokens=5.5"),
        (_line(turns=[{"input_tokens": 5, "output_tokens": -1, "tool_seconds_after": 0}]), "output_tokens=-1"),
        (_line(turns=[{"input_tokens": 5, "output_tokens": True, "tool_seconds_after": 0}]), "output_tokens=True"),
        (_line(turns=[{"input_tokens": 5, "output_tokens": 1, "tool_seconds_after": -2}]), "tool_seconds_after=-2"),
        (_line(turns=[{"input_tokens": 5, "output_tokens": 1, "tool_seconds_after": "1"}]), "tool_seconds_after='1'"),
        (_line(turns=[7]), "turns[0] is not an object"),
        (_line(run_concurrency=-1), "run_concurrency=-1"),
    ],
)
def test_a_malformed_line_is_refused_naming_the_line_and_the_rule(tmp_path, line, rule):
    path = _write(tmp_path, _line("ok"), line)
    with pytest.raises(ConfigError) as info:
        load_trace(path)
    assert info.value.field == "trace" and info.value.value == f"{path}:2"
    assert rule in info.value.reason


def test_repeated_ids_missing_and_empty_files_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="repeats line 1"):
        load_trace(_write(tmp_path, _line("a"), _line("a")))
    with pytest.raises(ConfigError, match="holds no programs"):
        load_trace(_write(tmp_path, "", "  "))
    with pytest.raises(ConfigError, match="cannot read"):
        load_trace(tmp_path / "missing.jsonl")


def test_an_edited_trace_file_is_read_again(tmp_path):
    path = _write(tmp_path, _line("a"))
    assert [p.program_id for p in load_trace(path)] == ["a"]
    _write(tmp_path, _line("a"), _line("bb"))
    assert [p.program_id for p in load_trace(path)] == ["a", "bb"]


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="the shared trace is not on this machine")
def test_the_shared_trace_reads_into_the_shipped_programs():
    from_file = load_trace(SHARED_TRACE)
    shipped = swe_agent_programs()
    assert [p.turns for p in from_file] == [p.turns for p in shipped]


# ------------------------------------------------------------------------------------ split


def test_the_split_is_the_id_hash_mod_3():
    for program in swe_agent_programs():
        expected = int(hashlib.sha256(program.program_id.encode()).hexdigest(), 16) % 3 == 0
        assert is_held_out(program.program_id) == expected


def test_the_shipped_trace_splits_21_held_out_45_tuning_with_the_longest_held_out():
    programs = swe_agent_programs()
    held, tune = split_programs(programs, "heldout"), split_programs(programs, "tune")
    assert (len(held), len(tune), len(split_programs(programs, "all"))) == (21, 45, 66)
    assert not {p.program_id for p in held} & {p.program_id for p in tune}
    assert len(longest_program(held).turns) == 138 == max(len(p.turns) for p in programs)
    assert len(longest_program(tune).turns) == 88


def test_an_unknown_split_or_an_empty_part_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="split in"):
        split_programs(swe_agent_programs(), "train")
    # One program only: one of the two parts is empty.
    path = _write(tmp_path, _line("only"))
    empty = "tune" if is_held_out("only") else "heldout"
    with pytest.raises(ConfigError, match="holds no programs"):
        build_workload("swe", 2, seed=0, max_turns=None, token_scale=1.0, tool_time_scale=1.0, trace=path, split=empty)


def test_the_default_workload_draws_from_the_tuning_part():
    ids = {
        p.program_id.split("#")[0]
        for p in build_workload("swe", 66, seed=0, max_turns=None, token_scale=1.0, tool_time_scale=1.0)
    }
    assert ids == {p.program_id for p in split_programs(swe_agent_programs(), "tune")}
    assert trace_programs(None) == swe_agent_programs()


# ------------------------------------------------------------------------------------ draws


def _programs(n: int) -> list[Program]:
    return [Program(f"p{i}", tuple(Turn(100 * (k + 1), 5, 0.1) for k in range(i + 1))) for i in range(n)]


def test_random_draws_sample_with_replacement_per_seed():
    source = _programs(5)
    a = draw_programs(source, 40, draw="random", seed=1)
    assert a == draw_programs(source, 40, draw="random", seed=1)
    assert a != draw_programs(source, 40, draw="random", seed=2)
    assert len({p.program_id for p in a}) < len(a)  # repeats
    assert {p.program_id for p in a} <= {p.program_id for p in source}


@pytest.mark.parametrize("draw", ["random", "stratified"])
def test_include_longest_puts_the_longest_program_in_every_draw(draw):
    source = _programs(30)
    for seed in range(10):
        chosen = draw_programs(source, 3, draw=draw, seed=seed, include_longest=True)
        assert len(chosen) == 3 and "p29" in [p.program_id for p in chosen]
        without = draw_programs(source, 3, draw=draw, seed=seed)
        assert sum(a != b for a, b in zip(chosen, without)) <= 1  # one program replaced, if any


def test_longest_is_most_turns_then_most_work():
    a = Program("a", (Turn(10, 1, 0.0), Turn(20, 1, 0.0)))
    b = Program("b", (Turn(10, 1, 0.0), Turn(900, 1, 0.0)))
    c = Program("c", (Turn(5000, 1, 0.0),))
    assert longest_program([a, b, c]) is b


def test_an_unknown_draw_is_refused():
    with pytest.raises(ConfigError, match="draw in"):
        draw_programs(_programs(3), 2, draw="sorted")
