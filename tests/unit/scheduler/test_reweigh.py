"""Re-weighing the placed programs when the policy's estimates move equals re-charging them all.

After a refresh of the cost-aware policy's estimates the tick used to re-charge every placed
program (`Ledger.recharge`); it now re-weighs them (`Ledger.reweigh`: only each charge's amount and
`used`), and only when the refresh says a weight may
have changed (under the binary rule: a budget's threshold moved); and the pause plan reads a
resident's weight from its charge instead of asking the policy. Random event sequences run through
two cores side by side, one re-charging everything on every tick and weighing by the formula, one
as the product runs, and every answer, every tick and every ledger field must agree.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from services.scheduler.core import (
    CapacitySnapshot,
    ReplicaCapacity,
    ReplicaKey,
    SchedulerCore,
    TurnOutcome,
    Verdict,
)
from services.scheduler.core.accounting import Ledger
from services.scheduler.core.defaults import service_control_params
from services.scheduler.core.model import Stats
from services.scheduler.core.policies import CostAwarePauseParams, make_pause_policy


def full_recharge(ledger: Ledger) -> None:
    """What the tick did after a refresh before `reweigh`: re-charge every placed program."""
    for program in list(ledger.programs.values()):
        if program.session_id in ledger.charge:
            ledger.recharge(program, touched=False)


def fleet(budgets: list[int], slots: int) -> CapacitySnapshot:
    return CapacitySnapshot(
        1, tuple(ReplicaCapacity(f"w{i // 4}", i % 4, budget, slots) for i, budget in enumerate(budgets))
    )


def assert_same_ledger(a: Ledger, b: Ledger, now: float) -> None:
    assert a.programs == b.programs
    assert list(a.programs) == list(b.programs)
    assert a.paused == b.paused
    assert a.charge == b.charge
    assert a.used == b.used
    assert a.inflight == b.inflight
    assert a.decay_base == b.decay_base
    assert a.resident == b.resident  # as sets per replica: the order is that of the last re-account
    assert a.pt_charge == b.pt_charge and a.pt_count == b.pt_count
    for key in a.caps:
        assert {s: m[:2] for s, m in a.acting_members[key].items()} == {
            s: m[:2] for s, m in b.acting_members[key].items()
        }
        # The running decayed sums differ only by floating-point rounding (re-charging removes and
        # re-adds every term; re-weighing leaves them alone).
        assert abs(a.decayed_used_one(now, key) - b.decayed_used_one(now, key)) <= 1
    assert a.idle_since == b.idle_since
    assert sorted(a.idle_heap) == sorted(b.idle_heap)
    assert a.turns == b.turns and a.waiting == b.waiting and a.passthrough == b.passthrough
    assert sorted(a.wait_heap) == sorted(b.wait_heap)
    assert a.tail_turns == b.tail_turns and list(a.released_turns) == list(b.released_turns)
    assert a.dirty_programs == b.dirty_programs and a.unsettled == b.unsettled


def assert_same_stats(a: Stats, b: Stats) -> None:
    assert dataclasses.replace(a, replicas=()) == dataclasses.replace(b, replicas=())
    assert len(a.replicas) == len(b.replicas)
    for ra, rb in zip(a.replicas, b.replicas):
        assert abs(ra.used_decayed_tokens - rb.used_decayed_tokens) <= 1  # the decayed sums' rounding
        assert dataclasses.replace(ra, used_decayed_tokens=0) == dataclasses.replace(rb, used_decayed_tokens=0)


@pytest.mark.pure_core
@pytest.mark.parametrize(
    ("params", "mixed", "slots", "tail", "step_s", "seed"),
    [
        (CostAwarePauseParams(), True, 12, 0.75, 1.0, 11),
        # Tools of a few seconds, estimates that follow the last few of them: the binary rule's
        # thresholds swing through the programs' sizes.
        (CostAwarePauseParams(half_life_observations=4.0, prior_observations=1.0), False, 8, 0.0, 0.01, 12),
        (CostAwarePauseParams(), True, 12, 0.0, 0.02, 15),
        # Smooth weights (phi below 1 counts partly) and REASONING programs at their raw weight.
        (CostAwarePauseParams(min_hold_fraction=0.0, scale_reasoning=False), True, 12, 0.0, 1.0, 13),
        (CostAwarePauseParams(min_hold_fraction=0.3, stall_share=0.0), True, 16, 0.75, 0.1, 14),
    ],
)
def test_reweigh_decides_exactly_what_a_full_recharge_does(
    params: CostAwarePauseParams, mixed: bool, slots: int, tail: float, step_s: float, seed: int
):
    rng = random.Random(seed)
    # The service's control law (tail protection off in some: most programs of a short random
    # sequence outlive the released ones and would be protected from pauses).
    control = service_control_params("cost_aware", scheduler_interval_seconds=5.0, tail_protection_quantile=tail)
    cores = [SchedulerCore(control, make_pause_policy("cost_aware", params), ticket_lease_seconds=20.0) for _ in "ab"]
    recharged, reweighed = cores
    recharged.ledger.reweigh = lambda: full_recharge(recharged.ledger)  # type: ignore[method-assign]
    refresh = recharged._refresh_policy
    assert refresh is not None
    # The oracle re-charges every placed program on every tick, whatever the policy's refresh says
    # (the other core re-weighs only when it says the weights may have changed).
    recharged._refresh_policy = lambda: refresh() or True
    # And its pause policy weighs each program by the formula, not by reading the program's charge.
    plan = recharged.policy.plan
    formula = recharged.ledger.weight
    recharged.policy.plan = lambda ctx: plan(  # type: ignore[method-assign]
        dataclasses.replace(ctx, weight_tokens=functools.partial(formula, key=ctx.replica))
    )
    for core in cores:
        core.ledger.track_changes()
    reweighs = [0, 0]  # re-weighs run, and those that changed a charge
    reweigh = reweighed.ledger.reweigh

    def counted() -> None:
        amounts = dict(reweighed.ledger.used)
        reweigh()
        reweighs[0] += 1
        reweighs[1] += amounts != reweighed.ledger.used

    reweighed.ledger.reweigh = counted  # type: ignore[method-assign]

    def both(call, *args, **kwargs):  # the same call on both cores: the same answer
        out_a = getattr(recharged, call)(*args, **kwargs)
        out_b = getattr(reweighed, call)(*args, **kwargs)
        assert out_a == out_b, call
        return out_b

    programs = 200
    sizes = [min(80_000, int(rng.lognormvariate(8.5, 1.0))) for _ in range(programs)]
    total = sum(s + control.buffer_per_program_tokens for s in sizes)
    budgets = [total // 20 * ((1 + i % 3) if mixed else 2) // 2 for i in range(8)]
    both("apply_capacity", 0.0, fleet(budgets, slots))
    keys = [ReplicaKey(f"w{i // 4}", i % 4) for i in range(8)]
    now, counter, ticks, moved = 0.0, 0, 0, 0
    in_flight: dict[str, str] = {}
    for _ in range(1_500):
        # Tool calls from instant to minutes: the estimated mean tool time, and so the weights, move.
        now += step_s * rng.choice([0.0, 0.5, 1.0, 2.0, 2.0, 20.0])
        sid = rng.randrange(programs)
        name = f"p{sid}"
        op = rng.random()
        if op < 0.5:
            if name in in_flight:
                sizes[sid] += rng.randrange(0, 3_000)
                outcome = rng.choice([TurnOutcome.OK, TurnOutcome.OK, TurnOutcome.CANCELLED])
                replica = rng.choice(keys + [None])
                ttft = rng.choice([None, rng.uniform(0.05, 3.0)])
                both(
                    "complete", now, name, in_flight.pop(name), replica, sizes[sid], 200, sizes[sid] // 2, outcome, ttft
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
            in_flight = {s: r for s, r in in_flight.items() if r in reweighed.ledger.turns}
        elif op < 0.63:
            # A replica's budget changes: the policy's weight of its residents depends on it.
            changed = rng.randrange(8)
            budgets = [int(b * rng.choice([0.5, 1.5])) if i == changed else b for i, b in enumerate(budgets)]
            both("apply_capacity", now, fleet(budgets, slots))
        elif op > 0.85:
            before = reweighed.policy.tool_seconds, reweighed.policy.prefill_tokens_per_s  # type: ignore[attr-defined]
            both("tick", now)
            ticks += 1
            moved += before != (reweighed.policy.tool_seconds, reweighed.policy.prefill_tokens_per_s)  # type: ignore[attr-defined]
            in_flight = {s: r for s, r in in_flight.items() if r in reweighed.ledger.turns}
        assert_same_ledger(recharged.ledger, reweighed.ledger, now)
        reweighed.ledger.check_invariants(now)
        assert_same_stats(recharged.stats(now), reweighed.stats(now))
    assert ticks > 100 and moved > 50  # the estimates moved on most ticks
    assert reweighs[1] > 0  # and some moved weights: the re-weigh changed charges
    assert reweighed.pauses_total > 10 and reweighed.resumes_total > 10  # the sequence exercised the law
