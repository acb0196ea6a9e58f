"""The offline simulator's parts: scenario, conversation (prompt building), and the event loop."""

from bench.simlib.scenario import SimScenario, live_control_params
from bench.simlib.simulator import SimResult, Simulator, simulate

__all__ = ["SimResult", "SimScenario", "Simulator", "live_control_params", "simulate"]
