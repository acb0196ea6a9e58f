"""Continuum / CacheTTL (Li et al., arXiv 2511.02230) style TTL pinning with program-level FCFS.

Written from the paper's published description: when a turn ends at a tool call (the program will
come back), its KV is pinned for a time-to-live chosen from the tool's expected duration and the cost
of reloading the context; when the TTL ends the pin lapses and the KV may be evicted. Requests are
admitted in program-level first-come-first-served order (a program keeps the place of its first turn).

How "pin" is realised here (the same in the simulator and the live proxy, which sits in front of
unmodified engines): admission control. Each backend's KV pool C is shared by the turns in flight
(their prompt tokens) and the unexpired pins (the program's prompt + completion tokens). A returning
program whose pin is live goes straight to its backend; every other turn waits in one FCFS queue
(ordered by its program's arrival) and is admitted, head first, onto its previous backend if that has
room, else the backend with the most room; the head that does not fit blocks the queue (FCFS). Room
never counts pinned contexts as free, so other programs cannot push a pinned context out of the
engine's pool by admission. The engine's own eviction is untouched: this is the closest faithful
equivalent of an engine-side pin that a proxy can build, and it is exact only insofar as the engine
keeps what fits (the simworker, like SGLang, evicts least recently used unreferenced pages only when
the pool is short).

The TTL. Holding c tokens of a pool of C for t seconds denies the engine a share c/C of its memory for
t seconds; reloading costs reload_s(c) seconds of prefill. Holding is worth it for at most the
break-even time τ* = reload_s(c)·C/c (ski rental: hold until holding has cost what reloading would).
With μ = the moving average of the program's tool durations (the workloads' requests carry no tool
names; per program, with the average over all programs as the prior):
    TTL = 0                        if μ > τ*   (the tool is expected to outlast the break-even)
    TTL = min(τ*, k·μ)             otherwise (k = 4: cover the tail of the duration, not forever)
    TTL = τ*                       before any duration was seen (cold start).
Pure: no I/O, no clock reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from harness.peers.api import Wake
from services.common.settings.config import require


@dataclass(frozen=True)
class ContinuumParams:
    ttl_mean_multiple: float = 4.0
    """k: a pin lasts at most this many times the expected tool duration."""
    ema_alpha: float = 0.3
    """Weight of the newest tool duration in the moving averages."""
    max_ttl_s: float = 600.0
    """No pin lasts longer than this, whatever the break-even."""

    def __post_init__(self) -> None:
        require(
            math.isfinite(self.ttl_mean_multiple) and self.ttl_mean_multiple > 0,
            "ttl_mean_multiple",
            self.ttl_mean_multiple,
            "ttl_mean_multiple > 0",
        )
        require(0 < self.ema_alpha <= 1, "ema_alpha", self.ema_alpha, "0 < ema_alpha <= 1")
        require(math.isfinite(self.max_ttl_s) and self.max_ttl_s >= 0, "max_ttl_s", self.max_ttl_s, "max_ttl_s >= 0")


@dataclass
class CtProgram:
    program_id: str
    arrival: int
    """FCFS rank: the order of the program's first turn."""
    backend: int | None = None
    """Where its last turn ran (its KV, if any, is there)."""
    running_tokens: int = 0
    """Tokens of the turn in flight (0 when none)."""
    pinned_tokens: int = 0
    pin_until: float = 0.0
    tool_started: float | None = None
    tool_mean_s: float | None = None
    queued_tokens: int = 0


