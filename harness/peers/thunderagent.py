"""ThunderAgent (Kang et al., arXiv 2602.13692) as the paper describes it, written from the paper.

Programs are pinned to a backend. A monitor runs every Δt (5 s). A backend is thrashing when the
tokens of its active programs exceed λ·C (λ = 1, C = its KV pool tokens); the monitor then pauses
programs on it until they fit, in order of

    S_pause   = 1/c + 1[acting]      (acting programs first, then the shortest)

An acting program (at a tool boundary) is paused at once; a reasoning program (a turn in flight) is
marked and pauses when that turn ends. Paused programs wait in ONE queue shared by all backends; the
monitor restores them, before pausing, in order of

    S_restore = 1/c + 1[reasoning]   (programs with a turn waiting first, then the shortest)

each onto the backend with the most room, where room counts an acting program's tokens decayed by
f(t) = 2^-t (t = seconds into its current tool call): a program long in a tool is unlikely to need its
KV soon. A program skipped for lack of room does not block the ones behind it (the released code's
best-fit). A paused program waiting longer than 30 min is force-resumed on the backend with the most
room. A new program goes to the backend with the most room if it fits and nobody is queued, else it
joins the queue. c = the program's tokens: the latest turn's prompt + completion tokens (the estimate
of the prompt while a turn is in flight), plus a buffer of 100 tokens per program as in the released
code. Pure: no I/O, no clock reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from harness.peers.api import Wake
from services.common.settings.config import require


@dataclass(frozen=True)
class ThunderAgentParams:
    monitor_interval_s: float = 5.0
    """Δt: the monitor's period."""
    capacity_fraction: float = 1.0
    """λ: pause while a backend's active tokens exceed λ·C; restore into λ·C."""
    decay_half_life_s: float = 1.0
    """f(t) = 2^(-t / half_life): the paper's 2^-t with t in seconds."""
    buffer_tokens_per_program: int = 100
    """Added to every program's tokens (the released code's BUFFER_PER_PROGRAM)."""
    force_resume_s: float = 1800.0
    """A program paused this long is resumed whatever the room."""

    def __post_init__(self) -> None:
        require(
            math.isfinite(self.monitor_interval_s) and self.monitor_interval_s > 0,
            "monitor_interval_s",
            self.monitor_interval_s,
            "monitor_interval_s > 0",
        )
        require(
            math.isfinite(self.capacity_fraction) and 0 < self.capacity_fraction <= 1,
            "capacity_fraction",
            self.capacity_fraction,
            "0 < capacity_fraction <= 1",
        )
        require(
            math.isfinite(self.decay_half_life_s) and self.decay_half_life_s > 0,
            "decay_half_life_s",
            self.decay_half_life_s,
            "decay_half_life_s > 0",
        )
        require(
            self.buffer_tokens_per_program >= 0,
            "buffer_tokens_per_program",
            self.buffer_tokens_per_program,
            "buffer_tokens_per_program >= 0",
        )
        require(self.force_resume_s > 0, "force_resume_s", self.force_resume_s, "force_resume_s > 0")


@dataclass
class TaProgram:
    program_id: str
    tokens: int
    acting: bool = False
    """At a tool boundary (its last turn ended); False while a turn is in flight or waiting."""
    backend: int | None = None
    paused: bool = False
    waiting: bool = False
    """A turn of it is held (paused, or queued as a new program)."""
    marked: bool = False
    acting_since: float = 0.0
    paused_since: float = 0.0


