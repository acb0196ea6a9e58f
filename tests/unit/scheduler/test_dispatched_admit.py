"""Issue 20 item 4: a dispatched Admit (the router started the turn on its admission fast path before
asking) is never held. A program paused meanwhile (the pause crossed the turn) is admitted anyway, resumed
where the turn runs and counted; its control law sees it REASONING there."""

from __future__ import annotations

from services.scheduler.core import ControlParams, Lifecycle, ReplicaKey, SchedulerCore, Status, Verdict
from tests.unit.scheduler.helpers import rid, snapshot

W1 = ReplicaKey("w1", 0)
W2 = ReplicaKey("w2", 0)
PRESSURE = dict(pause_threshold=0.95, pause_target=0.8, soft_demote_threshold=0.8, resume_hysteresis=0.1)


def _core(caps: dict, **params) -> SchedulerCore:
    core = SchedulerCore(ControlParams(**params), ticket_lease_seconds=30.0)
    core.apply_capacity(0.0, snapshot({(k.worker_id, k.dp_rank): v for k, v in caps.items()}))
    return core


def _done_turn(core: SchedulerCore, sid: str, tokens: int, replica: ReplicaKey, now: float = 0.0) -> None:
    request_id = rid()
    core.admit(now, sid, "", tokens, request_id)
    core.complete(now, sid, request_id, replica, tokens, 0)


def _paused(core: SchedulerCore) -> str:
    """A program p of 5,000 tokens on W1, then paused by pressure at its tool boundary."""
    _done_turn(core, "p", 5_000, W1)
    _done_turn(core, "big", 4_900, W1)
    core.tick(1.0)
    assert core.program("p").lifecycle is Lifecycle.PAUSED or core.program("big").lifecycle is Lifecycle.PAUSED
    return "p" if core.program("p").lifecycle is Lifecycle.PAUSED else "big"


def test_a_paused_program_is_held_but_its_dispatched_admit_is_placed_resumed_and_counted():
    core = _core({W1: 10_000}, **PRESSURE)
    sid = _paused(core)
    turns = core.program(sid).turns
    held = core.admit(2.0, sid, "", 100, "held")
    assert held.decision.verdict is Verdict.WAIT  # the normal path holds it
    core.cancel_admission(2.0, "held")
    assert core.program(sid).lifecycle is Lifecycle.PAUSED and core.program(sid).turns == turns

    result = core.admit(3.0, sid, "", 100, "fast", dispatched=True, dispatched_replica=W1)
    assert result.decision.verdict is Verdict.PLACED and result.decision.was_paused
    view = core.program(sid)
    assert view.lifecycle is Lifecycle.ACTIVE and view.status is Status.REASONING and view.replica == W1
    assert view.turns == turns + 1
    assert core.stats(3.0).dispatched_while_paused_total == 1
    core.ledger.check_invariants(3.0)
    core.complete(4.0, sid, "fast", W1, 5_100, 10)
    assert core.program(sid).turns == turns + 1 and core.program(sid).status is Status.ACTING
    core.ledger.check_invariants(4.0)


def test_a_dispatched_admit_places_the_program_where_the_turn_runs():
    core = _core({W1: 100_000, W2: 100_000})
    _done_turn(core, "p", 2_000, W1)
    assert core.program("p").replica == W1
    result = core.admit(1.0, "p", "", 2_100, "r2", dispatched=True, dispatched_replica=W2)
    assert result.decision.verdict is Verdict.PLACED and core.program("p").replica == W2
    assert core.stats(1.0).dispatched_while_paused_total == 0
    core.ledger.check_invariants(1.0)


def test_a_dispatched_admit_of_a_program_unknown_to_the_scheduler_is_never_held():
    """Released meanwhile (its event crossed the turn), and nothing fits: a new program would queue, but
    this turn runs already."""
    core = _core({W1: 1_000}, **PRESSURE)
    _done_turn(core, "big", 990, W1)
    assert core.admit(1.0, "new", "", 500, "n1").decision.verdict is Verdict.WAIT
    result = core.admit(1.0, "gone", "", 500, "g1", dispatched=True, dispatched_replica=W1)
    assert result.decision.verdict is Verdict.PLACED and core.program("gone").replica == W1
    core.ledger.check_invariants(1.0)


def test_a_rolled_back_dispatched_admit_restores_the_pause():
    core = _core({W1: 10_000}, **PRESSURE)
    sid = _paused(core)
    before = core.program(sid)
    core.admit(3.0, sid, "", 100, "fast", dispatched=True, dispatched_replica=W1)
    core.cancel_admission(3.5, "fast")
    after = core.program(sid)
    assert after.lifecycle is Lifecycle.PAUSED and after.turns == before.turns
    core.ledger.check_invariants(3.5)
