"""Ticket leases: an admitted turn whose router stops renewing it ends as if Complete(CANCELLED) arrived;
one whose delivery no router reported (RenewLeases.delivered_request_ids) is rolled back as an admission
its client never received, even if it was renewed and bound (issue 21: a router killed between Bind and
its 200)."""

from __future__ import annotations

import pytest

from services.scheduler.core import (
    ControlParams,
    Lifecycle,
    ReplicaKey,
    SchedulerCore,
    Status,
    TurnOutcome,
    Verdict,
)
from tests.unit.scheduler.helpers import rid, snapshot

W = ("w", 0)
LEASE_S = 30.0


def core_with(lease_s: float = LEASE_S, caps: dict | None = None, **params) -> SchedulerCore:
    core = SchedulerCore(ControlParams(**params), ticket_lease_seconds=lease_s)
    core.apply_capacity(0.0, snapshot(caps or {W: 100_000}))
    return core


def acting(core: SchedulerCore, sid: str, tokens: int, now: float = 0.0) -> None:
    request_id = rid()
    core.admit(now, sid, "", tokens, request_id)
    core.complete(now, sid, request_id, ReplicaKey(*W), tokens, 0)


def test_the_issue_a_turn_whose_router_died_stays_reasoning_without_leases():
    """The reference behaviour (lease 0): 141 s later, past a 90 s idle TTL, still REASONING, counted."""
    core = core_with(0.0, program_idle_ttl_seconds=90.0)
    acting(core, "p", 2_000)
    core.admit(1.0, "p", "", 3_000, "r2")  # its router is SIGKILLed mid-turn: no Complete ever comes
    core.expire_leases(142.0)
    core.tick(142.0)
    view = core.program("p")
    assert view.status is Status.REASONING and view.token_total == 3_000


def test_a_lapsed_lease_ends_the_turn_and_idle_expiry_follows():
    core = core_with(program_idle_ttl_seconds=90.0)
    acting(core, "p", 2_000)
    core.admit(1.0, "p", "", 3_000, "r2")
    core.renew_leases(1.0, [], ["r2"])  # its client had its first bytes, then its router died
    assert core.expire_leases(30.9).logs == ()  # lease until 31.0
    effects = core.expire_leases(31.0)
    view = core.program("p")
    assert view.status is Status.ACTING and view.token_total == 3_000 and view.turns == 2
    assert any("lease_expired program=p request=r2" in r.message for r in effects.logs)
    stats = core.stats(31.0)
    assert stats.tickets_expired_total == 1 and stats.tickets_in_flight == 0
    core.ledger.check_invariants(31.0)
    core.tick(121.0)  # idle 90 s at a tool boundary: released by the idle TTL
    assert core.program("p") is None


def test_renewal_keeps_a_long_turn_and_a_late_complete_after_expiry_is_ignored():
    core = core_with()
    core.admit(0.0, "p", "", 1_000, "r1")
    core.renew_leases(0.0, [], ["r1"])  # delivered
    for now in (20.0, 45.0, 70.0):
        assert core.renew_leases(now, ["r1", "gone"]) == ("gone",)
        core.expire_leases(now + 1.0)
        assert core.program("p").status is Status.REASONING
    core.expire_leases(100.0)  # last renewal at 70: lease until 100
    assert core.program("p").status is Status.ACTING
    assert core.renew_leases(101.0, ["r1"]) == ("r1",)
    core.complete(102.0, "p", "r1", ReplicaKey(*W), 9_000, 9_000)
    assert core.program("p").token_total == 1_000 and core.completes_ignored_total == 1


def test_a_held_admission_has_no_lease_and_a_resumed_one_starts_its_lease_after_the_resume():
    core = core_with(
        caps={W: 10_000}, pause_threshold=0.95, pause_target=0.8, soft_demote_threshold=0.8, resume_hysteresis=0.1
    )
    acting(core, "big", 9_000)
    assert core.admit(0.0, "new", "", 500, "n1").decision.verdict is Verdict.WAIT
    core.expire_leases(1_000.0)
    assert core.waiting_request_ids() == ("n1",)
    assert core.renew_leases(1_000.0, ["n1"]) == ()  # known, nothing to renew
    core.release(1_000.0, "big")
    assert [d.request_id for d in core.tick(1_000.0).resolutions] == ["n1"]
    core.expire_leases(1_001.0)  # the first look after the resume starts the lease
    core.renew_leases(1_001.0, [], ["n1"])  # its client has its first bytes
    core.expire_leases(1_030.9)
    assert core.program("new").status is Status.REASONING
    core.expire_leases(1_031.0)
    assert core.program("new").status is Status.ACTING
    core.ledger.check_invariants(1_031.0)


def test_a_lapsed_older_turn_does_not_end_the_newer_one():
    core = core_with()
    core.admit(0.0, "p", "", 1_000, "r1")  # never completed
    core.renew_leases(0.0, [], ["r1"])
    core.admit(20.0, "p", "", 1_500, "r2")
    core.renew_leases(20.0, [], ["r2"])
    core.expire_leases(30.0)  # r1 lapses: dropped, the program's turn in flight is r2's
    view = core.program("p")
    assert view.status is Status.REASONING and view.admission_epoch == 2
    assert core.stats(30.0).tickets_expired_total == 1
    core.expire_leases(50.0)
    assert core.program("p").status is Status.ACTING


