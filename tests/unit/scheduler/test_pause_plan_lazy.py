"""The pause plans weigh only the programs they reach, and decide what the plans over all of them do.

The threshold plan sorts a replica's ACTING programs on their size alone (the programs come in
creation order and the sort is stable, so ties stay oldest first), and the cost-aware policy no
longer weighs every resident up front to drop the ACTING ones of weight 0: its pause loop passes
over them where it reaches them. Random event sequences run through two cores side by side, one
whose policy plans as the formula reads (the programs that count filtered first, then sorted on
(size, creation order), from a shuffled copy) and whose aging plan weighs every movable program by
the formula, one as the product runs (the aging plan sums the movable programs' charges and sorts
only the chosen replica's); every answer, every tick's events and logs, and every ledger field must
agree.
"""

from __future__ import annotations

import random
from typing import Callable

import pytest

from services.scheduler.core import ReplicaKey, SchedulerCore, TurnOutcome, Verdict
from services.scheduler.core.control import ControlLaw, Pause, Plan, Resume, Step
from services.scheduler.core.defaults import service_control_params
from services.scheduler.core.model import Lifecycle, LogRecord, Program, Status
from services.scheduler.core.params import ControlParams
from services.scheduler.core.policies import CostAwarePauseParams, make_pause_policy
from services.scheduler.core.policies.base import PauseContext, PausePlan
from tests.unit.scheduler.test_reweigh import assert_same_ledger, assert_same_stats, fleet


def formula_plan(ctx: PauseContext, counts: Callable[[Program], bool], rng: random.Random) -> PausePlan:
    """The threshold plan (policies/threshold.py's docstring) over the programs that `counts`, with
    the order spelled out, on the programs in a random order."""
    programs = [q for q in ctx.programs if counts(q)]
    rng.shuffle(programs)
    by_size_then_age = sorted(programs, key=lambda q: (q.token_total, q.seq))
    used, count = ctx.used_tokens, ctx.reasoning_count
    pause = []
    for q in by_size_then_age:
        if used <= ctx.target_tokens:
            break
        if q.status is Status.ACTING and not q.marked:
            pause.append(q.session_id)
            used -= ctx.weight_tokens(q) + ctx.buffer_tokens
    for q in programs:
        if q.status is not Status.ACTING and q.marked:
            used -= ctx.weight_tokens(q) + ctx.buffer_tokens
            count -= 1
    mark = []
    for q in by_size_then_age:
        if used <= ctx.target_tokens and (ctx.count_target is None or count <= ctx.count_target):
            break
        if q.status is not Status.ACTING and not q.marked:
            mark.append(q.session_id)
            used -= ctx.weight_tokens(q) + ctx.buffer_tokens
            count -= 1
    return PausePlan(pause=tuple(pause), mark=tuple(mark))


def formula_aging(control: ControlLaw, now: float) -> Plan:
    """`ControlLaw.plan_aging` as its docstring reads, weighing every movable program by the formula:
    the aged held admissions oldest first, each onto the replica whose unmarked ACTING programs
    outside the tail free the most, pausing those shortest first until it fits."""
    ledger, p = control.ledger, control.params
    buffer = p.buffer_per_program_tokens
    aged = []
    for sid, request_ids in ledger.waiting.items():
        program = ledger.programs[sid]
        started = min(ledger.turns[rid].started_at for rid in request_ids)
        if program.lifecycle is Lifecycle.PAUSED and now - started >= p.resume_aging_seconds:
            aged.append((started, program.seq, program))
    aged.sort(key=lambda item: item[:2])
    targets: set[ReplicaKey] = set()
    steps: list[Step] = []
    for _, _, program in aged:
        rooms = []
        for key, cap in ledger.caps.items():
            if key in targets:
                continue
            movable = [
                q
                for sid in ledger.resident[key]
                if (q := ledger.programs[sid]).status is Status.ACTING and not q.marked and not ledger.is_tail(q)
            ]
            free = sum(ledger.weight(q, key) + buffer for q in movable)
            rooms.append((cap.retention_tokens * p.pause_threshold - (ledger.used[key] - free), key, movable))
        if not rooms:
            break
        room, target, movable = max(rooms, key=lambda r: r[0])  # the first of the largest
        need = ledger.weight(program, target) + buffer
        if need >= room:
            target = max(
                (k for k in ledger.caps if k not in targets),
                key=lambda k: ledger.caps[k].retention_tokens - ledger.used[k],
            )
            movable = []
        used = ledger.used[target]
        for victim in sorted(movable, key=lambda q: (q.token_total, q.seq)):
            if used + need < ledger.caps[target].retention_tokens * p.pause_threshold:
                break
            steps.append(Pause(victim.session_id, "aging"))
            used -= ledger.weight(victim, target) + buffer
        targets.add(target)
        steps.append(Resume(program.session_id, target, protect_until=now + p.resume_aging_seconds / 2))
    return Plan(tuple(steps))


