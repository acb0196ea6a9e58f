"""The scheduler's accounting: the program table, the tickets, the per-replica token sums and the
release statistics behind tail protection. No control decisions are made here (see control.py).

Invariants (`Ledger.check_invariants` recomputes them from scratch):

- a PAUSED program is unplaced and in `paused`; an ACTIVE one is not in `paused`;
- `used[r]` = sum over ACTIVE programs placed on r of w(p) + B, plus each passthrough request bound to
  r (its estimate + B); `inflight[r]` counts the REASONING programs and passthrough requests there;
- the decayed working set `decayed_used_one(now, r)` is within one token per resident of the exact
  sum of decayed weights;
- every waiting admission belongs to a PAUSED program, its ticket is marked waiting, and it has an
  entry in the held-admission index (`wait_heap`);
- the table iterates in creation order (`seq` ascending);
- every ACTING program with an `acting_since` has an entry in the idle index (`idle_since`, `idle_heap`).

Accounting is kept incrementally through one function, `recharge`: after any change to a program,
its old charge is removed from its replica and its current charge (w(p) + B when it is ACTIVE and
placed on a replica of the snapshot, else nothing) is added. The decayed (resume-side) working set
is time-dependent and is computed on demand in O(1) per replica. `recharge` also keeps the idle
index: a heap of (acting_since, seq, session id) over the ACTING programs, so that idle expiry pops
the programs whose tool call has lasted the TTL instead of walking the table every tick (entries
left behind by a change are recognised as stale when they surface, and dropped). When a policy's
estimates move (once per tick at most), `reweigh` updates what depends on the policy weight only
(each charge's amount and `used`), which is what re-charging every placed program would change.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from operator import attrgetter
from typing import Callable

from services.scheduler.core.model import (
    CapacitySnapshot,
    Lifecycle,
    Program,
    ReplicaCapacity,
    ReplicaKey,
    Status,
    nearest_rank,
)
from services.scheduler.core.params import (
    TAIL_MIN_RELEASES,
    TAIL_WINDOW_RELEASES,
    ControlParams,
)
from services.scheduler.core.state import Changes
from services.scheduler.core.weights import decayed_weight_tokens, raw_weight_tokens

# Exponent range kept in the running decayed sums (2^512 is far from float overflow).
REBASE_EXPONENT = 512.0
IDLE_HEAP_SLACK = 2
"""The idle index's heap is rebuilt from its live entries once it holds more than this many entries per
live one (and more than 64): every Complete leaves a stale entry behind, and each keeps its released
program's session id alive. At 4 the heap ran a sawtooth of 3 stale entries per open program (30,000
entries, about 3 MiB, with 10,000 programs open), whose rise lasted longer than the 10-minute churn of
`make bench-router-memory` and read as a leak of 0.5 MiB/min (docs/benchmarks/router.md). At 2 the stale
entries are at most as many as the live ones, and a rebuild (O(live)) still comes after as many pushes as
there are live entries: O(1) a push, amortized."""

_by_seq = attrgetter("seq")

PolicyWeight = Callable[[Program, int, int], int]
"""A pause policy's weight: (program, raw weight, replica retention tokens) -> tokens."""


def normalise_session_id(session_id: str | None) -> str:
    """Trimmed id; empty means "no program" (passthrough)."""
    return (session_id or "").strip()


