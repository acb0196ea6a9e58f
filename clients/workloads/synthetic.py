"""Synthetic programs: the trace's statistics at any count, and short-context tool agents."""

from __future__ import annotations

import random
from typing import Sequence

from clients.workloads.model import Program, Turn
from clients.workloads.traces import swe_agent_programs
from services.common.settings.config import require


def synthetic_like(n_programs: int, *, seed: int = 0, source: Sequence[Program] | None = None) -> list[Program]:
    """Programs drawn from the empirical distributions of `source` (default: the SWE-agent trace).

    Per program: the number of turns and the first prompt are drawn from the source programs;
    per turn: the new observation size, the output size and the tool time are drawn from the source
    turns. Prompts therefore grow by appending, as in the trace, and the marginal statistics match."""
    require(n_programs >= 1, "n_programs", n_programs, "n_programs >= 1")
    source = list(source or swe_agent_programs())
    rng = random.Random(seed)
    turn_counts = [len(p.turns) for p in source]
    first_prompts = [p.turns[0].input_tokens for p in source]
    growth = [p.new_prompt_tokens(k) for p in source for k in range(1, len(p.turns))]
    outputs = [t.output_tokens for p in source for t in p.turns]
    tools = [t.tool_seconds_after for p in source for t in p.turns[:-1]]
    programs = []
    for i in range(n_programs):
        n_turns = rng.choice(turn_counts)
        prompt = rng.choice(first_prompts)
        turns: list[Turn] = []
        for k in range(n_turns):
            if k:
                prompt = prompt + turns[-1].output_tokens + rng.choice(growth)
            last = k == n_turns - 1
            turns.append(Turn(prompt, rng.choice(outputs), 0.0 if last else rng.choice(tools)))
        programs.append(Program(f"syn-{seed}-{i}", tuple(turns)))
    return programs


def short_context_agents(
    n_programs: int,
    *,
    turns: int = 8,
    seed: int = 0,
    prompt_tokens: tuple[int, int] = (1_000, 4_000),
    output_tokens: tuple[int, int] = (100, 200),
    tool_seconds: tuple[float, float] = (0.5, 3.0),
) -> list[Program]:
    """Short-context tool agents: prompts of 1-4K tokens, 100-200 output tokens, tools of 0.5-3 s.

    The first prompt is drawn from the lower part of the range and later turns append observations
    so that the last turn stays within `prompt_tokens[1]`: recompute is cheap here, which is what
    makes pausing costly relative to plain KV-aware routing."""
    require(n_programs >= 1 and turns >= 1, "n_programs", n_programs, "n_programs >= 1 and turns >= 1")
    lo, hi = prompt_tokens
    require(1 <= lo <= hi, "prompt_tokens", prompt_tokens, "1 <= min <= max")
    rng = random.Random(seed)
    programs = []
    for i in range(n_programs):
        outputs = [rng.randint(*output_tokens) for _ in range(turns)]
        last_prompt = rng.randint((lo + hi) // 2, hi)
        prompt = rng.randint(lo, max(lo, min(hi, last_prompt - sum(outputs[:-1]) - 50 * (turns - 1))))
        growth_budget = max(0, last_prompt - prompt - sum(outputs[:-1]))
        cuts = sorted(rng.randint(0, growth_budget) for _ in range(max(0, turns - 1)))
        steps = [b - a for a, b in zip([0, *cuts], [*cuts, growth_budget])][: turns - 1]
        program_turns = []
        for k in range(turns):
            if k:
                prompt = prompt + outputs[k - 1] + max(1, steps[k - 1])
            last = k == turns - 1
            program_turns.append(Turn(prompt, outputs[k], 0.0 if last else rng.uniform(*tool_seconds)))
        programs.append(Program(f"short-{seed}-{i}", tuple(program_turns)))
    return programs
