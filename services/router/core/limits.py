"""Per-client program limits: how many programs one client may hold open, how fast it may start new ones.

A client is whoever the edge says it is (a hash of its bearer token, else its address). A program
is a session id the client used; it stays counted until the client releases it (a final request)
or leaves it idle for `program_idle_s`. A new program is refused when the client already holds
`max_programs`, or when its token bucket (`new_programs_per_s`, `new_programs_burst`) is empty;
a known program's next turn is never refused. The verdict says how long to wait:

    cap:  the oldest program's idle expiry          retry_after = last_seen_oldest + program_idle_s - now
    rate: the next token                            retry_after = (1 - tokens) / new_programs_per_s

`ConnectionShares` (below) is the same idea one level down: open HTTP connections per client, so that
one client's idle sockets cannot take the port's whole connection cap.

One router's view: each router replica (and process) enforces its own limits. Pure: `now` is passed in.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

from services.common.settings.config import require


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

    def forget(self, session_id: str) -> int:
        """The program ended (the scheduler released or expired it, whichever router saw its last request):
        it stops counting against every client that holds it here. Returns the clients it was dropped from.
        O(clients); called once per ended program."""
        dropped = 0
        for entry in self._clients.values():
            if entry.programs.pop(session_id, None) is not None:
                dropped += 1
        return dropped

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


# -- connections per client ---------------------------------------------------------------------------


class ConnectionRefusal(enum.Enum):
    CLIENT_CAP = "client_cap"  # the client already holds its share
    FULL = "full"  # the port is at its cap and no other client holds an idle connection beyond its share


@dataclass(frozen=True)
class ConnectionLimitParams:
    max_connections: int = 2048
    """Open client connections on the port, all clients together."""
    max_per_client: int = 1024
    """Open connections one client may hold (0 = no cap of its own: `max_connections`)."""

    def __post_init__(self) -> None:
        require(self.max_connections >= 1, "max_connections", self.max_connections, "max_connections >= 1")
        require(self.max_per_client >= 0, "max_per_client", self.max_per_client, "max_per_client >= 0 (0 = off)")

    @property
    def per_client(self) -> int:
        return min(self.max_per_client or self.max_connections, self.max_connections)


@dataclass(frozen=True)
class ConnectionVerdict:
    allowed: bool
    refusal: ConnectionRefusal | None = None
    evict: object | None = None
    """An idle connection of another client to close so that this one fits (None = none needed)."""


CONNECTION_ALLOWED = ConnectionVerdict(True)


@dataclass
class _Holder:
    open: int = 0
    idle: OrderedDict = field(default_factory=OrderedDict)  # connection -> idle since, longest idle first


class ConnectionShares:
    """Open connections per client, so that one client's sockets cannot lock the others out.

    A connection is opened for a client (its address; `move` re-files it under another identity, e.g. its
    bearer token once a request proved it), is busy while a request (or the head of the next one) is on it
    and idle otherwise. `open` admits a connection when

        held(client) < per_client   and   (total < max_connections  or  an idle one can be evicted)

    At the cap, the idle connection evicted is the longest idle one of the client that holds the most
    connections, provided that client holds more than the newcomer will (held(victim) > held(client) + 1):
    room is taken from a client beyond its fair share, never from the newcomer itself nor from an equal.
    The evicted connection is forgotten at once; the shell closes it. Pure: `now` is passed in.
    """

    def __init__(self, params: ConnectionLimitParams) -> None:
        self.params = params
        self.total = 0
        self._holders: dict[str, _Holder] = {}
        self._owner: dict[object, str] = {}  # connection -> client

    def open(self, conn: object, client: str, now: float) -> ConnectionVerdict:
        """A new connection of `client` (idle until `busy`): allowed (and counted), or refused."""
        holder = self._holders.get(client)
        held = holder.open if holder is not None else 0
        if held >= self.params.per_client:
            return ConnectionVerdict(False, ConnectionRefusal.CLIENT_CAP)
        evict = None
        if self.total >= self.params.max_connections:
            evict = self._victim(client, held)
            if evict is None:
                return ConnectionVerdict(False, ConnectionRefusal.FULL)
            self.close(evict)
        self._add(conn, client, now)
        return CONNECTION_ALLOWED if evict is None else ConnectionVerdict(True, evict=evict)

    def move(self, conn: object, client: str, now: float) -> bool:
        """File an open connection under `client` instead. False (and left where it was) when `client`
        already holds its share."""
        owner = self._owner.get(conn)
        if owner is None or owner == client:
            return True
        holder = self._holders.get(client)
        if holder is not None and holder.open >= self.params.per_client:
            return False
        idle = conn in self._holders[owner].idle
        self.close(conn)
        self._add(conn, client, now)
        if not idle:
            self.busy(conn)
        return True

    def busy(self, conn: object) -> None:
        owner = self._owner.get(conn)
        if owner is not None:
            self._holders[owner].idle.pop(conn, None)

    def idle(self, conn: object, now: float) -> None:
        owner = self._owner.get(conn)
        if owner is not None:
            self._holders[owner].idle[conn] = now

    def close(self, conn: object) -> None:
        """The connection is gone (or evicted). Unknown connections are ignored."""
        owner = self._owner.pop(conn, None)
        if owner is None:
            return
        holder = self._holders[owner]
        holder.idle.pop(conn, None)
        holder.open -= 1
        self.total -= 1
        if not holder.open:
            del self._holders[owner]

    def held(self, client: str) -> int:
        holder = self._holders.get(client)
        return holder.open if holder is not None else 0

    def client_of(self, conn: object) -> str | None:
        return self._owner.get(conn)

    @property
    def clients(self) -> int:
        return len(self._holders)

    @property
    def idle_connections(self) -> int:
        return sum(len(holder.idle) for holder in self._holders.values())

    def _add(self, conn: object, client: str, now: float) -> None:
        holder = self._holders.get(client)
        if holder is None:
            holder = self._holders[client] = _Holder()
        holder.open += 1
        holder.idle[conn] = now
        self._owner[conn] = client
        self.total += 1

    def _victim(self, client: str, held: int) -> object | None:
        """The longest idle connection of the biggest holder beyond the newcomer's share (ties: the one
        idle the longest)."""
        best: tuple[int, float] | None = None
        victim = None
        for name, holder in self._holders.items():
            if name == client or not holder.idle or holder.open <= held + 1:
                continue
            conn, since = next(iter(holder.idle.items()))
            key = (holder.open, -since)
            if best is None or key > best:
                best, victim = key, conn
        return victim