@dataclass(slots=True)
class Turn:
    """An admitted (or waiting) turn, kept until Complete or cancellation."""

    request_id: str
    session_id: str
    program: Program  # identity check: a rollback never touches a replacement program
    epoch: int
    started_at: float
    before: Program | None  # field copy taken before the admission; None = created by it
    paused_seq_before: int | None
    waiting: bool = False
    was_paused: bool = False
    unpinned: bool = False  # answered "any" while placed: Bind may move the program
    lease_until: float | None = None  # placed and not renewed by then: ended as if Complete(CANCELLED)
    # The router reported that the turn's client received something (RenewLeases.delivered_request_ids).
    # A placed ticket that lapses unconfirmed never reached its client: rolled back, not counted.
    confirmed: bool = False
    # Field copy as this admission (or the resume that resolved it) left the program: a rollback
    # that finds the program so restores `before` whole; one that finds it changed since (another
    # turn completed, a tick, a Bind) takes back only this turn's own effects.
    after: Program | None = None
    estimate: int = 0  # the router's prompt estimate as sent (calibration learns from it at Complete)
    # Restored from the store by a new leader and not yet named by an Admit: the old leader may have
    # stored it and died before its answer left, and the router then retries the same request id here.
    restored: bool = False
    # Restored from the store: `before` is only a copy of the program as restored, so a rollback ends the
    # turn as a cancelled Complete would and takes back its count.
    before_lost: bool = False


@dataclass(slots=True)
class Passthrough:
    request_id: str
    tokens: int
    replica: ReplicaKey | None
    started_at: float
    lease_until: float | None = None