class ContinuumCore:
    """TTL pins and FCFS admission over backends of `capacities` KV tokens. See the module doc."""

    def __init__(self, params: ContinuumParams, capacities: Sequence[int], reload_s: Callable[[int], float]) -> None:
        require(len(capacities) >= 1, "capacities", list(capacities), "at least one backend")
        require(all(c > 0 for c in capacities), "capacities", list(capacities), "every capacity > 0")
        self.params = params
        self.capacities = tuple(capacities)
        self.reload_s = reload_s
        self.monitor_interval_s: float | None = None
        self.programs: dict[str, CtProgram] = {}
        self.queue: list[str] = []
        """Program ids with a turn waiting, in FCFS order (program arrival)."""
        self._arrivals = 0
        self._global_tool_mean_s: float | None = None
        self.pins_total = 0
        self.pin_hits_total = 0
        self.pins_expired_total = 0
        self.queued_total = 0
        self.unpinned_total = 0
        self._pending: list[Wake] = []
        """Wakes of other programs found while admitting in `begin_turn`: returned by the next call."""

    # -- accounting ------------------------------------------------------------------------------

    def occupied(self, backend: int, now: float) -> int:
        """Tokens of `backend` held by turns in flight and by unexpired pins."""
        return sum(
            p.running_tokens + (p.pinned_tokens if p.pin_until > now else 0)
            for p in self.programs.values()
            if p.backend == backend
        )

    def ttl_s(self, tokens: int, tool_mean_s: float | None) -> float:
        """The pin's time to live for a context of `tokens` (see the module doc)."""
        if tokens <= 0:
            return 0.0
        capacity = max(self.capacities)
        break_even = min(self.params.max_ttl_s, self.reload_s(tokens) * capacity / tokens)
        if tool_mean_s is None:
            return break_even
        if tool_mean_s > break_even:
            return 0.0
        return min(break_even, self.params.ttl_mean_multiple * tool_mean_s)

    # -- turns ------------------------------------------------------------------------------------

    def begin_turn(self, now: float, program_id: str, prompt_tokens: int) -> int | None:
        p = self.programs.get(program_id)
        if p is None:
            p = self.programs[program_id] = CtProgram(program_id, self._arrivals)
            self._arrivals += 1
        if p.tool_started is not None:
            self._learn(p, now - p.tool_started)
            p.tool_started = None
        tokens = max(1, prompt_tokens)
        pinned = p.pin_until > now and p.backend is not None
        p.pinned_tokens, p.pin_until = 0, 0.0
        if pinned and p.backend is not None and self.capacities[p.backend] - self.occupied(p.backend, now) >= tokens:
            # The pin held its room (and the context's growth fits): straight back to its KV.
            self.pin_hits_total += 1
            p.running_tokens = tokens
            return p.backend
        p.queued_tokens = tokens
        self._enqueue(p)
        self.queued_total += 1
        wakes = self._admit(now)
        for wake in wakes:
            if wake.program_id == program_id:
                wakes.remove(wake)
                self._pending.extend(wakes)
                return wake.backend
        self._pending.extend(wakes)
        return None

    def _enqueue(self, p: CtProgram) -> None:
        rank = p.arrival
        i = len(self.queue)
        while i > 0 and self.programs[self.queue[i - 1]].arrival > rank:
            i -= 1
        self.queue.insert(i, p.program_id)

    def _learn(self, p: CtProgram, duration_s: float) -> None:
        a = self.params.ema_alpha
        d = max(0.0, duration_s)
        p.tool_mean_s = d if p.tool_mean_s is None else a * d + (1 - a) * p.tool_mean_s
        g = self._global_tool_mean_s
        self._global_tool_mean_s = d if g is None else a * d + (1 - a) * g

    def end_turn(self, now: float, program_id: str, prompt_tokens: int, completion_tokens: int) -> list[Wake]:
        p = self.programs.get(program_id)
        if p is None:
            return self._take_pending() + self._admit(now)
        p.running_tokens = 0
        context = prompt_tokens + completion_tokens
        mean = p.tool_mean_s if p.tool_mean_s is not None else self._global_tool_mean_s
        ttl = self.ttl_s(context, mean) if context > 0 else 0.0
        p.tool_started = now
        if ttl > 0:
            p.pinned_tokens, p.pin_until = context, now + ttl
            self.pins_total += 1
        return self._take_pending() + self._admit(now)

    def release(self, now: float, program_id: str) -> list[Wake]:
        p = self.programs.pop(program_id, None)
        if p is not None and program_id in self.queue:
            self.queue.remove(program_id)
        return self._take_pending() + self._admit(now)

    def next_timer(self) -> float | None:
        """The next pin expiry (admission may proceed then), if anything is queued."""
        if not self.queue:
            return None
        ends = [p.pin_until for p in self.programs.values() if p.pinned_tokens and p.pin_until > 0]
        return min(ends) if ends else None

    def tick(self, now: float) -> list[Wake]:
        for p in self.programs.values():
            if p.pinned_tokens and p.pin_until <= now:
                p.pinned_tokens, p.pin_until = 0, 0.0
                self.pins_expired_total += 1
        return self._take_pending() + self._admit(now)

    def _take_pending(self) -> list[Wake]:
        out, self._pending = self._pending, []
        return out

    def _victims(self, backend: int, head: CtProgram, now: float) -> list[CtProgram]:
        """Live pins on `backend` of programs that came after `head`, the latest first: what the head
        may unpin (program-level FCFS: an earlier program's pin outranks a later program's)."""
        out = [
            q
            for q in self.programs.values()
            if q.backend == backend and q.pinned_tokens and q.pin_until > now and q.arrival > head.arrival
        ]
        out.sort(key=lambda q: -q.arrival)
        return out

    def _admit(self, now: float) -> list[Wake]:
        """Admit from the head of the FCFS queue while the head fits somewhere, unpinning later
        programs' contexts when that makes it fit; the head that cannot fit blocks the queue."""
        wakes = []
        occupied = [self.occupied(b, now) for b in range(len(self.capacities))]
        while self.queue:
            p = self.programs[self.queue[0]]
            need = p.queued_tokens
            room = [self.capacities[b] - occupied[b] for b in range(len(occupied))]
            order = sorted(range(len(room)), key=lambda b: (b != p.backend, -room[b], b))
            backend = next((b for b in order if room[b] >= need), None)
            if backend is None:
                for b in order:
                    victims = self._victims(b, p, now)
                    if room[b] + sum(q.pinned_tokens for q in victims) < need:
                        continue
                    for q in victims:
                        if room[b] >= need:
                            break
                        room[b] += q.pinned_tokens
                        occupied[b] -= q.pinned_tokens
                        q.pinned_tokens, q.pin_until = 0, 0.0
                        self.unpinned_total += 1
                    backend = b
                    break
            if backend is None:
                # A context larger than any pool still runs once its backend holds nothing else.
                emptiest = min(range(len(occupied)), key=lambda b: (occupied[b], b))
                if occupied[emptiest] > 0:
                    break
                backend = emptiest
            self.queue.pop(0)
            p.backend = backend
            p.running_tokens = need
            p.queued_tokens = 0
            occupied[backend] += need
            wakes.append(Wake(p.program_id, backend))
        return wakes

    def counters(self) -> dict[str, int]:
        return {
            "pins": self.pins_total,
            "pin_hits": self.pin_hits_total,
            "pins_expired": self.pins_expired_total,
            "unpinned": self.unpinned_total,
            "queued": self.queued_total,
            "queued_now": len(self.queue),
        }


def prefill_reload_s(prefill_chunk_ms: Callable[[int, int], float], chunk_tokens: int) -> Callable[[int], float]:
    """reload_s(c): seconds to prefill a context of c tokens from nothing, chunk by chunk, with the
    engine's cost of a chunk (the simworker timing profile's `prefill_chunk_ms(new, prefix)`)."""

    def reload_s(tokens: int) -> float:
        total_ms, done = 0.0, 0
        while done < tokens:
            step = min(chunk_tokens, tokens - done)
            total_ms += prefill_chunk_ms(step, done)
            done += step
        return total_ms / 1000.0

    return reload_s