class ThunderAgentCore:
    """The program table, the pause/restore monitor and admission of new programs. See the module doc."""

    def __init__(self, params: ThunderAgentParams, capacities: Sequence[int]) -> None:
        require(len(capacities) >= 1, "capacities", list(capacities), "at least one backend")
        require(all(c > 0 for c in capacities), "capacities", list(capacities), "every capacity > 0")
        self.params = params
        self.capacities = tuple(capacities)
        self.monitor_interval_s: float | None = params.monitor_interval_s
        self.programs: dict[str, TaProgram] = {}
        self.queue: list[str] = []
        """Paused program ids, oldest first (ties in the restore order go to the oldest)."""
        self.pauses_total = 0
        self.marks_total = 0
        self.resumes_total = 0
        self.forced_resumes_total = 0
        self.queued_new_total = 0
        self.events: list[tuple[str, str, int | None, int]] = []
        """(kind, program, backend, tokens) of every pause, resume, forced_resume and mark, for the
        simulator's timeline; the caller drains it (`take_events`)."""

    # -- weights --------------------------------------------------------------------------------

    def weight(self, p: TaProgram, now: float, decayed: bool) -> float:
        if decayed and p.acting:
            t = max(0.0, now - p.acting_since)
            return p.tokens * 2.0 ** (-t / self.params.decay_half_life_s) + self.params.buffer_tokens_per_program
        return p.tokens + self.params.buffer_tokens_per_program

    def used(self, backend: int, now: float, *, decayed: bool = False, unmarked_only: bool = False) -> float:
        """Σ weights of the active programs on `backend` (paused ones count nowhere)."""
        return sum(
            self.weight(p, now, decayed)
            for p in self.programs.values()
            if p.backend == backend and not p.paused and not (unmarked_only and p.marked)
        )

    def limit(self, backend: int) -> float:
        return self.params.capacity_fraction * self.capacities[backend]

    # -- turns ----------------------------------------------------------------------------------

    def begin_turn(self, now: float, program_id: str, prompt_tokens: int) -> int | None:
        p = self.programs.get(program_id)
        if p is None:
            p = self.programs[program_id] = TaProgram(program_id, max(0, prompt_tokens))
        else:
            p.tokens = max(0, prompt_tokens)
        p.acting = False
        p.acting_since = 0.0
        if p.paused:
            p.waiting = True
            return None
        if p.backend is not None:
            return p.backend
        backend = None if self.queue else self._most_room(now, p.tokens + self.params.buffer_tokens_per_program)
        if backend is None:
            # New programs queue behind paused work, and while no backend has room for them.
            self._pause(p, now)
            p.waiting = True
            self.queued_new_total += 1
            return None
        p.backend = backend
        return backend

    def _most_room(self, now: float, need: float) -> int | None:
        best, best_room = None, -math.inf
        for b in range(len(self.capacities)):
            room = self.limit(b) - self.used(b, now)
            if room >= need and room > best_room:
                best, best_room = b, room
        return best

    def end_turn(self, now: float, program_id: str, prompt_tokens: int, completion_tokens: int) -> list[Wake]:
        p = self.programs.get(program_id)
        if p is None:
            return []
        if prompt_tokens + completion_tokens > 0:
            p.tokens = prompt_tokens + completion_tokens
        p.acting = True
        p.acting_since = now
        if p.marked:
            p.marked = False
            self._pause(p, now)
        return []

    def release(self, now: float, program_id: str) -> list[Wake]:
        p = self.programs.pop(program_id, None)
        if p is not None and p.paused:
            self.queue.remove(program_id)
        return []

    def next_timer(self) -> float | None:
        return None

    # -- the monitor ----------------------------------------------------------------------------

    def tick(self, now: float) -> list[Wake]:
        """Force-resume the long-paused, restore from the queue, then pause thrashing backends."""
        wakes = self._force_resume(now)
        wakes += self._restore(now)
        self._pause_thrashing(now)
        return wakes

    def _force_resume(self, now: float) -> list[Wake]:
        wakes = []
        for pid in [q for q in self.queue if now - self.programs[q].paused_since >= self.params.force_resume_s]:
            p = self.programs[pid]
            backend = max(
                range(len(self.capacities)), key=lambda b: (self.limit(b) - self.used(b, now, decayed=True), -b)
            )
            self.forced_resumes_total += 1
            wakes += self._resume(p, backend, forced=True)
        return wakes

    def restore_order(self) -> list[str]:
        """Queued ids by S_restore = 1/c + 1[reasoning], highest first; ties: oldest paused first."""
        position = {pid: i for i, pid in enumerate(self.queue)}
        return sorted(
            self.queue,
            key=lambda pid: (
                -(_inverse(self.programs[pid].tokens) + (1.0 if self.programs[pid].waiting else 0.0)),
                position[pid],
            ),
        )

    def _restore(self, now: float) -> list[Wake]:
        if not self.queue:
            return []
        room = [self.limit(b) - self.used(b, now, decayed=True) for b in range(len(self.capacities))]
        wakes = []
        for pid in self.restore_order():
            p = self.programs[pid]
            need = p.tokens + self.params.buffer_tokens_per_program
            backend = max(range(len(room)), key=lambda b: (room[b], -b))
            if need > room[backend]:
                continue  # the ones behind it may fit
            room[backend] -= need
            wakes += self._resume(p, backend)
        return wakes

    def take_events(self) -> list[tuple[str, str, int | None, int]]:
        out, self.events = self.events, []
        return out

    def _resume(self, p: TaProgram, backend: int, forced: bool = False) -> list[Wake]:
        self.events.append(("forced_resume" if forced else "resume", p.program_id, backend, p.tokens))
        self.queue.remove(p.program_id)
        p.paused = False
        p.backend = backend
        self.resumes_total += 1
        if p.waiting:
            p.waiting = False
            return [Wake(p.program_id, backend)]
        return []

    def pause_order(self, backend: int) -> list[str]:
        """Active unmarked programs of `backend` by S_pause = 1/c + 1[acting], highest first; ties: table order."""
        candidates = [p for p in self.programs.values() if p.backend == backend and not p.paused and not p.marked]
        candidates.sort(key=lambda p: -(_inverse(p.tokens) + (1.0 if p.acting else 0.0)))
        return [p.program_id for p in candidates]

    def _pause_thrashing(self, now: float) -> None:
        for b in range(len(self.capacities)):
            used = self.used(b, now, unmarked_only=True)
            limit = self.limit(b)
            if used <= limit:
                continue
            for pid in self.pause_order(b):
                if used <= limit:
                    break
                p = self.programs[pid]
                used -= self.weight(p, now, decayed=False)
                if p.acting:
                    self._pause(p, now)
                else:
                    p.marked = True  # pauses at its next tool boundary (end_turn)
                    self.marks_total += 1
                    self.events.append(("mark", pid, b, p.tokens))

    def _pause(self, p: TaProgram, now: float) -> None:
        if p.backend is not None:
            self.pauses_total += 1
            self.events.append(("pause", p.program_id, p.backend, p.tokens))
        p.paused = True
        p.backend = None
        p.paused_since = now
        self.queue.append(p.program_id)

    def counters(self) -> dict[str, int]:
        return {
            "pauses": self.pauses_total,
            "marks": self.marks_total,
            "resumes": self.resumes_total,
            "forced_resumes": self.forced_resumes_total,
            "queued_new": self.queued_new_total,
            "paused_now": len(self.queue),
        }


def _inverse(tokens: int) -> float:
    return 1.0 / max(1, tokens)
