"""Agent workloads: programs as lists of turns (prompt tokens, output tokens, tool seconds after).

Two sources: the real SWE-agent trace shipped in `data/` (`swe_agent_programs()`), and synthetic
generators (`synthetic_like` with the trace's statistics, `short_context_agents` for the
short-context tool-agent workload). A turn re-sends the whole growing conversation, as agents do;
the runner and the simulator build the prompts from these figures.
"""

from bench.workloads.model import Program, Turn, scale, summarize
from bench.workloads.synthetic import short_context_agents, synthetic_like
from bench.workloads.traces import swe_agent_programs

__all__ = ["Program", "Turn", "scale", "summarize", "short_context_agents", "synthetic_like", "swe_agent_programs"]
