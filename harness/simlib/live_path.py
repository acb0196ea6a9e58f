"""What a turn costs on the live path outside the engine: the simulator's model of it.

A live run sends every turn through processes the simulator otherwise leaves out: the client
serialises the whole conversation, the router reads and parses it, asks the scheduler, re-serialises
it to the worker, the simworker parses it, renders the chat template and tokenises the whole prompt,
and the answer is relayed back chunk by chunk. Each of these is CPU work in wall seconds; against
simworkers at `--speedup S` each wall second is S simulated ones (the engine runs S times faster
than the hardware it models, the path does not). `SimScenario.live_path` applies them where they
happen in the event loop (harness/simlib/simulator.py), in simulated seconds = wall x live_speedup:

    client_send + router_parse (+ admission_round_trip, Bandmaster)   before the admission call
    router_to_worker + worker_parse                                   between the pick and the engine
    relay                                                             after the last token, before
                                                                      the client sees the answer

Each phase costs `base_s + per_prompt_token_s * prompt tokens + per_output_token_s * output tokens`
(wall seconds). The phases are those of bench/breakdown.py, which measures them live from the spans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from services.common.config import require


@dataclass(frozen=True)
class PhaseCost:
    """One phase's wall seconds per turn: fixed, per prompt token and per output token."""

    base_s: float = 0.0
    per_prompt_token_s: float = 0.0
    per_output_token_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            require(math.isfinite(value) and value >= 0, f.name, value, f"{f.name} >= 0")

    def wall_s(self, prompt_tokens: int, output_tokens: int = 0) -> float:
        return self.base_s + self.per_prompt_token_s * prompt_tokens + self.per_output_token_s * output_tokens


@dataclass(frozen=True)
class LivePathCosts:
    """Per-turn wall costs of the live stack, by phase (bench/breakdown.py's names).

    The defaults are calibrated on this project's reference measurement (docs/simulator.md, "The live
    path"): `bandmaster up --workers 2 --worker-kv-tokens 65536 --speedup 4` on the 2-core machine,
    SWE programs from the tuning split at full token counts, span files joined by bench.breakdown."""

    client_send: PhaseCost = field(default_factory=PhaseCost)
    """The client serialises the conversation, the router accepts the connection and reads the body."""
    router_parse: PhaseCost = field(default_factory=PhaseCost)
    """The router parses the body and builds the turn (before its admission call)."""
    admission_round_trip: PhaseCost = field(default_factory=PhaseCost)
    """The scheduler's AdmitStream round trip when the program is not held (Bandmaster only)."""
    router_to_worker: PhaseCost = field(default_factory=PhaseCost)
    """The pick and the request to the worker, until the simworker's handler starts."""
    worker_parse: PhaseCost = field(default_factory=PhaseCost)
    """The simworker parses the body, renders the chat template and tokenises the prompt."""
    relay: PhaseCost = field(default_factory=PhaseCost)
    """From the engine's last token until the client has read the end of the answer."""

    def before_admission_wall_s(self, prompt_tokens: int, scheduled: bool) -> float:
        cost = self.client_send.wall_s(prompt_tokens) + self.router_parse.wall_s(prompt_tokens)
        return cost + (self.admission_round_trip.wall_s(prompt_tokens) if scheduled else 0.0)

    def dispatch_wall_s(self, prompt_tokens: int) -> float:
        return self.router_to_worker.wall_s(prompt_tokens) + self.worker_parse.wall_s(prompt_tokens)

    def relay_wall_s(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.relay.wall_s(prompt_tokens, output_tokens)
