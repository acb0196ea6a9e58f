"""Soft pinning: below pressure the router picks and the scheduler follows (ours, not the reference's)."""

from services.scheduler.core import ReplicaKey, Verdict
from tests.unit.scheduler.helpers import make_core, place_acting, rid

A, B = ReplicaKey("a", 0), ReplicaKey("b", 0)


def test_below_pressure_admission_answers_any_and_bind_moves_the_program():
    core = make_core({("a", 0): 10_000, ("b", 0): 10_000}, soft_pinning=True)
    request_id = rid()
    decision = core.admit(0.0, "p", "", 1_000, request_id).decision
    assert decision.verdict is Verdict.PLACED and decision.replica is None   # "any"
    placed = core.program("p").replica
    other = B if placed == A else A
    assert core.bind_request(request_id, other)
    assert core.program("p").replica == other
    stats = {s.replica: s for s in core.replica_stats(0.0)}
    assert stats[other].used_tokens > 0 and stats[placed].used_tokens == 0
    core.check_invariants(0.0)


def test_under_pressure_admission_pins_and_bind_cannot_move():
    core = make_core({("a", 0): 10_000, ("b", 0): 10_000}, soft_pinning=True)
    place_acting(core, "heavy", 8_500, ("a", 0))           # replica a is in the soft-demote band
    request_id = rid()
    decision = core.admit(0.0, "p", "", 500, request_id).decision
    assert decision.replica is not None
    assert not core.bind_request(request_id, A if decision.replica == B else B)
    assert core.program("p").replica == decision.replica


def test_the_reference_always_pins():
    core = make_core({("a", 0): 10_000, ("b", 0): 10_000})
    decision = core.admit(0.0, "p", "", 1_000, rid()).decision
    assert decision.replica is not None