def test_a_lapsed_passthrough_request_stops_being_charged():
    core = core_with()
    core.admit(0.0, "", "", 4_000, "pt")
    assert core.bind_request("pt", ReplicaKey(*W))
    assert core.replica_stats(0.0)[0].used_tokens == 4_100
    core.expire_leases(30.0)
    stats = core.stats(30.0)
    assert stats.passthrough_in_flight == 0 and stats.replicas[0].used_tokens == 0
    assert stats.tickets_expired_total == 1
    core.ledger.check_invariants(30.0)


def test_a_marked_program_whose_lease_lapses_is_paused_at_that_boundary():
    core = core_with(
        caps={W: 10_000}, pause_threshold=0.95, pause_target=0.8, soft_demote_threshold=0.8, resume_hysteresis=0.1
    )
    acting(core, "p", 5_000)
    core.admit(0.0, "p", "", 9_800, "r1")  # a live program keeps its placement
    core.renew_leases(0.0, [], ["r1"])
    core.tick(1.0)  # pause band, nothing ACTING: p is marked
    assert core.program("p").marked
    core.expire_leases(31.0)
    view = core.program("p")
    assert view.status is Status.ACTING and view.lifecycle is Lifecycle.PAUSED
    core.ledger.check_invariants(31.0)


def test_negative_or_infinite_lease_is_refused():
    for value in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="ticket_lease_seconds"):
            SchedulerCore(ControlParams(), ticket_lease_seconds=value)


def test_complete_outcome_of_an_expired_turn_is_cancelled():
    """The lapse reads as a cancelled turn: the estimate stays an estimate."""
    core = core_with()
    core.admit(0.0, "p", "", 1_000, "r1")
    core.renew_leases(0.0, [], ["r1"])
    core.expire_leases(30.0)
    view = core.program("p")
    assert view.tokens_estimated and TurnOutcome.CANCELLED.value == "cancelled"


def _table(core: SchedulerCore) -> dict:
    return {
        v.session_id: (v.status, v.lifecycle, v.token_total, v.tokens_estimated, v.turns, v.replica, v.marked)
        for v in core.programs()
    }


def test_an_unconfirmed_turn_is_rolled_back_when_its_lease_lapses():
    """Answered, but no router ever named it (its call was cancelled as the answer left)."""
    core = core_with()
    acting(core, "p", 2_000)
    before = _table(core)
    core.admit(1.0, "p", "", 3_000, "r2")
    core.expire_leases(31.0)
    assert _table(core) == before
    stats = core.stats(31.0)
    assert stats.tickets_in_flight == 0 and stats.tickets_expired_total == 1
    core.ledger.check_invariants(31.0)


def test_a_new_program_whose_only_turn_lapses_unconfirmed_is_gone():
    core = core_with()
    core.admit(0.0, "new", "", 3_000, "r1")
    core.expire_leases(30.0)
    assert core.program("new") is None and core.stats(30.0).tickets_in_flight == 0
    core.ledger.check_invariants(30.0)


@pytest.mark.parametrize("order", ["oldest_first", "newest_first", "middle_first"])
def test_rolling_back_placed_turns_in_any_order_restores_the_table(order):
    """Turns of a live program are not gated: several placed at once, each rolled back (cancelled as
    its answer left, or lapsed unconfirmed) in any order, leave the table as it was."""
    core = core_with()
    acting(core, "p", 2_000)
    before = _table(core)
    ids = [f"r{i}" for i in range(5)]
    for i, request_id in enumerate(ids):
        assert core.admit(1.0 + i, "p", "", 1_000 + i, request_id).decision.verdict is Verdict.PLACED
    ordered = {"oldest_first": ids, "newest_first": ids[::-1], "middle_first": [ids[2], ids[0], ids[4], ids[1], ids[3]]}
    for request_id in ordered[order]:
        core.cancel_admission(10.0, request_id)
        core.ledger.check_invariants(10.0)
    assert _table(core) == before


def test_one_rolled_back_turn_among_delivered_ones_takes_only_its_count():
    core = core_with()
    acting(core, "p", 2_000)
    turns = core.program("p").turns
    for request_id in ("r1", "r2", "r3"):
        core.admit(1.0, "p", "", 1_000, request_id)
    core.cancel_admission(2.0, "r2")  # cancelled as its answer left; r1 and r3 were delivered
    assert core.program("p").turns == turns + 2
    core.complete(3.0, "p", "r3", ReplicaKey(*W), 4_000, 0)
    core.cancel_admission(4.0, "r1")  # now a late rollback of the first
    view = core.program("p")
    assert view.turns == turns + 1 and view.token_total == 4_000
    core.ledger.check_invariants(4.0)


