"""The pause-policy seam: what a policy sees and what it returns.

A policy is asked, for one replica in the pause band, which ACTING programs to pause now and
which REASONING programs to mark (pause at their next tool boundary). The core applies the plan,
does the accounting and writes the events; the policy only chooses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from services.scheduler.core.model import Program, ReplicaKey


@dataclass(frozen=True)
class PauseContext:
    """One over-threshold replica. `programs` are its ACTIVE programs in creation order and must
    be treated as read-only."""

    replica: ReplicaKey
    programs: Sequence[Program]
    used_tokens: int  # raw working set, buffers included
    target_tokens: float  # capacity * pause_target
    reasoning_count: int  # turns in flight (REASONING programs + passthrough requests)
    count_target: float | None  # max_programs * pause_target, None when no limit is published
    buffer_tokens: int
    weight_tokens: Callable[[Program], int]  # raw weight w(p), without the buffer
    now: float


@dataclass(frozen=True)
class PausePlan:
    pause: tuple[str, ...] = ()  # ACTING, unmarked programs to pause now
    mark: tuple[str, ...] = ()  # REASONING, unmarked programs to pause at their next tool boundary


class PausePolicy(Protocol):
    name: str

    def plan(self, ctx: PauseContext) -> PausePlan:
        """Choose what to pause and mark on one replica in the pause band."""
