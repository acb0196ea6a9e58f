import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.workloads import scale, short_context_agents, summarize, swe_agent_programs, synthetic_like
from services.common.settings.errors import ConfigError


def test_trace_matches_published_summary():
    """The shipped workload reproduces shared/traces/README.md's summary table."""
    programs = swe_agent_programs()
    stats = summarize(programs)
    assert stats["programs"] == 66
    assert stats["turns"] == 2854
    assert stats["turns_per_program_median"] == 40
    assert stats["input_tokens_median"] == pytest.approx(21_412)
    assert stats["output_tokens_median"] == 126
    assert stats["tool_seconds_median"] == pytest.approx(0.667, abs=1e-3)
    assert stats["peak_context_median"] == pytest.approx(39_412, rel=0.01)
    assert {p.run_concurrency for p in programs} == {1, 4, 32}
    assert len(swe_agent_programs(concurrency=32)) == 32


def test_trace_prompts_grow_by_appending():
    for program in swe_agent_programs():
        for k in range(1, len(program.turns)):
            assert program.new_prompt_tokens(k) >= 1
        assert program.turns[-1].tool_seconds_after == 0


def test_synthetic_like_has_trace_statistics():
    stats = summarize(synthetic_like(300, seed=3))
    reference = summarize(swe_agent_programs())
    for key in ("input_tokens_median", "output_tokens_median", "tool_seconds_median", "turns_per_program_median"):
        assert stats[key] == pytest.approx(reference[key], rel=0.2), key


def test_synthetic_is_deterministic_per_seed():
    assert synthetic_like(5, seed=7) == synthetic_like(5, seed=7)
    assert synthetic_like(5, seed=7) != synthetic_like(5, seed=8)


def test_short_context_agents_respect_ranges():
    programs = short_context_agents(50, turns=8, seed=2)
    for program in programs:
        assert len(program.turns) == 8
        for k, turn in enumerate(program.turns):
            assert 1_000 <= turn.input_tokens <= 4_000
            assert 100 <= turn.output_tokens <= 200
            if k < 7:
                assert 0.5 <= turn.tool_seconds_after <= 3.0
                nxt = program.turns[k + 1]
                assert nxt.input_tokens > turn.input_tokens + turn.output_tokens


@settings(max_examples=40, deadline=None)
@given(token_scale=st.floats(0.01, 4.0), tool_scale=st.floats(0, 4.0), max_turns=st.integers(1, 50))
def test_scale_keeps_append_structure(token_scale, tool_scale, max_turns):
    for program in scale(
        swe_agent_programs()[:5], token_scale=token_scale, tool_time_scale=tool_scale, max_turns=max_turns
    ):
        assert len(program.turns) <= max_turns
        assert program.turns[-1].tool_seconds_after == 0
        for a, b in zip(program.turns, program.turns[1:]):
            assert b.input_tokens > a.input_tokens + a.output_tokens - 1


@pytest.mark.parametrize("kwargs", [{"token_scale": 0}, {"tool_time_scale": -1}, {"max_turns": 0}])
def test_scale_rejects_bad_knobs(kwargs):
    with pytest.raises(ConfigError):
        scale(swe_agent_programs()[:1], **kwargs)


def test_stratified_selection_keeps_the_size_mix_at_every_count():
    from clients.workloads import stratified_programs

    source = swe_agent_programs()
    reference = summarize(source)["peak_context_median"]
    for count in (6, 12, 24, 40):
        chosen = stratified_programs(source, count, seed=0)
        assert len(chosen) == count
        assert summarize(chosen)["peak_context_median"] == pytest.approx(reference, rel=0.15)
    everything = stratified_programs(source, len(source) + 3, seed=1)
    assert {p.program_id for p in source} <= {p.program_id for p in everything}
    assert stratified_programs(source, 10, seed=2) == stratified_programs(source, 10, seed=2)
