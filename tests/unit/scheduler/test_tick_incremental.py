"""The tick's incremental bookkeeping against recomputation from scratch.

The tick reads maintained sums (per-replica used / in-flight / passthrough counts, residents, the
decayed acting sums) instead of rescanning the table, and the resume placement skips programs by an
upper bound of the replicas' raw slack instead of scanning every replica for each. Random event
sequences at a small fleet size check both: the ledger's sums equal a recomputation
(`Ledger.check_invariants`), and every resume plan equals the exhaustive scan's.
"""

from __future__ import annotations

import math
import random

import pytest

from services.scheduler.core import (
    CapacitySnapshot,
    ControlParams,
    ReplicaCapacity,
    ReplicaKey,
    SchedulerCore,
    Status,
    TurnOutcome,
    Verdict,
)
from services.scheduler.core.control import ControlLaw, ForceResume, Plan, Resume
from services.scheduler.core.model import Program
from services.scheduler.core.policies import make_pause_policy
from tests.unit.scheduler.helpers import full_order_knapsack


def exhaustive_resume_plan(law: ControlLaw, now: float) -> Plan:
    """plan_resume as specified (docs/scheduler.md), without its shortcuts: every selected program
    tries its previous replica, then every replica in headroom order."""
    ledger, p = law.ledger, law.params
    if not ledger.paused:
        return Plan()
    buffer, c = p.buffer_per_program_tokens, p.resume_ceiling
    room: dict[ReplicaKey, int] = {}
    slots: dict[ReplicaKey, int | None] = {}
    for key, cap in ledger.caps.items():
        r = math.floor(cap.retention_tokens * c) - ledger.decayed_used_one(now, key)
        if r > buffer:
            room[key] = r
            slots[key] = (
                max(0, math.floor(cap.max_programs * c) - ledger.inflight[key]) if cap.max_programs > 0 else None
            )
    if not room:
        return Plan()

    budget = sum(room.values())
    total_slots = sum(s for s in slots.values() if s is not None) if None not in slots.values() else None
    selected = full_order_knapsack(law, now, budget, total_slots)
    if not selected:
        return Plan()
    selected.sort(key=lambda q: q.token_total, reverse=True)
    min_req = min(q.token_total for q in selected) + buffer
    order = sorted(room, key=lambda k: room[k], reverse=True)
    used = dict(ledger.used)
    steps = []
    for q in selected:
        if not order or min_req > room[order[0]]:
            break
        req = q.token_total + buffer
        takes_slot = q.status is Status.REASONING

        def fits(key: ReplicaKey, q: Program = q, req: int = req, takes_slot: bool = takes_slot) -> bool:
            return (
                req <= room[key]
                and used[key] + ledger.weight(q, key) + buffer < ledger.caps[key].retention_tokens * p.pause_threshold
                and not (takes_slot and slots[key] == 0)
            )

        candidates = ([q.last_replica] if q.last_replica in order else []) + order
        target = next((key for key in candidates if fits(key)), None)
        if target is None:
            continue
        steps.append(Resume(q.session_id, target))
        used[target] += ledger.weight(q, target) + buffer
        room[target] -= req
        if takes_slot and slots[target] is not None:
            slots[target] -= 1
        order.remove(target)
        if room[target] > buffer:
            idx = 0
            while idx < len(order) and room[order[idx]] >= room[target]:
                idx += 1
            order.insert(idx, target)
    return Plan(tuple(steps))


def fleet(budgets: list[int], slots: int) -> CapacitySnapshot:
    return CapacitySnapshot(
        1, tuple(ReplicaCapacity(f"w{i // 4}", i % 4, budget, slots) for i, budget in enumerate(budgets))
    )