def test_any_subset_rolled_back_in_any_order_takes_back_exactly_its_counts():
    """Four placed turns of one program; every subset of them rolled back, in every order, interleaved
    with the others' completion: the turns count is the delivered ones', and rolling back all of them
    restores the table exactly."""
    import itertools

    ids = ("r0", "r1", "r2", "r3")
    for rolled in itertools.chain.from_iterable(itertools.combinations(ids, k) for k in range(len(ids) + 1)):
        for order in itertools.permutations(ids):
            core = core_with()
            acting(core, "p", 2_000)
            before = _table(core)
            turns = core.program("p").turns
            for i, request_id in enumerate(ids):
                core.admit(1.0 + i, "p", "", 1_000 + i, request_id)
            for request_id in order:
                if request_id in rolled:
                    core.cancel_admission(10.0, request_id)
                else:
                    core.complete(10.0, "p", request_id, ReplicaKey(*W), 3_000, 0)
                core.ledger.check_invariants(10.0)
            assert core.program("p").turns == turns + len(ids) - len(rolled), (rolled, order)
            assert core.program("p").status is Status.ACTING  # nothing in flight: nothing left REASONING
            if len(rolled) == len(ids):
                assert _table(core) == before, order


@pytest.mark.parametrize("seed", range(200))
def test_interleaved_admissions_completions_and_rollbacks_count_exactly(seed):
    """Admissions, Completes and rollbacks of one program's concurrent turns, interleaved at random
    (a storm whose cancels land late among turns that do run): the count is the completed turns', and
    once nothing is in flight the program is at a tool boundary, never left REASONING."""
    import random

    rng = random.Random(seed)
    core = core_with()
    acting(core, "p", 2_000)
    turns = core.program("p").turns
    in_flight: list[str] = []
    completed = 0
    now = 1.0
    for step in range(rng.randint(2, 12)):
        now += 1.0
        if in_flight and rng.random() < 0.6:
            request_id = in_flight.pop(rng.randrange(len(in_flight)))
            if rng.random() < 0.5:
                core.cancel_admission(now, request_id)
            else:
                core.complete(now, "p", request_id, ReplicaKey(*W), 3_000 + step, 0)
                completed += 1
        else:
            request_id = f"r{step}"
            core.admit(now, "p", "", 1_000 + step, request_id)
            in_flight.append(request_id)
        core.ledger.check_invariants(now)
    for request_id in in_flight:
        core.cancel_admission(now + 1.0, request_id)
    view = core.program("p")
    assert view.turns == turns + completed and view.status is Status.ACTING
    core.ledger.check_invariants(now + 1.0)


def test_a_turn_completed_as_not_started_is_rolled_back():
    """The router's word that an answered turn never reached a worker (its client left first)."""
    core = core_with()
    acting(core, "p", 2_000)
    before = _table(core)
    core.admit(1.0, "p", "", 3_000, "r2")
    core.complete(2.0, "p", "r2", None, 0, 0, 0, TurnOutcome.NOT_STARTED)
    assert _table(core) == before and core.stats(2.0).tickets_in_flight == 0
    core.admit(3.0, "", "", 4_000, "pt")  # a passthrough request: no longer charged
    assert core.bind_request("pt", ReplicaKey(*W))
    core.complete(4.0, "", "pt", ReplicaKey(*W), 0, 0, 0, TurnOutcome.NOT_STARTED)
    assert core.stats(4.0).passthrough_in_flight == 0 and _table(core) == before
    core.ledger.check_invariants(4.0)


def test_a_bound_turn_whose_client_got_nothing_is_rolled_back_when_its_lease_lapses():
    """Issue 21, a router killed between Bind and its 200: it bound the turn and renewed its lease while the
    worker prepared the first byte, then died. The client got nothing and retries: the scheduler must not
    count the turn (it did: Bind and RenewLeases confirmed it, and the lapse ended it as CANCELLED)."""
    core = core_with(caps={W: 100_000, ("w2", 0): 100_000})
    core.admit(0.0, "p", "", 2_000, "r1")  # a cold start: answered "any", the router picks and binds
    core.bind_request("r1", ReplicaKey(*W))
    core.complete(0.5, "p", "r1", ReplicaKey(*W), 2_000, 10)
    before = _table(core)
    core.admit(1.0, "p", "", 3_000, "r2")
    core.bind_request("r2", ReplicaKey(*W))
    core.renew_leases(10.0, ["r2"])
    core.expire_leases(40.0)
    assert _table(core) == before and core.program("p").turns == 1
    core.ledger.check_invariants(40.0)


def test_a_delivered_turn_counts_when_its_lease_lapses():
    core = core_with()
    acting(core, "p", 2_000)
    core.admit(1.0, "p", "", 3_000, "r2")
    core.bind_request("r2", ReplicaKey(*W))
    assert core.renew_leases(1.5, [], ["r2", "gone"]) == ("gone",)
    core.expire_leases(31.5)
    view = core.program("p")
    assert view.turns == 2 and view.status is Status.ACTING and view.token_total == 3_000
    core.ledger.check_invariants(31.5)