@pytest.mark.pure_core
@pytest.mark.parametrize(
    ("policy", "params", "tail", "step_s", "seed"),
    [
        ("threshold", None, 0.0, 1.0, 21),
        ("threshold", None, 0.75, 0.1, 22),
        ("cost_aware", CostAwarePauseParams(), 0.0, 1.0, 23),
        # Tools of a few seconds, estimates that follow the last few of them: the binary rule's
        # thresholds swing through the programs' sizes, so many ACTING programs weigh 0.
        ("cost_aware", CostAwarePauseParams(half_life_observations=4.0, prior_observations=1.0), 0.0, 0.01, 24),
        ("cost_aware", CostAwarePauseParams(min_hold_fraction=0.3, stall_share=0.0), 0.75, 0.1, 25),
    ],
)
def test_pause_plan_decides_what_the_formula_does(
    policy: str, params: CostAwarePauseParams | None, tail: float, step_s: float, seed: int
):
    rng = random.Random(seed)
    control: ControlParams = service_control_params(
        policy, scheduler_interval_seconds=5.0, tail_protection_quantile=tail, resume_aging_seconds=30.0
    )
    cores = [SchedulerCore(control, make_pause_policy(policy, params)) for _ in "ab"]
    formula, product = cores
    shuffle = random.Random(seed + 1000)
    weightless = [0]  # ACTING programs of weight 0 the formula's plans dropped

    def counts(ctx: PauseContext) -> Callable[[Program], bool]:
        def counted(q: Program) -> bool:
            if policy == "threshold" or q.status is not Status.ACTING:
                return True
            if ctx.weight_tokens(q) > 0:
                return True
            weightless[0] += 1
            return False

        return counted

    formula.policy.plan = lambda ctx: formula_plan(ctx, counts(ctx), shuffle)  # type: ignore[method-assign]
    plan_aging = formula.control.plan_aging
    aging = [0]  # aging resumes planned

    def aging_as_the_formula(now: float) -> Plan:
        plan, planned = formula_aging(formula.control, now), plan_aging(now)
        # The product's plan also carries one log record per resume: compare its transitions.
        assert tuple(s for s in planned.steps if not isinstance(s, LogRecord)) == plan.steps
        aging[0] += sum(isinstance(s, Resume) for s in plan.steps)
        return planned

    formula.control.plan_aging = aging_as_the_formula  # type: ignore[method-assign]

    def both(call, *args, **kwargs):
        out_a = getattr(formula, call)(*args, **kwargs)
        out_b = getattr(product, call)(*args, **kwargs)
        assert out_a == out_b, call
        return out_b

    programs = 200
    sizes = [min(80_000, int(rng.lognormvariate(8.5, 1.0))) for _ in range(programs)]
    total = sum(s + control.buffer_per_program_tokens for s in sizes)
    budgets = [total // 20 * (1 + i % 3) // 2 for i in range(8)]
    both("apply_capacity", 0.0, fleet(budgets, 12))
    keys = [ReplicaKey(f"w{i // 4}", i % 4) for i in range(8)]
    now, counter = 0.0, 0
    in_flight: dict[str, str] = {}
    for _ in range(1_500):
        now += step_s * rng.choice([0.0, 0.5, 1.0, 2.0, 2.0, 20.0])
        sid = rng.randrange(programs)
        name = f"p{sid}"
        op = rng.random()
        if op < 0.5:
            if name in in_flight:
                sizes[sid] += rng.randrange(0, 3_000)
                outcome = rng.choice([TurnOutcome.OK, TurnOutcome.OK, TurnOutcome.CANCELLED])
                ttft = rng.choice([None, rng.uniform(0.05, 3.0)])
                both(
                    "complete",
                    now,
                    name,
                    in_flight.pop(name),
                    rng.choice(keys + [None]),
                    sizes[sid],
                    200,
                    sizes[sid] // 2,
                    outcome,
                    ttft,
                )
            else:
                counter += 1
                rid = f"r{counter}"
                result = both("admit", now, name, "", sizes[sid] // 4 if rng.random() < 0.5 else 0, rid)
                in_flight[name] = rid
                if result.decision.verdict is Verdict.PLACED:
                    both("renew_leases", now, (), (rid,))
        elif op < 0.54 and name in in_flight:
            both("cancel_admission", now, in_flight.pop(name))
        elif op < 0.56:
            both("release", now, name)
            in_flight.pop(name, None)
        elif op < 0.58 and name in in_flight:
            both("bind_request", in_flight[name], rng.choice(keys))
        elif op < 0.6:
            counter += 1
            rid = f"pt{counter}"
            both("admit", now, "", "", rng.randrange(10, 5_000), rid)
            both("bind_request", rid, rng.choice(keys))
        elif op < 0.62:
            both("expire_leases", now)
            in_flight = {s: r for s, r in in_flight.items() if r in product.ledger.turns}
        elif op > 0.85:
            both("tick", now)  # TickResult: events, logs, resolutions, replica stats, counts
            in_flight = {s: r for s, r in in_flight.items() if r in product.ledger.turns}
        assert_same_ledger(formula.ledger, product.ledger, now)
        assert_same_stats(formula.stats(now), product.stats(now))
    assert product.pauses_total > 10 and product.marks_total > 0  # the sequence exercised the plan
    assert aging[0] > 0  # and aging resumes
    if policy == "cost_aware" and seed == 24:
        assert weightless[0] > 0  # and ACTING programs of weight 0 were passed over
