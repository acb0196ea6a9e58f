"""What a peer policy core offers its two shells (the simulator and the live proxy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Wake:
    """A held turn of `program_id` may go now, to backend `backend` (an index into the capacities)."""

    program_id: str
    backend: int


class PeerPolicy(Protocol):
    """Turns of programs in, backends or holds out. Times are seconds of the caller's clock (the
    simulator's virtual seconds; the proxy's wall clock times its --speedup)."""

    monitor_interval_s: float | None
    """Run `tick` this often (None: only at `next_timer`)."""

    def begin_turn(self, now: float, program_id: str, prompt_tokens: int) -> int | None:
        """A turn arrives: the backend it goes to, or None: hold it until a `Wake` names the program."""
        ...

    def end_turn(self, now: float, program_id: str, prompt_tokens: int, completion_tokens: int) -> list[Wake]:
        """The turn finished with these usage counts (0, 0 when it failed)."""
        ...

    def release(self, now: float, program_id: str) -> list[Wake]:
        """The program ended (the final request)."""
        ...

    def tick(self, now: float) -> list[Wake]:
        """The monitor (every `monitor_interval_s`) and any timer due (`next_timer`)."""
        ...

    def next_timer(self) -> float | None:
        """The earliest time `tick` must run besides the monitor (None: no timer)."""
        ...

    def counters(self) -> dict[str, int]: ...
