"""The pause-policy seam: what a policy sees and what it returns.

A policy is asked, for one replica in the pause band, which ACTING programs to pause now and
which REASONING programs to mark (pause at their next tool boundary). The core applies the plan,
does the accounting and writes the events; the policy only chooses.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from services.scheduler.core.model import Program
from services.scheduler.core.policies.context import PauseContext, PausePlan

__all__ = ["PauseContext", "PausePlan", "PausePolicy", "WorkingSetHooks"]


class PausePolicy(Protocol):
    name: str

    def plan(self, ctx: PauseContext) -> PausePlan:
        """Choose what to pause and mark on one replica in the pause band."""


@runtime_checkable
class WorkingSetHooks(Protocol):
    """Optional: a policy that also decides how much a program weighs in the pause-side
    working set (and so in the pause band, admission and the resume guard). The core looks these
    methods up once; a policy without them (threshold) gets the raw weight floor(T * w_a).

    The weight may depend only on the program's status and token_total, the replica's budget and
    estimates that change in `refresh`, which the core calls at the start of every tick (and then,
    if it returns True, re-weighs the placed programs: `Ledger.reweigh`), so the incremental
    accounting stays exact between ticks.

    A policy may also offer `weigher(capacity_tokens)`: `weight_tokens` with the budget fixed, valid
    until the next `refresh`, or None when it is the raw weight on that budget; a plan weighing many
    programs on one budget asks for it once (`Ledger.weigher`; without it the core calls
    `weight_tokens`)."""

    def weight_tokens(self, program: Program, raw_tokens: int, capacity_tokens: int) -> int:
        """Pause-side weight of a program whose threshold weight is `raw_tokens` (T if REASONING,
        floor(T * w_a) if ACTING) on a replica with `capacity_tokens` of budget."""

    def observe_tool(self, seconds: float) -> None:
        """A tool call lasted `seconds` (Complete -> the program's next Admit)."""

    def observe_prefill(self, uncached_tokens: int, ttft_s: float) -> None:
        """A turn prefilled `uncached_tokens` and produced its first token `ttft_s` after dispatch."""

    def refresh(self) -> bool:
        """Fold observations into the estimates; True if weights may have changed."""
