"""Per-client program limits: how many programs one client may hold open, how fast it may start new ones.

A client is whoever the edge says it is (a hash of its bearer token, else its address). A program
is a session id the client used; it stays counted until the client releases it (a final request)
or leaves it idle for `program_idle_s`. A new program is refused when the client already holds
`max_programs`, or when its token bucket (`new_programs_per_s`, `new_programs_burst`) is empty;
a known program's next turn is never refused. The verdict says how long to wait:

    cap:  the oldest program's idle expiry          retry_after = last_seen_oldest + program_idle_s - now
    rate: the next token                            retry_after = (1 - tokens) / new_programs_per_s

One router's view: each router replica enforces its own limits. Pure: `now` is passed in.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

from services.common.config import require


class LimitReason(enum.Enum):
    TOO_MANY_PROGRAMS = "too_many_programs"
    NEW_PROGRAM_RATE = "new_program_rate"


@dataclass(frozen=True)
class ClientLimitParams:
    max_programs: int = 2048
    """Programs one client may hold open (0 = no cap)."""
    new_programs_per_s: float = 50.0
    """Sustained rate of new programs per client (0 = no rate limit)."""
    new_programs_burst: int = 200
    """New programs a client may start at once before the rate applies."""
    program_idle_s: float = 900.0
    """A program not seen for this long stops counting against its client."""

    def __post_init__(self) -> None:
        require(self.max_programs >= 0, "max_programs", self.max_programs, "max_programs >= 0")
        require(self.new_programs_per_s >= 0, "new_programs_per_s", self.new_programs_per_s, "new_programs_per_s >= 0")
        require(self.new_programs_burst >= 1, "new_programs_burst", self.new_programs_burst, "new_programs_burst >= 1")
        require(self.program_idle_s > 0, "program_idle_s", self.program_idle_s, "program_idle_s > 0")


@dataclass(frozen=True)
class LimitVerdict:
    allowed: bool
    reason: LimitReason | None = None
    retry_after_s: float = 0.0


ALLOWED = LimitVerdict(True)


@dataclass
class _Client:
    tokens: float
    refilled_at: float
    programs: OrderedDict[str, float] = field(default_factory=OrderedDict)  # session id -> last seen, oldest first


class ClientLimits:
    def __init__(self, params: ClientLimitParams) -> None:
        self.params = params
        self._clients: dict[str, _Client] = {}

    def admit(self, client: str, session_id: str, now: float) -> LimitVerdict:
        """A turn of `session_id` from `client`: allowed (and counted) or refused with a wait."""
        p = self.params
        entry = self._clients.get(client)
        if entry is None:
            entry = self._clients[client] = _Client(tokens=float(p.new_programs_burst), refilled_at=now)
        programs = entry.programs
        if session_id in programs:
            programs[session_id] = now
            programs.move_to_end(session_id)
            return ALLOWED
        self._expire(entry, now)
        if p.max_programs and len(programs) >= p.max_programs:
            oldest = next(iter(programs.values()))
            return LimitVerdict(False, LimitReason.TOO_MANY_PROGRAMS, max(0.0, oldest + p.program_idle_s - now))
        if p.new_programs_per_s > 0:
            entry.tokens = min(
                float(p.new_programs_burst), entry.tokens + (now - entry.refilled_at) * p.new_programs_per_s
            )
            entry.refilled_at = now
            if entry.tokens < 1.0:
                return LimitVerdict(False, LimitReason.NEW_PROGRAM_RATE, (1.0 - entry.tokens) / p.new_programs_per_s)
            entry.tokens -= 1.0
        programs[session_id] = now
        return ALLOWED

    def release(self, client: str, session_id: str) -> None:
        entry = self._clients.get(client)
        if entry is not None:
            entry.programs.pop(session_id, None)

    def sweep(self, now: float) -> int:
        """Forget idle programs, and clients with none left and a full bucket. Returns programs dropped."""
        dropped = 0
        full = float(self.params.new_programs_burst)
        rate = self.params.new_programs_per_s
        for client, entry in list(self._clients.items()):
            dropped += self._expire(entry, now)
            refilled = rate <= 0 or entry.tokens + (now - entry.refilled_at) * rate >= full
            if not entry.programs and refilled:
                del self._clients[client]
        return dropped

    def programs(self, client: str) -> int:
        entry = self._clients.get(client)
        return len(entry.programs) if entry is not None else 0

    @property
    def clients(self) -> int:
        return len(self._clients)

    def _expire(self, entry: _Client, now: float) -> int:
        cutoff = now - self.params.program_idle_s
        programs = entry.programs
        dropped = 0
        while programs:
            sid, seen = next(iter(programs.items()))
            if seen > cutoff:
                break
            del programs[sid]
            dropped += 1
        return dropped
