"""The scheduler's control law: bands, admission placement, and the tick's soft demote, resume,
aging, forced resume and pause choices. It reads the ledger (accounting.py) and changes nothing:
each tick step returns a `Plan`, an ordered list of steps (pause, resume, mark, ...) that the core
applies through its own transitions (so the events, logs and totals of a step are the same whoever
chose it). Where a step's later choices depend on its earlier ones (the resume loop's guard, aging's
victims), the law carries the working-set change of each chosen step forward itself, exactly as
the ledger will account it: a pause removes the program's charge, a resume adds w(p) + B.

Bands per replica r, with util = used(r) / capacity(r) and the in-flight count against max_programs:
PAUSE at util >= theta_p (or count above it), SOFT_DEMOTE at max(util, count) >= theta_s, else NORMAL.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass
from heapq import nsmallest
from itertools import compress, count, islice, repeat
from operator import add, attrgetter, eq, lt, or_
from typing import Callable, Union

from services.scheduler.core.accounting import Ledger
from services.scheduler.core.model import (
    INFO,
    Band,
    Lifecycle,
    LogRecord,
    Program,
    ReplicaKey,
    Status,
    nearest_rank,
)
from services.scheduler.core.params import ControlParams
from services.scheduler.core.policies import PauseContext, PausePolicy


@dataclass(frozen=True, slots=True)
class Pause:
    """Pause the program (unplace it, queue it at the back of the paused queue)."""

    session_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Resume:
    """Resume a paused program onto `replica` (None: any worker); `protect_until`: not paused for
    pressure before then (aging's quantum)."""

    session_id: str
    replica: ReplicaKey | None
    protect_until: float | None = None


@dataclass(frozen=True, slots=True)
class ForceResume:
    """Resume a program whose held admission waited `waited_s` >= the resume timeout, thresholds
    ignored, where `ControlLaw.forced_target` says when the step is applied."""

    session_id: str
    waited_s: float


@dataclass(frozen=True, slots=True)
class Mark:
    """Mark a REASONING program on `replica`: it is paused at its next tool boundary."""

    session_id: str
    replica: ReplicaKey


@dataclass(frozen=True, slots=True)
class Unmark:
    """Pressure is gone: the program's mark is taken back."""

    session_id: str


@dataclass(frozen=True, slots=True)
class SoftDemote:
    """Lower the priority of the programs `session_ids` on `replica` until `until`; those in
    `announce` (in that order) were not demoted already: an event each. One step per replica (a
    replica in the band may hold thousands of programs)."""

    replica: ReplicaKey
    until: float
    session_ids: tuple[str, ...]
    announce: tuple[str, ...] = ()


GROWTH_WINDOW_SAMPLES = 256
"""Growth samples (one per replica a tick) the pause margin is the quantile of: the last 4 ticks of a
64-replica fleet, the last 128 of two replicas. Counted in samples, not ticks, so that the largest of
them stands for the same tail of the growth however many replicas report it. Until the window is
full the configured target holds. On two replicas of the SWE traces 64 samples changed 2 of 30 runs
of the simulator and 32 lost up to 8.5%; 128 and more changed none (docs/scheduler.md, "The pause
margin")."""

_SEQ = attrgetter("seq")
_SESSION_ID = attrgetter("session_id")
_TOKEN_TOTAL = attrgetter("token_total")


def _reorder(
    order: list[ReplicaKey], rank: list[int], room: dict[ReplicaKey, int], target: ReplicaKey, req: int, buffer: int
) -> None:
    """`target` took a resume of `req`: out of the headroom order (`order`, with `rank` beside it,
    ascending), and back in after the replicas with as much headroom if it still takes resumes."""
    idx = bisect_left(rank, -room[target] - req)  # where it stands (its room before this resume)
    while order[idx] != target:
        idx += 1
    del order[idx], rank[idx]
    if room[target] > buffer:
        idx = bisect_right(rank, -room[target])
        order.insert(idx, target)
        rank.insert(idx, -room[target])


def _size_then_resume_key(entry: tuple[int, float, int, int, Program]) -> tuple[int, int, float, int, int]:
    """A resume-key entry's place among programs sorted by size, descending, then by resume key."""
    return (-entry[4].token_total, entry[0], entry[1], entry[2], entry[3])


Step = Union[Pause, Resume, ForceResume, Mark, Unmark, SoftDemote, LogRecord]
"""One step of a plan; a `LogRecord` is a line logged at that point of the plan."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What one step of the control law chose, in the order the core applies it."""

    steps: tuple[Step, ...] = ()

    def count(self, kind: type) -> int:
        return sum(1 for step in self.steps if type(step) is kind)


class ControlLaw:
    """Bands and the pause / soft-demote / resume choices, over a `Ledger`."""

    def __init__(self, params: ControlParams, policy: PausePolicy, ledger: Ledger) -> None:
        self.params = params
        self.policy = policy
        self.ledger = ledger
        # The pause margin from growth (ControlParams.pause_margin_quantile): the working sets as the
        # last tick left them, the recent growth samples (fractions of a budget, oldest first) and the
        # margin they give (None: too few samples yet, the configured target holds).
        self._tick_end_used: dict[ReplicaKey, int] | None = None
        self._growth: deque[float] = deque()  # at most GROWTH_WINDOW_SAMPLES
        self.pause_margin: float | None = None

    # ------------------------------------------------------------------ the pause margin

    def note_tick_start(self) -> None:
        """Before a tick's plans: each replica's growth since the last tick ended (what the turns,
        admissions and releases between ticks did to its working set) becomes a sample, and the
        margin is the quantile of the recent samples."""
        q = self.params.pause_margin_quantile
        end = self._tick_end_used
        if q <= 0.0 or end is None:
            return
        ledger, samples = self.ledger, self._growth
        caps = ledger.caps
        for key, used in ledger.used.items():
            before = end.get(key)
            if before is not None and key in caps:
                samples.append((used - before) / caps[key].retention_tokens)
        while len(samples) > GROWTH_WINDOW_SAMPLES:
            samples.popleft()
        if len(samples) == GROWTH_WINDOW_SAMPLES:
            ordered = sorted(samples)
            self.pause_margin = max(0.0, ordered[nearest_rank(len(ordered), q)])

    def note_tick_end(self) -> None:
        """After a tick's transitions: the working sets the next tick's growth is measured from."""
        if self.params.pause_margin_quantile > 0.0:
            self._tick_end_used = dict(self.ledger.used)

    def pause_target_fraction(self) -> float:
        """Where a pause cycle stops, as a fraction of the budget: pause_target, or with a measured
        margin the pause threshold less that margin, whichever is higher (never above the
        threshold)."""
        p = self.params
        target = min(p.pause_target, p.pause_threshold)
        margin = self.pause_margin
        if margin is not None and p.pause_threshold - margin > target:
            return p.pause_threshold - margin
        return target

    # ------------------------------------------------------------------ bands and placement

    def band(self, key: ReplicaKey) -> Band:
        ledger = self.ledger
        cap = ledger.caps[key]
        p = self.params
        util = ledger.used[key] / cap.retention_tokens
        count_util = ledger.inflight[key] / cap.max_programs if cap.max_programs > 0 else 0.0
        if util >= p.pause_threshold or (cap.max_programs > 0 and count_util > p.pause_threshold):
            return Band.PAUSE
        if max(util, count_util) >= p.soft_demote_threshold:
            return Band.SOFT_DEMOTE
        return Band.NORMAL

    def choose_admission_replica(self, now: float, program: Program, *, gate: bool) -> ReplicaKey | None:
        """Feasible: the raw working set stays below the pause threshold and a request slot is free.
        Among those, the most headroom by the decayed working set (in-flight load, not idle
        residents). A new program queues behind held admissions (`gate`)."""
        if gate:
            return None
        ledger = self.ledger
        buffer = self.params.buffer_per_program_tokens
        if ledger.policy_weight is None:
            charge = program.token_total + buffer
            charges = dict.fromkeys(ledger.caps, charge)
        else:
            charges = {key: ledger.weight(program, key) + buffer for key in ledger.caps}
        feasible = [
            key
            for key, cap in ledger.caps.items()
            if ledger.used[key] + charges[key] < cap.retention_tokens * self.params.pause_threshold
            and (cap.max_programs <= 0 or ledger.inflight[key] < cap.max_programs)
        ]
        if not feasible:
            return None
        decayed = {key: ledger.decayed_used_one(now, key) for key in feasible}
        return max(feasible, key=lambda k: ledger.caps[k].retention_tokens - decayed[k])

    def may_leave_placement_to_router(self) -> bool:
        ledger = self.ledger
        if not self.params.soft_pinning or ledger.paused or ledger.waiting:
            return False
        return all(self.band(key) is Band.NORMAL for key in ledger.caps)

    def let_go(self, program: Program, replica: ReplicaKey) -> bool:
        """A program whose context the policy does not hold (weight 0: recomputing it is cheaper
        than holding it through its tools) gains nothing from a pin: its KV is the engine's to
        evict, as under plain KV routing, so with soft pinning its turns are routed like KV
        routing's."""
        ledger = self.ledger
        return (
            self.params.soft_pinning
            and ledger.policy_weight is not None
            and replica in ledger.caps
            and ledger.weight(program, replica) == 0
            and not ledger.paused
            and not ledger.waiting
        )

    def resume_group(self, program: Program) -> int:
        """-1: a tail program whose next turn waits; 0: an existing program whose next turn waits;
        1: a new program queued at admission; 2: a paused ACTING program with no turn waiting."""
        if program.status is Status.REASONING and self.ledger.is_tail(program):
            return -1
        if program.turns > 1 and program.status is Status.REASONING:
            return 0
        if program.turns <= 1 and program.status is Status.REASONING:
            return 1
        return 2

    # ------------------------------------------------------------------ the tick's steps

    def plan_soft_demote(self, now: float) -> Plan:
        """Every unmarked program on a replica in the SOFT_DEMOTE band is demoted for the window.

        The rule as a plan. The tick carries it out in one pass, planning and applying together
        (`SchedulerCore._soft_demote`), which tests/unit/scheduler/test_tick_one_pass.py holds equal to
        this plan applied."""
        ledger = self.ledger
        until = now + self.params.soft_demote_window_seconds
        steps: list[Step] = []
        for key in ledger.caps:
            if self.band(key) is not Band.SOFT_DEMOTE:
                continue
            # The residents (thousands at fleet size) in comprehensions, their ids and creation order read
            # by C-level getters: no Python call per program.
            demoted = [q for q in ledger.resident[key].values() if not q.marked]
            if demoted:
                announce = [q for q in demoted if q.soft_demoted_until <= now]  # not demoted already: an event each
                # Events in creation order: the residents' order is the order of their last re-account.
                announce.sort(key=_SEQ)
                steps.append(
                    SoftDemote(key, until, tuple(map(_SESSION_ID, demoted)), tuple(map(_SESSION_ID, announce)))
                )
        return Plan(tuple(steps))

    def plan_resume(self, now: float) -> Plan:
        """Greedy best-fit-decreasing from the one global paused queue onto any replica.

        Resume-side headroom R(r) = floor(capacity * c) - used_d(r), c = max(0, theta_p - h), where
        used_d decays ACTING tokens by 2^(-idle/tau). A replica takes resumes while R(r) > B. A
        candidate needs req = token_total + B of headroom, and its raw charge must keep the replica
        below the pause threshold (so a resume never triggers a pause in the same tick).
        """
        ledger = self.ledger
        if not ledger.paused:
            return Plan()
        p = self.params
        buffer = p.buffer_per_program_tokens
        c = p.resume_ceiling
        room: dict[ReplicaKey, int] = {}
        slots: dict[ReplicaKey, int | None] = {}
        used_d = ledger.decayed_used(now)
        for key, cap in ledger.caps.items():
            r = math.floor(cap.retention_tokens * c) - used_d[key]
            if r > buffer:
                room[key] = r
                slots[key] = (
                    max(0, math.floor(cap.max_programs * c) - ledger.inflight[key]) if cap.max_programs > 0 else None
                )
        if not room:
            return Plan()
        # Selection: a global knapsack over the summed headroom, in priority order.
        budget = sum(room.values())
        limited = all(s is not None for s in slots.values())
        total_slots = sum(s for s in slots.values() if s is not None) if limited else None
        # Placement: largest first onto the replica with most headroom (its previous one if it fits),
        # equal sizes in resume order (the sort by size is stable).
        selected = self._select_unbounded(now, budget, total_slots)
        if selected is None:
            selected = self._select(now, budget, total_slots)
            selected.sort(key=_TOKEN_TOTAL, reverse=True)
        if not selected:
            return Plan()
        min_req = selected[-1].token_total + buffer  # the smallest: the order is by size, descending
        order = sorted(room, key=lambda k: room[k], reverse=True)
        rank = [-room[k] for k in order]  # ascending, beside `order`: where a replica goes back (bisect)
        used = dict(ledger.used)  # the raw working sets as the chosen resumes will leave them
        caps = ledger.caps
        limit = {key: caps[key].retention_tokens * p.pause_threshold for key in room}
        # Per budget size (a policy's weight depends on the replica only through it): an upper bound
        # of the raw slack, limit - used, over the replicas still taking resumes. It stays one as the
        # resumes only add to `used` and take replicas out of `order`; it is tightened when the replica
        # that held it takes a resume. A program whose charge is not below the bound of any size fits
        # nowhere (resume_target would find nothing): skipped without a scan.
        bound: dict[int, float] = {}
        for key in order:
            size, slack = caps[key].retention_tokens, limit[key] - used[key]
            if slack > bound.get(size, -math.inf):
                bound[size] = slack
        single = next(iter(bound)) if len(bound) == 1 else None
        acting, w_a, floor = Status.ACTING, p.acting_token_weight, math.floor
        steps: list[Step] = []
        if single is not None:
            self._place_on_one_size(selected, single, min_req, order, rank, room, slots, used, limit, bound, steps)
            return Plan(tuple(steps))
        for program in selected:
            if not order or min_req > room[order[0]]:
                break
            # raw_weight_tokens, inline (this runs for every selected program)
            raw = floor(program.token_total * w_a) if program.status is acting else program.token_total
            needs = {size: ledger.weight_at(program, raw, size) + buffer for size in bound}
            if all(needs[size] >= slack + 1.0 for size, slack in bound.items()):
                continue
            target = self.resume_target(program, order, room, slots, used, limit, needs)
            if target is None:
                continue
            req = program.token_total + buffer
            steps.append(Resume(program.session_id, target))
            size = caps[target].retention_tokens
            held = limit[target] - used[target] >= bound[size]
            used[target] += needs[size]  # its charge once resumed there
            room[target] -= req
            if program.status is Status.REASONING and (slot := slots[target]) is not None:
                slots[target] = slot - 1
            _reorder(order, rank, room, target, req, buffer)
            if held:
                bound[size] = max(
                    (limit[k] - used[k] for k in order if caps[k].retention_tokens == size), default=-math.inf
                )
        return Plan(tuple(steps))

    def _place_on_one_size(
        self,
        selected: list[Program],
        size: int,
        min_req: int,
        order: list[ReplicaKey],
        rank: list[int],
        room: dict[ReplicaKey, int],
        slots: dict[ReplicaKey, int | None],
        used: dict[ReplicaKey, int],
        limit: dict[ReplicaKey, float],
        bound: dict[int, float],
        steps: list[Step],
    ) -> None:
        """plan_resume's placement loop when every replica taking resumes has one budget `size` (the
        usual fleet), appending its resumes to `steps`, each placed by `resume_target` over the
        same bookkeeping. A program's charge there does not depend on where it goes, so all are
        weighed before the loop (the policy's weight on that size, asked for once), and the programs
        whose charge is not below the bound (they fit nowhere) are passed over in C: by bisection when
        the charges descend along `selected` (T + B each: the raw weight, ACTING tokens at full
        weight), else by a scan. The bound only falls as resumes are placed, so every program passed
        over would have been skipped one by one."""
        p = self.params
        buffer, w_a, floor = p.buffer_per_program_tokens, p.acting_token_weight, math.floor
        acting, reasoning = Status.ACTING, Status.REASONING
        weigh = self.ledger.weigher(size)
        raws = [floor(q.token_total * w_a) if q.status is acting else q.token_total for q in selected]
        charges = (
            [raw + buffer for raw in raws]
            if weigh is None
            else list(map(add, map(weigh, selected, raws), repeat(buffer)))
        )
        descending = [-charge for charge in charges] if weigh is None and w_a == 1.0 else None
        i, end = 0, len(selected)
        while order and min_req <= room[order[0]]:
            least = bound[size] + 1.0  # a charge not below it fits nowhere
            if descending is not None:
                i = bisect_right(descending, -least, i)  # the first whose charge is below it
            else:
                i = next(compress(count(i), map(lt, islice(charges, i, None), repeat(least))), end)
            if i >= end:
                break
            program, charge = selected[i], charges[i]
            i += 1
            target = self.resume_target(program, order, room, slots, used, limit, {size: charge})
            if target is None:
                continue
            req, takes_slot = program.token_total + buffer, program.status is reasoning
            steps.append(Resume(program.session_id, target))
            held = limit[target] - used[target] >= bound[size]
            used[target] += charge  # its charge once resumed there
            room[target] -= req
            if takes_slot and (slot := slots[target]) is not None:
                slots[target] = slot - 1
            _reorder(order, rank, room, target, req, buffer)
            if held:
                bound[size] = max((limit[k] - used[k] for k in order), default=-math.inf)

    def _select(self, now: float, budget: int, total_slots: int | None) -> list[Program]:
        """The knapsack: in resume order, each program whose req = T + B fits in what `budget` has left
        is selected, and with request slots (`total_slots` not None) a REASONING one only while a slot
        is left.

        It reads only as much of the order as can still select something. Within a group the keys
        ascend, and a program's req is at least its key + B (the key is T, or T over a wait discount
        of 1 or more), so once what is left is below a program's key + B, nothing further in its group
        fits. Once the slots are taken, no REASONING program (groups -1 to 1, all before the ACTING
        group 2) can be selected, and when none is free at all they are not even keyed: at fleet size
        most of the paused queue is new programs waiting for a slot."""
        ledger = self.ledger
        run = [ledger.programs[sid] for sid in ledger.paused]  # in queue order
        if total_slots == 0:  # no slot is free: the REASONING programs are not even keyed
            run = [q for q in run if q.status is not Status.REASONING]
        keyed = self._resume_keys(now, run)
        keyed.sort()
        buffer = self.params.buffer_per_program_tokens
        selected: list[Program] = []
        select = selected.append
        cumulative = slots_needed = 0
        start, end = 0, len(keyed)
        slot_limit = -1 if total_slots is None else total_slots  # -1: no request-slot limit
        while start < end:
            group = keyed[start][0]
            stop = bisect_left(keyed, (group + 1,), start)  # this group's end (no Program compared)
            takes_slot = group < 2 and slot_limit >= 0  # REASONING: each takes a slot
            if takes_slot and slots_needed >= slot_limit:
                start = bisect_left(keyed, (2,), start)  # none left: the REASONING programs from here are passed over
                continue
            for _, key, _, _, program in keyed[start:stop]:
                if budget - cumulative < key + buffer:
                    break
                req = program.token_total + buffer
                if cumulative + req <= budget:
                    select(program)
                    cumulative += req
                    if takes_slot:
                        slots_needed += 1
                        if slots_needed >= slot_limit:
                            break
            start = stop
        return selected

    def _select_unbounded(self, now: float, budget: int, total_slots: int | None) -> list[Program] | None:
        """`_select` sorted by size, descending, equal sizes in resume order, when the budget selects
        everything the slots let through (None when it may not): every ACTING program and the first
        `total_slots` REASONING ones in resume order (all of them without a slot limit, none when no
        slot is free). When the reqs of those together fit the budget, each fits what the ones
        before it left, so the knapsack takes exactly them. Then only the REASONING programs (when
        their slots run out) and the programs of equal sizes are keyed: at fleet size the summed
        headroom usually holds the whole paused queue, which is then neither keyed nor sorted by
        resume key whole."""
        ledger, p = self.ledger, self.params
        programs, paused, reasoning_status = ledger.programs, ledger.paused, Status.REASONING
        queue = [programs[sid] for sid in paused]  # in queue order: the resume order's last tie-break
        if total_slots == 0:
            # No slot is free: the REASONING programs are passed over, unkeyed (at fleet size most of
            # the paused queue is new programs waiting for one).
            queue = [q for q in queue if q.status is not reasoning_status]
        elif total_slots is not None:
            reasoning = [q for q in queue if q.status is reasoning_status]
            if len(reasoning) > total_slots:
                # The first total_slots in resume order (the entries are unique: the position is in them).
                kept = {id(entry[4]) for entry in nsmallest(total_slots, self._resume_keys(now, reasoning))}
                queue = [q for q in queue if q.status is not reasoning_status or id(q) in kept]
        if sum(map(_TOKEN_TOTAL, queue)) + len(queue) * p.buffer_per_program_tokens > budget:
            return None
        queue.sort(key=_TOKEN_TOTAL, reverse=True)  # stable: equal sizes stay in queue order
        # The programs whose size another one shares (C-level: no Python step per program), sorted
        # among themselves by (size descending, resume key): their runs are where they were.
        sizes = list(map(_TOKEN_TOTAL, queue))
        same_as_next = list(map(eq, sizes, islice(sizes, 1, None)))
        tied = list(compress(range(len(queue)), map(or_, [False, *same_as_next], [*same_as_next, False])))
        if tied:
            keyed = self._resume_keys(now, [queue[i] for i in tied])
            keyed.sort(key=_size_then_resume_key)
            for i, entry in zip(tied, keyed):
                queue[i] = entry[4]
        return queue

    def _resume_keys(self, now: float, run: list[Program]) -> list[tuple[int, float, int, int, Program]]:
        """The resume keys of the paused programs of `run`, unsorted, as tuples that sort in resume
        order by their own comparison (no key function called per program): `resume_group`, then the
        smallest effective size T / (1 + waited / H) (H = 0: T, the reference), then the oldest pause,
        then the place in `run` (pause sequences are unique: it only keeps the Program out of the
        comparison). Packing (the most programs decoding together) against waiting (the longer a
        program waits, the likelier it sets the end of the batch).

        Keyed afresh each tick: the key moves with `now` when H > 0 and with the tail quantile, and the
        benchmark's mix changes a third of the queue per tick, so a kept order would cost as much to
        maintain. Built in one comprehension (the group is `resume_group`, inline)."""
        ledger = self.ledger
        paused, tail, discount, reasoning = (
            ledger.paused,
            ledger.tail_turns,
            self.params.resume_wait_discount_seconds,
            Status.REASONING,
        )
        return [
            (
                2
                if q.status is not reasoning
                else -1
                if tail is not None and q.turns > tail
                else 0
                if q.turns > 1
                else 1,
                # size / (1 + max(0, waited) / H), the same float operations without a call
                q.token_total
                / (
                    1.0
                    + ((w if (w := now - since) > 0.0 else 0.0) if (since := q.paused_since) is not None else 0.0)
                    / discount
                )
                if discount > 0
                else float(q.token_total),
                paused[q.session_id],
                position,
                q,
            )
            for position, q in enumerate(run)
        ]

    def resume_target(
        self,
        program: Program,
        order: list[ReplicaKey],
        room: dict[ReplicaKey, int],
        slots: dict[ReplicaKey, int | None],
        used: dict[ReplicaKey, int],
        limit: dict[ReplicaKey, float],
        needs: dict[int, int],
    ) -> ReplicaKey | None:
        """Its previous replica if it fits there, else the first of `order` (by headroom) it fits.
        Fits: `req` within the resume-side room, its raw charge `needs[budget]` keeps the replica
        below `limit` (the pause threshold), and a request slot is free if it takes one."""
        caps = self.ledger.caps
        req = program.token_total + self.params.buffer_per_program_tokens
        takes_slot = program.status is Status.REASONING

        last = program.last_replica
        # `last in order` without a scan: a replica leaves `order` exactly when its room drops to B.
        if (
            last is not None
            and last in room
            and req <= room[last]
            and room[last] > self.params.buffer_per_program_tokens
            and used[last] + needs[caps[last].retention_tokens] < limit[last]
            and not (takes_slot and slots[last] == 0)
        ):
            return last  # its KV may still be in the HiCache host tier there
        for key in order:
            if room[key] < req:
                break  # sorted by headroom: nothing further fits
            if used[key] + needs[caps[key].retention_tokens] < limit[key] and not (takes_slot and slots[key] == 0):
                return key
        return None

    def plan_aging(self, now: float) -> Plan:
        """Bound the wait of large programs that best-fit resume keeps passing over.

        Shortest-first resume starves a large paused program while smaller ones keep taking the
        room it needs; the reference bounds that only by forced resume after
        resume_timeout_seconds (30 min). Here a held admission that has waited
        resume_aging_seconds makes room: on the replica where pausing its ACTING programs frees
        the most (room_r = capacity * pause_threshold - (used - sum of unmarked ACTING weights)),
        those programs are paused shortest first until the aged one fits below the pause
        threshold, and it resumes there. Oldest first, at most one per replica per tick, so
        memory rotates between waiting programs instead of starving the largest; a program resumed
        this way is not paused for pressure for the next resume_aging_seconds / 2 (its quantum). A program that
        cannot fit even an emptied replica is resumed, pausing nobody, where the most is free: it
        thrashes wherever it runs, and holding it only adds latency.
        """
        ledger = self.ledger
        age = self.params.resume_aging_seconds
        oldest = ledger.oldest_wait()
        if oldest is None or now - oldest < age:
            return Plan()  # not even the oldest held admission has aged: no scan of them all
        buffer = self.params.buffer_per_program_tokens
        threshold = self.params.pause_threshold
        aged: list[tuple[float, Program]] = []
        for sid, request_ids in ledger.waiting.items():
            program = ledger.programs[sid]
            if program.lifecycle is not Lifecycle.PAUSED:
                continue
            started = min(ledger.turns[rid].started_at for rid in request_ids)
            if now - started >= age:
                aged.append((started, program))
        aged.sort(key=lambda item: (item[0], item[1].seq))
        used_targets: set[ReplicaKey] = set()
        steps: list[Step] = []
        charge, acting, tail = ledger.charge, Status.ACTING, ledger.tail_turns

        def movable_on(key: ReplicaKey) -> list[Program]:
            """Its unmarked ACTING programs outside the tail (ledger.is_tail, inline)."""
            return [
                q
                for q in ledger.resident[key].values()
                if q.status is acting and not q.marked and (tail is None or q.turns <= tail)
            ]

        # Each replica is a target once, so only a target's working set moves within this step: a
        # replica's room is the same for every aged program, and its residents are walked once, when
        # the first aged program asks (not once per aged program).
        rooms: dict[ReplicaKey, float] = {}
        for started, program in aged:
            best: tuple[float, ReplicaKey] | None = None
            for key, cap in ledger.caps.items():
                if key in used_targets:
                    continue
                room = rooms.get(key)
                if room is None:
                    # A resident's charge is its weight plus the buffer (kept so by recharge and reweigh):
                    # summing the charges weighs nobody, and only the chosen replica's programs are sorted.
                    reclaimable = sum([charge[q.session_id][1] for q in movable_on(key)])
                    room = rooms[key] = cap.retention_tokens * threshold - (ledger.used[key] - reclaimable)
                if best is None or room > best[0]:
                    best = (room, key)
            if best is None:
                break
            room, target = best
            movable = sorted(movable_on(target), key=lambda q: (q.token_total, q.seq))  # shortest, then oldest
            need = ledger.weight(program, target) + buffer
            if need >= room:
                # It cannot fit even an emptied replica: pausing others would not help it, so it
                # goes where the most is free now and pauses nobody.
                free = [k for k in ledger.caps if k not in used_targets]
                target = max(free, key=lambda k: ledger.caps[k].retention_tokens - ledger.used[k])
                movable = []
            limit = ledger.caps[target].retention_tokens * threshold
            used = ledger.used[target]
            for victim in movable:
                if used + need < limit:
                    break
                steps.append(Pause(victim.session_id, "aging"))
                used -= ledger.charge[victim.session_id][1]  # what its pause takes off the replica
            used_targets.add(target)
            # Its quantum: a pause cycle may not send it straight back to the queue (a program too
            # large to share a replica would otherwise bounce between pause and aging every turn).
            steps.append(Resume(program.session_id, target, protect_until=now + age / 2))
            steps.append(
                LogRecord(
                    INFO,
                    "thunderagent.program resumed program=%s reason=aging waited=%.1fs "
                    "worker=%s tokens=%d" % (program.session_id, now - started, target.worker_id, program.token_total),
                )
            )
        return Plan(tuple(steps))

    def plan_forced(self, now: float) -> Plan:
        """Every program with a held admission that waited resume_timeout_seconds or more."""
        ledger = self.ledger
        timeout = self.params.resume_timeout_seconds
        oldest = ledger.oldest_wait()
        if oldest is None or now - oldest < timeout:
            return Plan()  # not even the oldest held admission is due: no scan of them all
        steps: list[Step] = []
        for sid, request_ids in ledger.waiting.items():
            for rid in request_ids:
                waited_s = now - ledger.turns[rid].started_at
                if waited_s >= timeout:
                    steps.append(ForceResume(sid, waited_s))
                    break
        return Plan(tuple(steps))

    def forced_target(self, now: float) -> ReplicaKey | None:
        """Where a forced resume goes: argmax(capacity - used_d) over the snapshot; None (any) when empty."""
        ledger = self.ledger
        if not ledger.caps:
            return None
        used_d = ledger.decayed_used(now)
        return max(ledger.caps, key=lambda k: ledger.caps[k].retention_tokens - used_d[k])

    def plan_pauses(self, now: float) -> Plan:
        """On each replica in the PAUSE band, what the pause policy pauses and marks (unmarking a
        replica whose pressure is gone). Replicas do not interact: a pause changes only its own."""
        ledger = self.ledger
        p = self.params
        buffer = p.buffer_per_program_tokens
        target_frac = self.pause_target_fraction()  # of tokens (the margin is measured in tokens)
        count_frac = min(p.pause_target, p.pause_threshold)
        weight_at = ledger.weight
        by_seq = attrgetter("seq")
        acting, w_a, floor = Status.ACTING, p.acting_token_weight, math.floor

        def raw_weight(q: Program) -> int:
            """raw_weight_tokens, inline: the policy asks it for every program it pauses or marks."""
            return floor(q.token_total * w_a) if q.status is acting else q.token_total

        charge = ledger.charge

        def charged_on(key: ReplicaKey) -> Callable[[Program], int]:
            def weight(q: Program) -> int:
                """w(p) of a resident of `key` as charged: the charge is kept equal to the policy's weight
                (recharge on every change of the program or of the budget, reweigh when the policy's
                estimates move it), so reading it costs a lookup instead of the policy's formula."""
                entry = charge.get(q.session_id)
                return entry[1] - buffer if entry is not None and entry[0] == key else weight_at(q, key)

            return weight

        steps: list[Step] = []
        for key, cap in ledger.caps.items():
            token_target = cap.retention_tokens * target_frac
            count_target = cap.max_programs * count_frac if cap.max_programs > 0 else None
            if self.band(key) is not Band.PAUSE:
                if ledger.used[key] <= token_target and (count_target is None or ledger.inflight[key] <= count_target):
                    # Pressure is gone: marks are not sticky.
                    # In creation order (the residents' order is the order of their last re-account).
                    marked = [q for q in ledger.resident[key].values() if q.marked]
                    steps.extend(Unmark(q.session_id) for q in sorted(marked, key=by_seq))
                continue
            tail = ledger.tail_turns  # ledger.is_tail, inline: this runs for every resident of the replica
            programs = [
                q
                for q in ledger.resident[key].values()
                if q.pause_protected_until <= now and (tail is None or q.turns <= tail)
            ]
            programs.sort(key=by_seq)
            before = ledger.used[key]

            # Without a policy weight a program weighs its raw weight wherever it is.
            weight_on = raw_weight if ledger.policy_weight is None else charged_on(key)
            chosen = self.policy.plan(
                PauseContext(
                    replica=key,
                    programs=programs,
                    used_tokens=before,
                    target_tokens=token_target,
                    reasoning_count=ledger.inflight[key],
                    count_target=count_target,
                    buffer_tokens=buffer,
                    weight_tokens=weight_on,
                    now=now,
                )
            )
            after = before
            for sid in dict.fromkeys(chosen.pause):
                program = ledger.programs[sid]
                if program.replica != key or program.status is not Status.ACTING or program.marked:
                    raise ValueError(f"pause policy {self.policy.name!r} chose an invalid program {sid!r}")
                steps.append(Pause(sid, "pressure"))
                after -= ledger.charge[sid][1]  # what its pause takes off the replica
            for sid in dict.fromkeys(chosen.mark):
                program = ledger.programs[sid]
                if program.replica != key or program.status is not Status.REASONING or program.marked:
                    raise ValueError(f"pause policy {self.policy.name!r} chose an invalid mark {sid!r}")
                steps.append(Mark(sid, key))
            if len(chosen.pause) != len(set(chosen.pause)) or len(chosen.mark) != len(set(chosen.mark)):
                raise ValueError(f"pause policy {self.policy.name!r} chose a program twice")
            if chosen.pause or chosen.mark:
                steps.append(
                    LogRecord(
                        INFO,
                        "scheduler.tick worker=%s dp_rank=%s paused=%d marked=%d "
                        "util=%.4f -> %.4f"
                        % (
                            key.worker_id,
                            key.dp_rank,
                            len(chosen.pause),
                            len(chosen.mark),
                            before / cap.retention_tokens,
                            after / cap.retention_tokens,
                        ),
                    )
                )
        return Plan(tuple(steps))
