"""The tick's shortcuts against the plans they stand for.

- Soft demote: the tick demotes each band replica's residents in one pass (`SchedulerCore._soft_demote`)
  instead of applying `ControlLaw.plan_soft_demote`: the same events, in the same order, and the same
  windows on every program.
- Resume selection: when the budget takes everything the request slots let through, the resume plan
  keys only the programs whose order matters (`ControlLaw._select_unbounded`): it equals the
  knapsack's selection (`_select`) sorted by size, descending, stably.
- Aging: nothing is scanned while the oldest held admission is younger than the aging age; the plan
  equals the one of a scan of every held admission.
"""

from __future__ import annotations

import copy
import random

import pytest

from services.scheduler.core import (
    CapacitySnapshot,
    ControlParams,
    ReplicaCapacity,
    SchedulerCore,
    Status,
    Verdict,
)
from services.scheduler.core.accounting import Ledger
from services.scheduler.core.control import ControlLaw
from services.scheduler.core.model import Acc, Lifecycle
from services.scheduler.core.policies import make_pause_policy


def busy_core(seed: int, policy: str, *, aging: float = 0.0) -> tuple[SchedulerCore, random.Random]:
    """The tick benchmark's mix at a small size: most programs at a tool call, the fleet near full."""
    rng = random.Random(seed)
    params = ControlParams(
        scheduler_interval_seconds=5.0,
        acting_decay_tau_seconds=rng.choice([1.0, 30.0]),
        resume_wait_discount_seconds=rng.choice([0.0, 60.0]),
        tail_protection_quantile=rng.choice([0.0, 0.75]),
        resume_aging_seconds=aging,
    )
    core = SchedulerCore(params, make_pause_policy(policy))
    programs = 400
    sizes = [min(40_000, int(rng.lognormvariate(8.0, 0.9))) // 50 * 50 for _ in range(programs)]  # many ties
    budget = sum(s + params.buffer_per_program_tokens for s in sizes) // 6
    slots = rng.choice([0, 12])
    core.apply_capacity(0.0, CapacitySnapshot(1, tuple(ReplicaCapacity("w", i, budget, slots) for i in range(6))))
    return core, rng


def drive(core: SchedulerCore, rng: random.Random, ticks: int, check) -> None:
    """Turns between ticks, as the benchmark runs them; `check(core, now)` before each tick."""
    programs = 400
    sizes = {}
    in_flight: dict[str, str] = {}
    now, counter = 0.0, 0
    for i in range(programs):
        counter += 1
        size = min(40_000, int(rng.lognormvariate(8.0, 0.9))) // 50 * 50
        sizes[i] = size
        result = core.admit(now, f"p{i}", "", size // 4, f"r{counter}")
        if result.decision.verdict is Verdict.PLACED and rng.random() < 0.9:
            core.complete(now, f"p{i}", f"r{counter}", result.decision.replica, size, size // 20)
        else:
            in_flight[f"p{i}"] = f"r{counter}"
    for _ in range(ticks):
        now += 5.0
        for i in rng.sample(range(programs), programs // 10):
            name = f"p{i}"
            if name in in_flight:
                core.complete(now, name, in_flight.pop(name), None, sizes[i], sizes[i] // 20)
            elif core.program(name) is not None:
                counter += 1
                core.admit(now, name, "", 0, f"r{counter}")
                in_flight[name] = f"r{counter}"
        check(core, now)
        core.tick(now)
        core.ledger.check_invariants(now)


@pytest.mark.pure_core
@pytest.mark.parametrize(("policy", "seed"), [("cost_aware", 1), ("threshold", 2), ("cost_aware", 3), ("threshold", 4)])
def test_the_one_pass_soft_demote_equals_its_plan_applied(policy: str, seed: int):
    core, rng = busy_core(seed, policy)
    announced = [0]

    def check(core: SchedulerCore, now: float) -> None:
        planned = copy.deepcopy(core)
        expected = planned.apply(now, planned.control.plan_soft_demote(now))
        acc = Acc()
        core._soft_demote(now, acc)
        assert acc.events == list(expected.events)
        assert not acc.logs and not acc.resolutions and not expected.logs and not expected.resolutions
        assert {sid: q.soft_demoted_until for sid, q in core.ledger.programs.items()} == {
            sid: q.soft_demoted_until for sid, q in planned.ledger.programs.items()
        }
        announced[0] += len(acc.events)

    drive(core, rng, 12, check)
    assert announced[0] > 50  # replicas were in the band, and programs entered it


def paused_queue(rng: random.Random) -> tuple[ControlLaw, float]:
    params = ControlParams(resume_wait_discount_seconds=rng.choice([0.0, 30.0, 600.0]))
    ledger = Ledger(params)
    law = ControlLaw(params, make_pause_policy("threshold"), ledger)
    now = 1_000.0
    sizes = [rng.randrange(1, 20_000) for _ in range(rng.randrange(1, 30))]  # few sizes: many ties
    for i in range(rng.randrange(1, 300)):
        q = ledger.create(0.0, f"p{i}", "")
        q.lifecycle = Lifecycle.PAUSED
        q.status = rng.choice([Status.REASONING, Status.ACTING])
        q.turns = rng.randrange(0, 6)
        q.token_total = rng.choice(sizes)
        # Paused at various times, some "in the future" (a clock step back), some never stamped, some at once.
        q.paused_since = None if rng.random() < 0.05 else now - rng.choice([0.0, 30.0, rng.uniform(-5, 600)])
        ledger.enqueue_paused(q.session_id)
    if rng.random() < 0.3:  # the queue is not in pause order (a rolled-back admission), with equal pause seqs
        for sid in rng.sample(list(ledger.paused), k=min(5, len(ledger.paused))):
            ledger.paused[sid] = rng.randrange(0, 50)
    ledger.tail_turns = rng.choice([None, 2, 4])
    return law, now


@pytest.mark.parametrize("seed", range(40))
def test_the_unbounded_selection_equals_the_knapsack_sorted_by_size(seed: int):
    rng = random.Random(seed)
    law, now = paused_queue(rng)
    queue = list(law.ledger.programs.values())
    total = sum(q.token_total + law.params.buffer_per_program_tokens for q in queue)
    reasoning = sum(1 for q in queue if q.status is Status.REASONING)
    unbounded = 0
    for _ in range(25):
        budget = rng.choice([total, total * 2, rng.randrange(0, total + 1), rng.randrange(total // 2, total + 1)])
        total_slots = rng.choice([None, 0, 1, rng.randrange(0, reasoning + 2), reasoning, reasoning + 5])
        expected = law._select(now, budget, total_slots)
        expected.sort(key=lambda q: q.token_total, reverse=True)
        got = law._select_unbounded(now, budget, total_slots)
        if got is not None:
            unbounded += 1
            assert [q.session_id for q in got] == [q.session_id for q in expected]
        if budget >= total:
            assert got is not None  # everything fits: no knapsack to run
    assert unbounded >= 2


@pytest.mark.parametrize("seed", range(4))
def test_aging_plans_equal_a_scan_of_every_held_admission(seed: int):
    core, rng = busy_core(seed, "cost_aware", aging=12.0)
    aged = [0]

    def check(core: SchedulerCore, now: float) -> None:
        law = core.control
        scanned = any(
            now - min(core.ledger.turns[rid].started_at for rid in rids) >= law.params.resume_aging_seconds
            for sid, rids in core.ledger.waiting.items()
            if core.ledger.programs[sid].lifecycle is Lifecycle.PAUSED
        )
        plan = law.plan_aging(now)
        assert bool(plan.steps) == scanned
        aged[0] += bool(plan.steps)

    drive(core, rng, 10, check)
    assert aged[0] > 0
