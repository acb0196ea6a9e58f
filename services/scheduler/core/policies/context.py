"""What a pause policy sees (`PauseContext`) and what it returns (`PausePlan`): compiled with the core
(scripts/compile_core.py), apart from the policy protocols of base.py, which stay Python classes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

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
