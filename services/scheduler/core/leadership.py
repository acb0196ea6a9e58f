"""Leadership of an active/standby scheduler pair: a pure state machine over lease reads and the clock.

Several scheduler replicas share one state store. Exactly one of them decides (the leader); the
others answer every decision RPC with "not the leader" and the leader's address. Leadership is a
lease in the store: a record {holder, epoch, address} that expires `ttl_s` after it was last
renewed, and an `epoch` that goes up by one every time the lease changes hands. Every state write
of a leader is conditional on its epoch (the store refuses it otherwise), so a deposed leader that
wakes up late cannot overwrite its successor's table.

This module decides, the shell (`services/scheduler/election.py`) does the I/O:

- standby: `acquire_due(now)` says when to try to take the lease; the result goes to `acquired`
  (now the leader) or `observed` (someone else holds it: remember who, for redirects).
- leader: `renew_due(now)` says when to renew; the result goes to `renewed`, `renew_failed` (the
  store did not answer) or `lost` (the store says someone else holds the lease).
- `expired(now)`: a leader whose last successful renewal (counted from when it was *sent*) is older
  than `ttl_s - margin_s` steps down by itself, before any other replica can see the lease expire
  (the store counts the TTL from a later instant: when it received the renewal).

`is_leader(now)` is what every decision checks: it is false from the instant the local deadline
passes, whether or not the shell has run since (a SIGSTOPped process that wakes up finds it false
before it does anything else).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from services.common.settings.config import require


class Role(enum.Enum):
    STANDBY = "standby"
    LEADER = "leader"


class StepDown(enum.Enum):
    """Why a leader stopped leading (a metric label and a log word)."""

    LOST = "lost"  # the store says another replica holds the lease (or a newer epoch exists)
    EXPIRED = "expired"  # no successful renewal within ttl - margin: stepped down before it could be taken
    FENCED = "fenced"  # a state write was refused for a stale epoch
    SHUTDOWN = "shutdown"  # a graceful stop released the lease


@dataclass(frozen=True)
class LeaseParams:
    """Timing of the leadership lease. Failover after a crash takes at most about ttl_s + poll_s
    (the lease must expire, then a standby must try), plus the table load."""

    ttl_s: float = 2.0
    """The lease lasts this long after each renewal."""
    renew_s: float = 0.4
    """The leader renews this often."""
    poll_s: float = 0.25
    """A standby tries to take the lease this often."""
    margin_s: float = 0.5
    """A leader steps down this long before its lease could expire in the store (clock-rate skew, and the
    time a decision already under way takes to finish)."""

    def __post_init__(self) -> None:
        for name, setting in _SETTING.items():
            value = getattr(self, name)
            require(math.isfinite(value) and value > 0, setting, value, f"0 < {setting} < inf")
        require(
            self.margin_s < self.ttl_s / 2,
            "leader_margin_seconds",
            self.margin_s,
            "leader_margin_seconds < leader_lease_seconds / 2 (a leader leads most of its lease)",
        )
        require(
            self.renew_s * 2 <= self.ttl_s - self.margin_s,
            "leader_renew_seconds",
            self.renew_s,
            "2 x leader_renew_seconds <= leader_lease_seconds - leader_margin_seconds (two renewals at least "
            "before a leader steps down)",
        )


_SETTING = {
    "ttl_s": "leader_lease_seconds",
    "renew_s": "leader_renew_seconds",
    "poll_s": "leader_poll_seconds",
    "margin_s": "leader_margin_seconds",
}


@dataclass(frozen=True)
class LeaseRecord:
    """What the store says of the lease: who holds it, at which epoch, and where it serves."""

    holder: str
    epoch: int
    address: str


@dataclass(frozen=True)
class LeaseRead:
    """A store's answer to an acquire or a renewal: whether the caller holds the lease, and the lease as stored."""

    held: bool
    epoch: int
    record: LeaseRecord | None


@dataclass(frozen=True)
class Transition:
    """A role change for the shell to act on (start or end a leadership term) and to log."""

    role: Role
    epoch: int
    reason: str
    step_down: StepDown | None = None


