"""The workload data model and the knobs that scale it."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Sequence

from clients.stats import interpolated_percentile
from services.common.settings.config import require


@dataclass(frozen=True)
class Turn:
    input_tokens: int
    """The whole prompt of this turn: everything before plus the new observation."""
    output_tokens: int
    tool_seconds_after: float
    """Time the agent spends outside the LLM before its next turn (0 for the last turn)."""

    def __post_init__(self) -> None:
        require(self.input_tokens >= 1, "input_tokens", self.input_tokens, "input_tokens >= 1")
        require(self.output_tokens >= 1, "output_tokens", self.output_tokens, "output_tokens >= 1")
        require(
            self.tool_seconds_after >= 0 and math.isfinite(self.tool_seconds_after),
            "tool_seconds_after",
            self.tool_seconds_after,
            "tool_seconds_after >= 0",
        )


@dataclass(frozen=True)
class Program:
    program_id: str
    turns: tuple[Turn, ...]
    run_concurrency: int = 0
    """Concurrency of the recorded run (0 for synthetic programs)."""

    def __post_init__(self) -> None:
        require(len(self.turns) >= 1, "turns", len(self.turns), "a program has at least one turn")

    @property
    def peak_context_tokens(self) -> int:
        return max(t.input_tokens + t.output_tokens for t in self.turns)

    def new_prompt_tokens(self, k: int) -> int:
        """Tokens turn k adds beyond turn k-1's prompt and output (the new observation)."""
        if k == 0:
            return self.turns[0].input_tokens
        prev = self.turns[k - 1]
        return max(1, self.turns[k].input_tokens - prev.input_tokens - prev.output_tokens)


def scale(
    programs: Sequence[Program],
    *,
    token_scale: float = 1.0,
    tool_time_scale: float = 1.0,
    max_turns: int | None = None,
    suffix: str = "",
) -> list[Program]:
    """Scale token counts and tool times, and optionally truncate programs to `max_turns` turns.

    Token scaling keeps the append-only structure: every prompt still extends the previous prompt
    plus its output, because all three figures scale together (rounded, and at least 1)."""
    require(token_scale > 0, "token_scale", token_scale, "token_scale > 0")
    require(tool_time_scale >= 0, "tool_time_scale", tool_time_scale, "tool_time_scale >= 0")
    require(max_turns is None or max_turns >= 1, "max_turns", max_turns, "max_turns >= 1")
    out = []
    for program in programs:
        turns = program.turns[:max_turns] if max_turns else program.turns
        scaled = []
        floor = 0
        for k, turn in enumerate(turns):
            output = max(1, round(turn.output_tokens * token_scale))
            prompt = max(floor + 1, round(turn.input_tokens * token_scale))
            tool = 0.0 if k == len(turns) - 1 else turn.tool_seconds_after * tool_time_scale
            scaled.append(Turn(prompt, output, tool))
            floor = prompt + output
        out.append(replace(program, program_id=program.program_id + suffix, turns=tuple(scaled)))
    return out


def summarize(programs: Sequence[Program]) -> dict:
    """Statistics in the shape of shared/traces/README.md's summary table."""

    turns = [t for p in programs for t in p.turns]
    tools = [t.tool_seconds_after for p in programs for t in p.turns[:-1]]
    return {
        "programs": len(programs),
        "turns": len(turns),
        "turns_per_program_median": statistics.median(len(p.turns) for p in programs) if programs else 0,
        "input_tokens_median": interpolated_percentile([t.input_tokens for t in turns], 0.5),
        "input_tokens_p90": interpolated_percentile([t.input_tokens for t in turns], 0.9),
        "output_tokens_median": interpolated_percentile([t.output_tokens for t in turns], 0.5),
        "output_tokens_mean": statistics.fmean(t.output_tokens for t in turns) if turns else 0.0,
        "tool_seconds_median": interpolated_percentile(tools, 0.5),
        "tool_seconds_p90": interpolated_percentile(tools, 0.9),
        "peak_context_median": interpolated_percentile([p.peak_context_tokens for p in programs], 0.5),
    }
