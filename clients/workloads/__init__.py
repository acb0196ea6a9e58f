"""Agent workloads: programs as lists of turns (prompt tokens, output tokens, tool seconds after).

Sources: the real SWE-agent trace shipped in `data/` (`swe_agent_programs()`) or any trace file in
its format (`load_trace`, `trace_programs`), and synthetic generators (`synthetic_like` with the
trace's statistics, `short_context_agents` for the short-context tool-agent workload). Which
programs a run plays: the fixed held-out split (`split_programs`) and stratified or random draws
(`draw_programs`), in `draws.py`. A turn re-sends the whole growing conversation, as agents do;
the runner and the simulator build the prompts from these figures.
"""

from clients.workloads.draws import (
    DEFAULT_DRAW,
    DEFAULT_SPLIT,
    DRAWS,
    SPLITS,
    draw_programs,
    is_held_out,
    longest_program,
    split_programs,
    stratified_programs,
)
from clients.workloads.model import Program, Turn, scale, summarize
from clients.workloads.synthetic import short_context_agents, synthetic_like
from clients.workloads.traces import load_trace, swe_agent_programs, trace_programs

__all__ = [
    "DEFAULT_DRAW",
    "DEFAULT_SPLIT",
    "DRAWS",
    "SPLITS",
    "Program",
    "Turn",
    "draw_programs",
    "is_held_out",
    "load_trace",
    "longest_program",
    "scale",
    "short_context_agents",
    "split_programs",
    "stratified_programs",
    "summarize",
    "swe_agent_programs",
    "synthetic_like",
    "trace_programs",
]
