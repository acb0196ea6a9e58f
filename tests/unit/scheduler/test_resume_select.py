"""The resume selection reads only the prefix of the resume order that can still select something
(`ControlLaw._select`): it skips the rest of a group once what the budget has left is below the
group's next key plus the buffer, passes over the REASONING groups once the request slots are
taken, and does not key the REASONING programs at all when no slot is free. On random paused
queues it selects exactly what the knapsack over the whole queue, sorted by the resume key, does."""

from __future__ import annotations

import random

import pytest

from services.scheduler.core import ControlParams, Status
from services.scheduler.core.accounting import Ledger
from services.scheduler.core.control import ControlLaw
from services.scheduler.core.model import Lifecycle
from services.scheduler.core.policies import make_pause_policy
from tests.unit.scheduler.helpers import full_order_knapsack


def paused_queue(rng: random.Random, discount: float, tail: int | None) -> tuple[ControlLaw, float]:
    params = ControlParams(resume_wait_discount_seconds=discount)
    ledger = Ledger(params)
    law = ControlLaw(params, make_pause_policy("threshold"), ledger)
    now = 1_000.0
    size_pool = [rng.randrange(1, 20_000) for _ in range(rng.randrange(1, 40))]  # repeated sizes: ties
    for i in range(rng.randrange(1, 300)):
        q = ledger.create(0.0, f"p{i}", "")
        q.lifecycle = Lifecycle.PAUSED
        q.status = rng.choice([Status.REASONING, Status.ACTING])
        q.turns = rng.randrange(0, 6)
        q.token_total = rng.choice(size_pool) if rng.random() < 0.5 else rng.randrange(0, 30_000)
        # Paused at various times, some "in the future" (a clock step back) and some never stamped.
        q.paused_since = None if rng.random() < 0.05 else now - rng.choice([0.0, 1.0, 30.0, rng.uniform(-5, 600)])
        ledger.enqueue_paused(q.session_id)
    if rng.random() < 0.3:  # the queue is not in pause order: a program re-paused keeps no place
        for sid in rng.sample(list(ledger.paused), k=min(5, len(ledger.paused))):
            ledger.paused[sid] = rng.randrange(0, 1_000)
    ledger.tail_turns = tail
    return law, now


@pytest.mark.parametrize("seed", range(40))
def test_the_selection_equals_the_knapsack_over_the_whole_sorted_queue(seed: int):
    rng = random.Random(seed)
    law, now = paused_queue(rng, discount=rng.choice([0.0, 30.0, 600.0]), tail=rng.choice([None, 2, 4]))
    total = sum(q.token_total + law.params.buffer_per_program_tokens for q in law.ledger.programs.values())
    reasoning = sum(1 for q in law.ledger.programs.values() if q.status is Status.REASONING)
    for _ in range(25):
        budget = rng.choice([0, rng.randrange(0, total + 1), total, total * 2, rng.randrange(0, 50_000)])
        total_slots = rng.choice([None, 0, 1, rng.randrange(0, reasoning + 2), reasoning, reasoning + 5])
        expected = full_order_knapsack(law, now, budget, total_slots)
        assert law._select(now, budget, total_slots) == expected