class Leadership:
    """One replica's view of the lease. Times are the replica's monotonic seconds."""

    def __init__(self, params: LeaseParams, replica_id: str, address: str) -> None:
        self.params = params
        self.replica_id = replica_id
        self.address = address
        self.role = Role.STANDBY
        self.epoch = 0
        """This replica's epoch while it leads (the last one it held otherwise)."""
        self.highest_epoch = 0
        """The highest epoch seen anywhere: a lease re-established after the store lost it starts above it."""
        self.leader: LeaseRecord | None = None
        """The current leader as last read from the store (this replica itself while it leads)."""
        self.valid_until = -math.inf
        """While leading: the instant this replica stops deciding unless a renewal succeeds first."""
        self._next_attempt = -math.inf

    # ------------------------------------------------------------------ queries

    def is_leader(self, now: float) -> bool:
        return self.role is Role.LEADER and now < self.valid_until

    def leader_address(self, now: float) -> str:
        """Where decisions are made, as far as this replica knows ("" = unknown)."""
        if self.role is Role.LEADER:
            return self.address if now < self.valid_until else ""
        return self.leader.address if self.leader is not None else ""

    def next_wakeup(self, now: float) -> float:
        """When the shell should act next: the next attempt, or the step-down deadline if earlier."""
        if self.role is Role.LEADER:
            return min(self._next_attempt, self.valid_until)
        return self._next_attempt

    def acquire_due(self, now: float) -> bool:
        return self.role is Role.STANDBY and now >= self._next_attempt

    def renew_due(self, now: float) -> bool:
        return self.role is Role.LEADER and now >= self._next_attempt and now < self.valid_until

    # ------------------------------------------------------------------ results of store calls

    def acquired(self, sent_at: float, epoch: int) -> Transition:
        """The store gave this replica the lease at `epoch` (the call was sent at `sent_at`)."""
        self.role = Role.LEADER
        self.epoch = epoch
        self.highest_epoch = max(self.highest_epoch, epoch)
        self.leader = LeaseRecord(self.replica_id, epoch, self.address)
        self.valid_until = sent_at + self.params.ttl_s - self.params.margin_s
        self._next_attempt = sent_at + self.params.renew_s
        return Transition(Role.LEADER, epoch, "acquired the lease")

    def observed(self, now: float, record: LeaseRecord | None) -> None:
        """A standby's attempt found the lease held by `record` (None: the read failed)."""
        if record is not None:
            self.leader = record
            self.highest_epoch = max(self.highest_epoch, record.epoch)
        self._next_attempt = now + self.params.poll_s

    def attempt_failed(self, now: float) -> Transition | None:
        """An acquire or renew call did not get an answer (store unreachable, timeout)."""
        if self.role is Role.STANDBY:
            self._next_attempt = now + self.params.poll_s
            return None
        self._next_attempt = now + min(self.params.poll_s, self.params.renew_s)
        return self.expired(now)

    def renewed(self, sent_at: float) -> None:
        if self.role is not Role.LEADER:
            return  # a renewal that answered after the term ended starts nothing
        self.valid_until = max(self.valid_until, sent_at + self.params.ttl_s - self.params.margin_s)
        self._next_attempt = sent_at + self.params.renew_s

    def lost(self, now: float, record: LeaseRecord | None, why: StepDown = StepDown.LOST) -> Transition | None:
        """The store refused this leader (the lease is someone else's, or a write was fenced)."""
        if record is not None:
            self.highest_epoch = max(self.highest_epoch, record.epoch)
        if self.role is not Role.LEADER:
            if record is not None:
                self.leader = record
            return None
        self.leader = record
        return self._step_down(
            now,
            why,
            "the store gave the lease to another replica"
            if why is StepDown.LOST
            else "a state write was refused for a stale epoch",
        )

    def expired(self, now: float) -> Transition | None:
        """Step down if the local deadline passed without a successful renewal."""
        if self.role is Role.LEADER and now >= self.valid_until:
            self.leader = None
            return self._step_down(now, StepDown.EXPIRED, "no successful renewal within the lease")
        return None

    def released(self, now: float) -> Transition | None:
        if self.role is not Role.LEADER:
            return None
        self.leader = None
        return self._step_down(now, StepDown.SHUTDOWN, "released the lease")

    def _step_down(self, now: float, why: StepDown, reason: str) -> Transition:
        self.role = Role.STANDBY
        self.valid_until = -math.inf
        self._next_attempt = now + self.params.poll_s
        return Transition(Role.STANDBY, self.epoch, reason, why)
