"""The offline simulator's parts: scenario, conversation (prompt building), and the event loop."""

from harness.simlib.scenario import SimScenario, live_control_params
from harness.simlib.simulator import SimResult, Simulator, simulate

__all__ = ["SimResult", "SimScenario", "Simulator", "live_control_params", "simulate"]
