"""Soft pinning: below pressure the router picks and the scheduler follows (ours, not the reference's)."""

from services.scheduler.core import ReplicaKey, Verdict
from services.scheduler.core.control import Pause, Plan
from tests.unit.scheduler.helpers import make_core, place_acting, rid, turn

A, B = ReplicaKey("a", 0), ReplicaKey("b", 0)


def test_below_pressure_admission_answers_any_and_bind_moves_the_program():
    core = make_core({("a", 0): 10_000, ("b", 0): 10_000}, soft_pinning=True)
    request_id = rid()
    decision = core.admit(0.0, "p", "", 1_000, request_id).decision
    assert decision.verdict is Verdict.PLACED and decision.replica is None  # "any"
    placed = core.program("p").replica
    other = B if placed == A else A
    assert core.bind_request(request_id, other)
    assert core.program("p").replica == other
    stats = {s.replica: s for s in core.replica_stats(0.0)}
    assert stats[other].used_tokens > 0 and stats[placed].used_tokens == 0
    core.ledger.check_invariants(0.0)


def test_under_pressure_admission_pins_and_bind_cannot_move():
    core = make_core({("a", 0): 10_000, ("b", 0): 10_000}, soft_pinning=True)
    place_acting(core, "heavy", 8_500, ("a", 0))  # replica a is in the soft-demote band
    request_id = rid()
    decision = core.admit(0.0, "p", "", 500, request_id).decision
    assert decision.replica is not None
    assert not core.bind_request(request_id, A if decision.replica == B else B)
    assert core.program("p").replica == decision.replica


def test_the_reference_always_pins():
    core = make_core({("a", 0): 10_000, ("b", 0): 10_000})
    decision = core.admit(0.0, "p", "", 1_000, rid()).decision
    assert decision.replica is not None


def _cost_aware_core(**params):
    from services.scheduler.core import ControlParams, SchedulerCore
    from services.scheduler.core.policies import CostAwarePauseParams, make_pause_policy
    from tests.unit.scheduler.helpers import snapshot

    # Tools of 100 s: recomputing anything below ~1.3M tokens is cheaper than holding it, so every
    # context weighs 0 (the policy lets it go).
    policy = make_pause_policy("cost_aware", CostAwarePauseParams(tool_seconds=100.0, prior_observations=1e9))
    core = SchedulerCore(ControlParams(soft_pinning=True, **params), policy)
    core.apply_capacity(0.0, snapshot({("a", 0): 10_000, ("b", 0): 10_000}))
    return core


def test_a_context_the_policy_lets_go_is_routed_like_kv_routing_under_pressure():
    core = _cost_aware_core()
    place_acting(core, "heavy", 9_700, ("a", 0))  # raw tokens put a in the soft-demote band, but they weigh 0
    core.ledger.programs["heavy"].soft_demoted_until = 0.0
    # Pressure by count: a resident program that counts (REASONING, weight > 0) would pin; ours weighs 0.
    request_id = rid()
    core.admit(0.0, "p", "", 500, request_id)
    core.complete(0.0, "p", request_id, core.program("p").replica or A, 500, 0)
    # Make a replica look pressured for the pin rule: fill b's accounting with a counted passthrough.
    core.admit(0.0, "", "", 9_800, "pt")
    core.bind_request("pt", B)
    again = rid()
    decision = core.admit(1.0, "p", "", 600, again).decision
    assert decision.verdict is Verdict.PLACED and decision.replica is None  # let go: the router picks
    core.ledger.check_invariants(1.0)


def test_once_programs_are_held_a_let_go_context_is_pinned_again():
    core = _cost_aware_core()
    core.admit(0.0, "", "", 9_800, "pt")
    core.bind_request("pt", B)
    request_id = rid()
    core.admit(0.0, "p", "", 500, request_id)
    core.complete(0.0, "p", request_id, core.program("p").replica or A, 500, 0)
    turn(core, "ghost", 100)
    core.apply(0.0, Plan((Pause("ghost", "test"),)))  # something is held: placement stays authoritative
    decision = core.admit(1.0, "p", "", 600, rid()).decision
    assert decision.replica is not None