class Ledger:
    """Program table, tickets and per-replica working sets, kept consistent by `recharge`."""

    def __init__(
        self,
        params: ControlParams,
        policy_weight: PolicyWeight | None = None,
        policy_weigher: Callable[[int], Callable[[Program, int], int] | None] | None = None,
    ) -> None:
        self.params = params
        self.policy_weight = policy_weight
        self.policy_weigher = policy_weigher  # the policy's weight with the budget fixed (`weigher`)
        # `weigher` per budget, for `recharge` (every transition weighs its program): valid until the
        # policy's next refresh, so forgotten at each (`forget_weighers`).
        self.weighers: dict[int, Callable[[Program, int], int] | None] = {}
        self.programs: dict[str, Program] = {}
        self.paused: dict[str, int] = {}  # session id -> pause sequence (resume tie-break: oldest first)
        self.children: dict[str, dict[str, None]] = {}
        self.caps: dict[ReplicaKey, ReplicaCapacity] = {}
        self.capacity_version = 0
        # Incremental raw accounting, per replica of the snapshot.
        self.used: dict[ReplicaKey, int] = {}
        self.inflight: dict[ReplicaKey, int] = {}  # REASONING programs + passthrough requests
        # The programs charged on each replica, by id, in the order of their last re-account: the table's
        # own objects (a walk of a replica's residents reads them without a lookup in the table).
        self.resident: dict[ReplicaKey, dict[str, Program]] = {}
        self.charge: dict[str, tuple[ReplicaKey, int, bool, int]] = {}
        # Resume-side (decayed) accounting in O(1) per replica: the ACTING part is
        # 2^(-(now - anchor)/tau) * sum(T_i * 2^((acting_since_i - anchor)/tau)).
        self.decay_base: dict[ReplicaKey, int] = {}  # REASONING tokens + every buffer + passthrough
        self.acting_sum: dict[ReplicaKey, float] = {}
        self.acting_anchor: dict[ReplicaKey, float] = {}
        self.acting_members: dict[ReplicaKey, dict[str, tuple[int, float, float]]] = {}
        self.pt_charge: dict[str, tuple[ReplicaKey, int]] = {}
        self.pt_count: dict[ReplicaKey, int] = {}
        # Turns and admissions (tickets).
        self.turns: dict[str, Turn] = {}
        self.waiting: dict[str, dict[str, None]] = {}  # session id -> waiting request ids
        self.passthrough: dict[str, Passthrough] = {}
        self.next_seq = 0
        self.next_pause_seq = 0
        # Tail protection: turn counts of recently released programs and the quantile of them
        # above which a live program counts as a tail program (None: protection not active).
        self.released_turns: deque[int] = deque(maxlen=TAIL_WINDOW_RELEASES)
        self.tail_turns: int | None = None
        # Durable state (core/state.py): change tracking is off until the shell turns it on.
        self.tracking = False
        self.dirty_programs: set[str] = set()
        self.dirty_tickets: set[str] = set()
        self.flushed_tickets: set[str] = set()
        # Restored programs and passthrough requests placed on a replica that no capacity snapshot
        # has shown since the restart: charged there when it appears (see settle).
        self.unsettled: set[str] = set()
        self.unsettled_pt: set[str] = set()
        # Idle index (see idle_due): the acting_since each ACTING program was indexed with, and a
        # min-heap of (acting_since, seq, session id) entries, some stale (the program moved on).
        self.idle_since: dict[str, float] = {}
        self.idle_heap: list[tuple[float, int, str]] = []
        # Held admissions by start (see oldest_wait): (started_at, request id), some stale.
        self.wait_heap: list[tuple[float, str]] = []

    # ------------------------------------------------------------------ the table

    def create(self, now: float, sid: str, parent_session_id: str) -> Program:
        parent = normalise_session_id(parent_session_id)
        if parent == sid:
            parent = ""  # a program is not its own parent
        program = Program(
            session_id=sid, parent_session_id=parent, created_at=now, seq=self.next_seq, last_activity=now
        )
        self.next_seq += 1
        self.programs[sid] = program
        if parent:
            self.children.setdefault(parent, {})[sid] = None
        return program

    def remove(self, program: Program) -> None:
        sid = program.session_id
        del self.programs[sid]
        self.paused.pop(sid, None)
        self.recharge(program)
        parent = program.parent_session_id
        if parent and parent in self.children:
            self.children[parent].pop(sid, None)
            if not self.children[parent]:
                del self.children[parent]

    @staticmethod
    def place(program: Program, replica: ReplicaKey) -> None:
        program.replica = replica
        program.last_replica = replica

    def enqueue_paused(self, sid: str) -> None:
        """Put `sid` at the back of the global paused queue."""
        self.paused[sid] = self.next_pause_seq
        self.next_pause_seq += 1

    def add_waiter(self, sid: str, request_id: str, started_at: float) -> None:
        """Hold `request_id` (a turn of the paused program `sid`) until a resume resolves it."""
        self.waiting.setdefault(sid, {})[request_id] = None
        heap = self.wait_heap
        heapq.heappush(heap, (started_at, request_id))
        if len(heap) > 64 and len(heap) > 4 * len(self.turns):
            # Mostly entries of admissions resolved since: rebuild from the held ones.
            heap[:] = [(self.turns[rid].started_at, rid) for rids in self.waiting.values() for rid in rids]
            heapq.heapify(heap)

    def oldest_wait(self) -> float | None:
        """The earliest start among the held admissions (None: none is held). O(1) amortised: the
        entries of admissions resolved since are dropped as they reach the top."""
        heap = self.wait_heap
        while heap:
            started, rid = heap[0]
            turn = self.turns.get(rid)
            if turn is not None and turn.started_at == started and rid in self.waiting.get(turn.session_id, ()):
                return started
            heapq.heappop(heap)
        return None

    def drop_waiter(self, sid: str, request_id: str) -> None:
        waiting = self.waiting.get(sid)
        if waiting is not None:
            waiting.pop(request_id, None)
            if not waiting:
                del self.waiting[sid]

    # ------------------------------------------------------------------ capacity

    def set_capacity(self, snapshot: CapacitySnapshot) -> list[tuple[ReplicaKey, int]]:
        """Take a new snapshot; programs and passthrough requests on a replica that left it are
        unplaced (re-placed on their next turn). Returns each removed replica with its unplaced count."""
        caps: dict[ReplicaKey, ReplicaCapacity] = {}
        for replica in snapshot.replicas:
            # A replica without a positive budget is invisible, as in the reference.
            if replica.retention_tokens > 0 and replica.key not in caps:
                caps[replica.key] = replica
        removed = [key for key in self.caps if key not in caps]
        resized = [
            key for key, old in self.caps.items() if key in caps and caps[key].retention_tokens != old.retention_tokens
        ]
        self.caps = caps
        if self.policy_weight is not None:
            # The policy's weight depends on the budget: its residents are charged anew (nothing to persist).
            for key in resized:
                for sid in list(self.resident.get(key, {})):
                    self.recharge(self.programs[sid], touched=False)
        self.capacity_version = snapshot.version
        out = []
        for key in removed:
            unplaced = 0
            for sid in list(self.resident.get(key, {})):
                program = self.programs[sid]
                program.replica = None  # re-placed on its next turn
                if program.last_replica == key:
                    program.last_replica = None
                self.recharge(program)
                unplaced += 1
            for rid, pt in self.passthrough.items():
                if pt.replica == key:
                    pt.replica = None
                    self.recharge_passthrough(rid, pt)
            for table in (
                self.used,
                self.inflight,
                self.resident,
                self.pt_count,
                self.decay_base,
                self.acting_sum,
                self.acting_anchor,
                self.acting_members,
            ):
                table.pop(key, None)
            out.append((key, unplaced))
        for key in caps:
            self.used.setdefault(key, 0)
            self.inflight.setdefault(key, 0)
            self.resident.setdefault(key, {})
            self.pt_count.setdefault(key, 0)
            self.decay_base.setdefault(key, 0)
            self.acting_sum.setdefault(key, 0.0)
            self.acting_anchor.setdefault(key, 0.0)
            self.acting_members.setdefault(key, {})
        if self.unsettled or self.unsettled_pt:
            self.settle()
        return out

    def settle(self) -> None:
        """Charge restored placements whose replica the snapshot now has; forget the settled ones."""
        for sid in list(self.unsettled):
            program = self.programs.get(sid)
            if program is None or program.replica is None:
                self.unsettled.discard(sid)
            elif program.replica in self.caps:
                self.unsettled.discard(sid)
                self.recharge(program, touched=False)
        for rid in list(self.unsettled_pt):
            pt = self.passthrough.get(rid)
            if pt is None or pt.replica is None:
                self.unsettled_pt.discard(rid)
            elif pt.replica in self.caps:
                self.unsettled_pt.discard(rid)
                self.recharge_passthrough(rid, pt)

    # ------------------------------------------------------------------ charges

    def weight(self, program: Program, key: ReplicaKey) -> int:
        """w(p) on the pause side: raw, or the policy's weight given the raw one and the budget."""
        raw = raw_weight_tokens(program, self.params.acting_token_weight)
        if self.policy_weight is None:
            return raw
        return self.policy_weight(program, raw, self.caps[key].retention_tokens)

    def weight_at(self, program: Program, raw: int, retention_tokens: int) -> int:
        """`weight` given the raw weight and a replica's budget (all the policy's weight depends on)."""
        if self.policy_weight is None:
            return raw
        return self.policy_weight(program, raw, retention_tokens)

    def weigher(self, retention_tokens: int) -> Callable[[Program, int], int] | None:
        """`weight_at` on one budget as a function of (program, raw weight), valid until the policy's
        next refresh (its `weigher` if it has one); None when the weight on that budget is the raw
        weight (no policy weight, or the policy's weigher says so)."""
        policy_weight = self.policy_weight
        if policy_weight is None:
            return None
        if self.policy_weigher is not None:
            return self.policy_weigher(retention_tokens)
        return lambda program, raw: policy_weight(program, raw, retention_tokens)

    def forget_weighers(self) -> None:
        """The policy refreshed its estimates: the weighers `recharge` kept may weigh differently now."""
        self.weighers.clear()

    def recharge(self, program: Program, *, touched: bool = True) -> None:
        """Re-account `program` after a change (`touched`: a change worth persisting)."""
        sid = program.session_id
        if touched and self.tracking:
            self.dirty_programs.add(sid)
        since, current = program.acting_since, self.programs.get(sid)
        if since is not None and program.status is Status.ACTING and current is program:
            if self.idle_since.get(sid) != since:
                self._index_idle(program, since)
        elif sid in self.idle_since and (current is program or current is None):
            del self.idle_since[sid]  # not idle any more (or removed): its heap entry is now stale
        old = self.charge.pop(sid, None)
        if old is not None:
            old_key, amount, in_flight, base = old
            self.used[old_key] -= amount
            self.inflight[old_key] -= in_flight
            self.decay_base[old_key] -= base
            del self.resident[old_key][sid]
            members = self.acting_members[old_key]
            member = members.pop(sid, None)
            if member is not None:
                self.acting_sum[old_key] -= member[2]
                if not members:
                    self.acting_sum[old_key] = 0.0  # drop accumulated rounding
        key = program.replica
        if key is None or key not in self.caps or program.lifecycle is not Lifecycle.ACTIVE or current is not program:
            return
        params, tokens = self.params, program.token_total
        buffer = params.buffer_per_program_tokens
        in_flight = program.status is Status.REASONING
        # self.weight, inline (this runs for every transition): raw_weight_tokens, then the policy's.
        raw = tokens if in_flight else math.floor(tokens * params.acting_token_weight)
        if self.policy_weight is not None:
            budget = self.caps[key].retention_tokens
            weighers = self.weighers
            if budget in weighers:
                weigh = weighers[budget]
            else:
                weigh = weighers[budget] = self.weigher(budget)
            if weigh is not None:  # None: the policy's weight on this budget is the raw weight
                raw = weigh(program, raw)
        amount = raw + buffer
        base = buffer + (tokens if in_flight else 0)
        self.charge[sid] = (key, amount, in_flight, base)
        self.used[key] += amount
        self.inflight[key] += in_flight
        self.decay_base[key] += base
        self.resident[key][sid] = program
        if not in_flight and tokens > 0:
            self._add_acting(key, sid, tokens, since)

    def reweigh(self) -> None:
        """Re-account every placed program's pause-side weight after the policy's estimates moved
        (the policy's `refresh`). The same charges `recharge` of each placed program would leave, for
        a fraction of its cost: only the amount (w(p) + B) and `used` depend on the weight; what a
        program is charged where, the in-flight counts, the decayed working set (raw tokens) and the
        idle index do not. The weight is computed as in `recharge` (the policy remembers what it
        computes per size and budget)."""
        policy_weight = self.policy_weight
        if policy_weight is None or not self.charge:
            return
        programs, used, charge = self.programs, self.used, self.charge
        buffer, w_a, floor = self.params.buffer_per_program_tokens, self.params.acting_token_weight, math.floor
        budgets = {key: cap.retention_tokens for key, cap in self.caps.items()}
        changed: list[tuple[str, tuple[ReplicaKey, int, bool, int], int]] = []
        for sid, entry in charge.items():
            key, amount, in_flight, _ = entry
            program = programs[sid]
            tokens = program.token_total
            new = policy_weight(program, tokens if in_flight else floor(tokens * w_a), budgets[key]) + buffer
            if new != amount:
                changed.append((sid, entry, new))
        for sid, (key, amount, in_flight, base), new in changed:
            charge[sid] = (key, new, in_flight, base)
            used[key] += new - amount

    def _index_idle(self, program: Program, since: float) -> None:
        self.idle_since[program.session_id] = since
        heap = self.idle_heap
        heapq.heappush(heap, (since, program.seq, program.session_id))
        if len(heap) > 64 and len(heap) > IDLE_HEAP_SLACK * len(self.idle_since):
            # As many stale entries as live ones (every Complete leaves one behind): rebuild from the live.
            programs = self.programs
            heap[:] = [(t, programs[sid].seq, sid) for sid, t in self.idle_since.items()]
            heapq.heapify(heap)

    def idle_due(self, now: float, ttl: float) -> list[Program]:
        """The ACTING programs whose tool call has lasted `ttl` or more at `now` (now - acting_since
        >= ttl), in table (creation) order, taken out of the idle index: the caller ends them, or
        puts back those it keeps (`reindex_idle`). O(due + stale entries, log of the index)."""
        heap, idle_since, programs = self.idle_heap, self.idle_since, self.programs
        due: dict[str, Program] = {}
        while heap and now - heap[0][0] >= ttl:
            since, seq, sid = heapq.heappop(heap)
            program = programs.get(sid)
            if idle_since.get(sid) == since and program is not None and program.seq == seq:
                due[sid] = program
        for sid in due:
            del idle_since[sid]
        return sorted(due.values(), key=_by_seq)

    def reindex_idle(self, program: Program) -> None:
        """Put back a program `idle_due` returned and the caller did not end."""
        if program.acting_since is not None and program.status is Status.ACTING:
            self._index_idle(program, program.acting_since)

    def _add_acting(self, key: ReplicaKey, sid: str, tokens: int, acting_since: float | None) -> None:
        tau = self.params.acting_decay_tau_seconds
        members = self.acting_members[key]
        if not members:
            self.acting_anchor[key] = acting_since if acting_since is not None else 0.0
            self.acting_sum[key] = 0.0
        anchor = self.acting_anchor[key]
        since = anchor if acting_since is None else acting_since
        if (since - anchor) / tau > REBASE_EXPONENT:
            # Keep the running sum finite: move the anchor forward and recompute the terms.
            anchor = self.acting_anchor[key] = since
            total = 0.0
            for other, (t, s0, _) in list(members.items()):
                term = t * 2.0 ** max(-REBASE_EXPONENT * 2, (s0 - anchor) / tau)
                members[other] = (t, s0, term)
                total += term
            self.acting_sum[key] = total
        term = tokens * 2.0 ** max(-REBASE_EXPONENT * 2, (since - anchor) / tau)
        members[sid] = (tokens, since, term)
        self.acting_sum[key] += term

    def recharge_passthrough(self, request_id: str, pt: Passthrough | None) -> None:
        old = self.pt_charge.pop(request_id, None)
        if old is not None:
            key, amount = old
            self.decay_base[key] -= amount
            self.used[key] -= amount
            self.inflight[key] -= 1
            self.pt_count[key] -= 1
        if pt is None or pt.replica is None or pt.replica not in self.caps:
            return
        amount = pt.tokens + self.params.buffer_per_program_tokens
        self.pt_charge[request_id] = (pt.replica, amount)
        self.decay_base[pt.replica] += amount
        self.used[pt.replica] += amount
        self.inflight[pt.replica] += 1
        self.pt_count[pt.replica] += 1

    def decayed_used(self, now: float) -> dict[ReplicaKey, int]:
        return {key: self.decayed_used_one(now, key) for key in self.caps}

    def decayed_used_one(self, now: float, key: ReplicaKey) -> int:
        """used_d(r) = base + floor(2^(-(now - anchor)/tau) * S): O(1). The floor applies to the
        replica's acting sum rather than per program (differs by < 1 token per program)."""
        acting = 0
        if self.acting_members[key]:
            exponent = -max(0.0, now - self.acting_anchor[key]) / self.params.acting_decay_tau_seconds
            acting = max(0, math.floor(self.acting_sum[key] * 2.0 ** max(exponent, -1074.0)))
        return self.decay_base[key] + acting

    # ------------------------------------------------------------------ release statistics

    def note_release(self, turns: int) -> None:
        q = self.params.tail_protection_quantile
        if q <= 0:
            return
        self.released_turns.append(turns)
        self.refresh_tail()

    def refresh_tail(self) -> None:
        q = self.params.tail_protection_quantile
        if q > 0 and len(self.released_turns) >= TAIL_MIN_RELEASES:
            ordered = sorted(self.released_turns)
            self.tail_turns = ordered[nearest_rank(len(ordered), q)]

    def is_tail(self, program: Program) -> bool:
        """A program that has run more turns than most released programs ran in all (see
        ControlParams.tail_protection_quantile)."""
        return self.tail_turns is not None and program.turns > self.tail_turns

    # ------------------------------------------------------------------ change tracking

    def track_changes(self) -> None:
        """Start recording which programs and tickets change (for `take_changes`)."""
        self.tracking = True

    def take_changes(self) -> Changes:
        """The programs and tickets changed, created or removed since the last call (export each id:
        None means delete it). O(changed programs + tickets in flight)."""
        programs, self.dirty_programs = self.dirty_programs, set()
        current = set(self.turns)
        current.update(self.passthrough)
        tickets = (current ^ self.flushed_tickets) | (self.dirty_tickets & current)
        self.flushed_tickets = current
        self.dirty_tickets = set()
        return Changes(frozenset(programs), frozenset(tickets))

    # ------------------------------------------------------------------ invariants

    def check_invariants(self, now: float | None = None) -> None:
        """Recompute the accounting from scratch and compare (used by tests and debug builds)."""
        used = {k: 0 for k in self.caps}
        inflight = {k: 0 for k in self.caps}
        for program in self.programs.values():
            assert program.token_total >= 0, program
            if program.lifecycle is Lifecycle.PAUSED:
                assert program.replica is None and program.session_id in self.paused, program
            else:
                assert program.session_id not in self.paused, program
                if program.replica in self.caps:
                    used[program.replica] += (
                        self.weight(program, program.replica) + self.params.buffer_per_program_tokens
                    )
                    inflight[program.replica] += program.status is Status.REASONING
        pt_count = {k: 0 for k in self.caps}
        for key, amount in self.pt_charge.values():
            used[key] += amount
            inflight[key] += 1
            pt_count[key] += 1
        assert used == self.used, (used, self.used)
        for sid, (key, amount, _, _) in self.charge.items():  # each charge is its program's current weight
            assert amount == self.weight(self.programs[sid], key) + self.params.buffer_per_program_tokens, sid
        assert inflight == self.inflight, (inflight, self.inflight)
        assert pt_count == self.pt_count, (pt_count, self.pt_count)
        # Who is charged where: the residents, and the REASONING count read as inflight - pt_count.
        for key in self.caps:
            placed = {
                sid
                for sid, q in self.programs.items()
                if q.lifecycle is Lifecycle.ACTIVE and q.replica == key and sid not in self.unsettled
            }
            assert set(self.resident[key]) == placed, (key, set(self.resident[key]) ^ placed)
            assert all(q is self.programs[sid] for sid, q in self.resident[key].items()), key
            reasoning = sum(1 for sid in placed if self.programs[sid].status is Status.REASONING)
            assert reasoning == self.inflight[key] - self.pt_count[key], (key, reasoning)
            acting = {sid for sid in placed if self.programs[sid].status is Status.ACTING}
            assert set(self.acting_members[key]) <= acting, key
        assert set(self.paused) <= set(self.programs)
        if now is not None:
            p = self.params
            for key in self.caps:
                members = [self.programs[sid] for sid in self.resident[key]]
                exact = sum(
                    decayed_weight_tokens(q, now, p.acting_decay_tau_seconds) + p.buffer_per_program_tokens
                    for q in members
                )
                exact += sum(amount for k, amount in self.pt_charge.values() if k == key)
                fast = self.decayed_used_one(now, key)
                assert abs(fast - exact) <= len(members) + 1, (key, fast, exact)
        for sid, rids in self.waiting.items():
            assert sid in self.programs and self.programs[sid].lifecycle is Lifecycle.PAUSED
            assert all(self.turns[r].waiting for r in rids)
        held = set(self.wait_heap)
        assert all((self.turns[r].started_at, r) in held for rids in self.waiting.values() for r in rids)
        seqs = [q.seq for q in self.programs.values()]
        assert seqs == sorted(seqs), "the table iterates in creation order"
        idle = {
            sid: q.acting_since
            for sid, q in self.programs.items()
            if q.status is Status.ACTING and q.acting_since is not None
        }
        assert self.idle_since == idle, set(self.idle_since.items()) ^ set(idle.items())
        entries = set(self.idle_heap)
        assert all((t, self.programs[sid].seq, sid) in entries for sid, t in idle.items())
