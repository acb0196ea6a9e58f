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

from services.common.settings.config import require


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

    The defaults are the means measured by bench.breakdown on this project's reference point
    (docs/simulator.md, "The live path"): 2 simworkers of 65,536 KV tokens at --speedup 4 on the shared
    2-core machine, 24 SWE programs of the tuning split x their first 16 turns at full token counts
    (prompts 0.4K-27K tokens, median 9.6K), the kv and Bandmaster arms, simworkers that run their
    steps back to back (services/simworker/driver.py), the machine's load average at 4-6. They are
    contention more than work: they vary with the machine's load more than with the prompt, so they
    are fixed costs here; the simworker's tokenizing, which grew with the prompt (~0.45 ms per 1K
    tokens), now covers only a turn's new messages (~0.04 ms per 1K tokens of prompt)."""

    client_send: PhaseCost = field(default_factory=lambda: PhaseCost(base_s=0.005))
    """The client serialises the conversation, the router accepts the connection and reads the body
    (measured 6.0 ms kv, 4.7 ms Bandmaster)."""
    router_parse: PhaseCost = field(default_factory=lambda: PhaseCost(base_s=0.0008))
    """The router parses the body and builds the turn, before its admission call (0.9 / 0.7 ms)."""
    admission_round_trip: PhaseCost = field(default_factory=lambda: PhaseCost(base_s=0.010))
    """The scheduler's AdmitStream round trip, less any time held (Bandmaster only; 10.0 ms, p50 4.3 ms)."""
    router_to_worker: PhaseCost = field(default_factory=lambda: PhaseCost(base_s=0.008))
    """The pick and the request to the worker, until the simworker's handler starts (9.3 / 6.4 ms)."""
    worker_parse: PhaseCost = field(default_factory=lambda: PhaseCost(base_s=0.004, per_prompt_token_s=4e-8))
    """The simworker parses the body, renders the chat template and tokenises the new messages, its
    modelled frontend sleep overshoots and its loop's lag (4.3 ms with the tokenizer's cache at load
    ~2; 9.0 / 9.4 ms before it, at load 4-6, of which ~4.5 ms tokenizing a ~10K-token prompt)."""
    relay: PhaseCost = field(default_factory=lambda: PhaseCost(base_s=0.012))
    """From the engine's last token until the client has read the answer and sends again, less the
    tool wait (relay, the client's read and its time between turns: 18.0 / 8.6 ms)."""

    def before_admission_wall_s(self, prompt_tokens: int, scheduled: bool) -> float:
        cost = self.client_send.wall_s(prompt_tokens) + self.router_parse.wall_s(prompt_tokens)
        return cost + (self.admission_round_trip.wall_s(prompt_tokens) if scheduled else 0.0)

    def dispatch_wall_s(self, prompt_tokens: int) -> float:
        return self.router_to_worker.wall_s(prompt_tokens) + self.worker_parse.wall_s(prompt_tokens)

    def relay_wall_s(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.relay.wall_s(prompt_tokens, output_tokens)


# LivePathCosts field <- the bench.breakdown phases whose wall means it adds up.
BREAKDOWN_PHASES = {
    "client_send": ("client_send",),
    "router_parse": ("router_parse",),
    "admission_round_trip": ("admission_round_trip",),
    "router_to_worker": ("route", "router_to_worker"),
    "worker_parse": ("worker_parse", "worker_lag"),
    "relay": ("relay", "client_receive", "client_between_turns"),
}


def costs_from_breakdown(report: dict) -> LivePathCosts:
    """Fixed per-turn costs from a live bench.breakdown report (its phases' mean wall seconds), to
    calibrate the model on the machine and load at hand. A phase the report lacks costs nothing; a
    negative mean (a lag that shrank) counts as 0."""
    phases = report.get("phases")
    require(isinstance(phases, dict) and bool(phases), "live_path", "report", "a bench.breakdown report with phases")
    assert isinstance(phases, dict)  # (require raised otherwise)
    means = {name: float(entry["wall_s"]["mean"]) for name, entry in phases.items()}
    return LivePathCosts(
        **{
            field_name: PhaseCost(base_s=max(0.0, sum(means.get(p, 0.0) for p in parts)))
            for field_name, parts in BREAKDOWN_PHASES.items()
        }
    )