@pytest.mark.parametrize(
    ("policy", "mixed", "slots", "seed"),
    [
        ("threshold", False, 16, 1),
        ("threshold", True, 0, 2),
        ("cost_aware", True, 12, 3),
        ("cost_aware", False, 0, 4),
        # One budget size at the raw weight: the placement skips a run of programs too large for any
        # replica in one step (no slot limit, and a slot limit).
        ("threshold", False, 0, 5),
        ("cost_aware", False, 16, 6),
    ],
)
def test_incremental_sums_and_resume_plans_equal_recomputation(policy: str, mixed: bool, slots: int, seed: int):
    rng = random.Random(seed)
    params = ControlParams(
        scheduler_interval_seconds=5.0,
        acting_decay_tau_seconds=30.0,
        resume_wait_discount_seconds=rng.choice([0.0, 30.0]),
    )
    core = SchedulerCore(params, make_pause_policy(policy), ticket_lease_seconds=20.0)
    programs = 300
    sizes = [min(60_000, int(rng.lognormvariate(8.5, 0.9))) for _ in range(programs)]
    total = sum(s + params.buffer_per_program_tokens for s in sizes)
    budgets = [total // 10 * ((1 + i % 3) if mixed else 2) // 2 for i in range(8)]
    core.apply_capacity(0.0, fleet(budgets, slots))
    keys = [ReplicaKey(f"w{i // 4}", i % 4) for i in range(8)]
    now, counter = 0.0, 0
    in_flight: dict[str, str] = {}
    for sid, size in enumerate(sizes):  # the bench's start: most programs at a tool call, some in a turn
        counter += 1
        result = core.admit(now, f"p{sid}", "", size // 4, f"r{counter}")
        if result.decision.verdict is Verdict.PLACED and rng.random() < 0.9:
            core.complete(now, f"p{sid}", f"r{counter}", result.decision.replica, size, size // 20)
        else:
            in_flight[f"p{sid}"] = f"r{counter}"
    resume_plans = 0
    for _ in range(1_000):
        now += rng.choice([0.0, 0.5, 2.0])
        sid = rng.randrange(programs)
        name = f"p{sid}"
        op = rng.random()
        if op < 0.45:
            if name in in_flight:
                outcome = rng.choice([TurnOutcome.OK, TurnOutcome.OK, TurnOutcome.CANCELLED])
                core.complete(
                    now, name, in_flight.pop(name), rng.choice(keys + [None]), sizes[sid], sizes[sid] // 20, 0, outcome
                )
            else:
                counter += 1
                rid = f"r{counter}"
                result = core.admit(now, name, "", sizes[sid] // 4 if rng.random() < 0.5 else 0, rid)
                in_flight[name] = rid
                if result.decision.verdict is Verdict.PLACED:
                    core.renew_leases(now, (), (rid,))
        elif op < 0.5 and name in in_flight:
            core.cancel_admission(now, in_flight.pop(name))
        elif op < 0.53:
            core.release(now, name)
            in_flight.pop(name, None)
        elif op < 0.56 and name in in_flight:
            core.bind_request(in_flight[name], rng.choice(keys))
        elif op < 0.58:
            counter += 1
            rid = f"pt{counter}"
            core.admit(now, "", "", rng.randrange(10, 5_000), rid)
            core.bind_request(rid, rng.choice(keys))
        elif op < 0.6:
            core.expire_leases(now)
        elif op < 0.605:
            # A replica leaves the snapshot (or comes back): its programs are unplaced.
            gone = rng.randrange(8)
            shown = [b if i != gone or rng.random() < 0.5 else 0 for i, b in enumerate(budgets)]
            core.apply_capacity(now, fleet(shown, slots))
        elif op < 0.61:
            # A replica's budget changes (a worker restarted with another pool, a host tier added): the
            # policy's weight of its residents depends on it.
            changed = rng.randrange(8)
            budgets = [int(b * rng.choice([0.5, 1.5])) if i == changed else b for i, b in enumerate(budgets)]
            core.apply_capacity(now, fleet(budgets, slots))
        elif op > 0.9:
            expected = exhaustive_resume_plan(core.control, now)
            assert core.control.plan_resume(now) == expected
            resume_plans += len(expected.steps)
            result = core.tick(now)
            stats = {s.replica: s for s in result.replicas}
            for key, stat in stats.items():
                resident = [core.ledger.programs[s] for s in core.ledger.resident[key]]
                assert stat.active_programs == sum(1 for q in resident if q.status is Status.REASONING)
        core.ledger.check_invariants(now)
    assert resume_plans > 20  # the sequence exercised the resume placement


def test_the_cost_aware_weight_memo_follows_the_estimates():
    """The hold fraction is remembered per (size, budget) only for the estimates it was computed with."""
    from services.scheduler.core.policies.cost_aware import CostAwarePauseParams, CostAwarePausePolicy

    policy = CostAwarePausePolicy(CostAwarePauseParams())
    program = Program("p", "", 0.0, 0, status=Status.ACTING, token_total=40_000)

    def fresh() -> int:
        other = CostAwarePausePolicy(CostAwarePauseParams())
        other.tool_seconds, other.prefill_tokens_per_s = policy.tool_seconds, policy.prefill_tokens_per_s
        return other.weight_tokens(program, 40_000, 1_000_000)

    assert policy.weight_tokens(program, 40_000, 1_000_000) == fresh()
    for seconds in (600.0, 0.5, 30.0):
        for _ in range(50):
            policy.observe_tool(seconds)
        assert policy.refresh()
        assert policy.weight_tokens(program, 40_000, 1_000_000) == fresh()
    weights = {policy.weight_tokens(program, 40_000, 1_000_000)}
    policy.tool_seconds = 1e-6  # set directly (tools this short: every context is worth holding)
    assert policy.weight_tokens(program, 40_000, 1_000_000) == fresh()
    weights.add(fresh())
    assert len(weights) == 2  # the estimates moved the weight (the check above is not vacuous)


def full_scan_idle_due(core: SchedulerCore, now: float) -> list[str]:
    """Idle expiry as specified: every ACTING program idle for the TTL, no admission waiting on it,
    in table order (what the tick did before the idle index)."""
    ttl = core.params.program_idle_ttl_seconds
    return [
        q.session_id
        for q in core.ledger.programs.values()
        if q.status is Status.ACTING
        and q.acting_since is not None
        and now - q.acting_since >= ttl
        and not core.ledger.waiting.get(q.session_id)
    ]


def full_scan_forced(core: SchedulerCore, now: float) -> Plan:
    """Forced resume as specified: each program with a held admission that waited the timeout."""
    steps = []
    for sid, request_ids in core.ledger.waiting.items():
        waits = [now - core.ledger.turns[rid].started_at for rid in request_ids]
        due = [w for w in waits if w >= core.params.resume_timeout_seconds]
        if due:
            steps.append(ForceResume(sid, due[0]))
    return Plan(tuple(steps))


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_idle_expiry_and_forced_resume_from_their_indexes_equal_a_scan(seed: int):
    """Idle expiry pops a deadline heap and forced resume reads the oldest held admission from one:
    on random sequences both decide exactly what a scan of the table and of the held admissions does."""
    rng = random.Random(seed)
    params = ControlParams(
        scheduler_interval_seconds=5.0,
        program_idle_ttl_seconds=rng.choice([20.0, 45.0]),
        resume_timeout_seconds=rng.choice([6.0, 15.0]),
    )
    core = SchedulerCore(params, ticket_lease_seconds=30.0)
    keys = [ReplicaKey("w0", i) for i in range(4)]
    core.apply_capacity(0.0, fleet([40_000] * 4, 8))
    now, counter, expired, forced = 0.0, 0, 0, 0
    in_flight: dict[str, str] = {}
    for _ in range(3_000):
        now += rng.choice([0.0, 0.0, 1.0, 3.0])
        name = f"p{rng.randrange(120)}"
        op = rng.random()
        if op < 0.5:
            if name in in_flight:
                core.complete(now, name, in_flight.pop(name), rng.choice(keys + [None]), rng.randrange(100, 9_000), 50)
            else:
                counter += 1
                result = core.admit(now, name, "", rng.randrange(0, 4_000), f"r{counter}")
                in_flight[name] = f"r{counter}"
                if result.decision.verdict is Verdict.PLACED:
                    core.renew_leases(now, (), (f"r{counter}",))
        elif op < 0.58 and name in in_flight:
            core.cancel_admission(now, in_flight.pop(name))
        elif op < 0.62:
            core.release(now, name)
            in_flight.pop(name, None)
        elif op < 0.66:
            core.expire_leases(now)
            in_flight = {s: r for s, r in in_flight.items() if r in core.ledger.turns}
        elif op > 0.9:
            forced_plan = full_scan_forced(core, now)
            assert core.control.plan_forced(now) == forced_plan
            forced += len(forced_plan.steps)
            expected = full_scan_idle_due(core, now)
            result = core.tick(now)
            assert [e.session_id for e in result.events if e.kind.name == "EXPIRED"] == expected
            assert result.expired == len(expected)
            expired += len(expected)
            for sid in expected:
                in_flight.pop(sid, None)
        core.ledger.check_invariants(now)
    assert expired > 20 and forced > 5  # the sequence exercised both


def test_the_idle_index_keeps_at_most_as_many_stale_entries_as_live_ones_under_churn():
    """Issue 24: every Complete leaves a stale idle-index entry behind (the program's previous
    acting_since), and each keeps its session id alive. Under `make bench-router-memory`'s churn (the
    open programs take turns; the oldest is released and a new one opened in their place) the heap
    must stay within twice its live entries: at four times, it rose for longer than the benchmark's
    10-minute run (3 MiB with 10,000 programs open) and read as a leak."""
    core = SchedulerCore(ControlParams(scheduler_interval_seconds=5.0, program_idle_ttl_seconds=7200.0))
    core.apply_capacity(0.0, fleet([10**9] * 2, 0))
    rng = random.Random(24)
    open_programs: list[str] = []
    now, counter, peak, rebuilds = 0.0, 0, 0, 0

    def turn(sid: str) -> None:
        nonlocal now, counter, peak, rebuilds
        now += 0.025
        counter += 1
        assert core.admit(now, sid, "", 600, f"r{counter}").decision.verdict is Verdict.PLACED
        before = len(core.ledger.idle_heap)
        core.complete(now, sid, f"r{counter}", ReplicaKey("w0", counter % 2), 900, 4)
        rebuilds += len(core.ledger.idle_heap) < before
        peak = max(peak, len(core.ledger.idle_heap))

    for i in range(400):
        open_programs.append(f"p{i}")
        for _ in range(3):
            turn(open_programs[-1])
    for i in range(400, 4_400):
        if rng.random() < 0.5:
            core.release(now, open_programs.pop(0))
            open_programs.append(f"p{i}")
            for _ in range(3):
                turn(open_programs[-1])
        else:
            turn(rng.choice(open_programs))
    core.ledger.check_invariants(now)
    assert len(core.ledger.idle_since) == len(open_programs) == 400
    assert rebuilds >= 5  # the sequence ran the index through several rebuilds
    assert peak <= 2 * 400
