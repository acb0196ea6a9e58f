"""Durable state of the core: export, restore, and change tracking that misses nothing."""

from __future__ import annotations

import dataclasses
import random

import pytest

from services.scheduler.core import ControlParams, Lifecycle, ReplicaKey, SchedulerCore, Status, Verdict, durable
from services.scheduler.core.state import STATE_FORMAT, CoreMeta, CoreState
from tests.unit.scheduler.helpers import rid, snapshot

CAPS = {("w1", 0): 10_000, ("w2", 0): 10_000}
PARAMS = dict(
    pause_threshold=0.95,
    pause_target=0.8,
    soft_demote_threshold=0.8,
    resume_hysteresis=0.1,
    tail_protection_quantile=0.5,
    resume_aging_seconds=0.0,
)


def new_core(lease_s: float = 30.0, caps=CAPS) -> SchedulerCore:
    core = SchedulerCore(ControlParams(**PARAMS), ticket_lease_seconds=lease_s)
    if caps is not None:
        core.apply_capacity(0.0, snapshot(caps))
    return core


def table(core: SchedulerCore) -> dict:
    """The persisted part of every program (marks and soft demotion are the next tick's to set)."""
    out = {}
    for view in core.programs():
        d = dataclasses.asdict(view)
        d.pop("marked")
        d.pop("soft_demoted")
        out[view.session_id] = d
    return out


def restored(core: SchedulerCore, now: float, caps=CAPS) -> SchedulerCore:
    other = new_core(caps=None)
    durable.restore(other, now, durable.export_state(core))
    if caps is not None:
        other.apply_capacity(now, snapshot(caps))
    return other


def done_turn(core: SchedulerCore, sid: str, tokens: int, now: float, parent: str = "") -> None:
    """A small first estimate (always placed), then the turn reports `tokens`."""
    request_id = rid()
    decision = core.admit(now, sid, parent, 1, request_id).decision
    assert decision.verdict is Verdict.PLACED
    core.complete(now, sid, request_id, decision.replica, tokens, 0)


def test_round_trip_keeps_table_paused_order_accounting_tail_history_and_totals():
    core = new_core()
    for i in range(5):  # released history: tail protection above 2 turns
        for _ in range(1 + i % 3):
            done_turn(core, f"done{i}", 100, 0.0)
        core.release(0.0, f"done{i}")
    done_turn(core, "root", 3_000, 1.0)
    done_turn(core, "child", 2_000, 1.0, parent="root")
    for sid, tokens in (("a", 4_000), ("b", 4_500), ("c", 5_000), ("d", 5_500)):
        done_turn(core, sid, tokens, 2.0)
    core.admit(3.0, "root", "", 3_500, "running")  # a turn in flight
    core.admit(3.0, "", "", 700, "pt")
    core.bind_request("pt", ReplicaKey("w1", 0))
    core.tick(4.0)
    assert core.paused_ids(), "the setup must leave programs paused"
    core.ledger.check_invariants(4.0)

    other = restored(core, 4.0)
    assert table(other) == table(core)
    assert other.paused_ids() == core.paused_ids()
    assert [(r.replica, r.used_tokens, r.used_decayed_tokens) for r in other.replica_stats(4.0)] == [
        (r.replica, r.used_tokens, r.used_decayed_tokens) for r in core.replica_stats(4.0)
    ]
    assert other.ledger.tail_turns == core.ledger.tail_turns is not None
    s1, s2 = core.stats(4.0), other.stats(4.0)
    assert (s2.pauses_total, s2.released_total, s2.admissions_total, s2.passthrough_in_flight) == (
        s1.pauses_total,
        s1.released_total,
        s1.admissions_total,
        s1.passthrough_in_flight,
    )
    other.ledger.check_invariants(4.0)
    # The running turn is still a ticket: its Complete is accounted, not ignored.
    other.complete(5.0, "root", "running", ReplicaKey("w1", 0), 3_600, 100)
    assert other.program("root").token_total == 3_700 and other.completes_ignored_total == 0
    # New programs continue the creation and pause sequences.
    assert (other.ledger.next_seq, other.ledger.next_pause_seq) == (core.ledger.next_seq, core.ledger.next_pause_seq)


def test_a_held_turn_or_an_unstored_ticket_ends_at_restore():
    core = new_core(caps={("w1", 0): 10_000})
    done_turn(core, "big", 9_000, 0.0)
    assert core.admit(1.0, "new", "", 500, "n1").decision.verdict is Verdict.WAIT
    core.admit(1.0, "big", "", 9_100, "b2")  # running
    state = durable.export_state(core)
    without_b2 = dataclasses.replace(state, tickets=tuple(t for t in state.tickets if t.request_id != "b2"))
    other = new_core(caps=None)
    logs = durable.restore(other, 50.0, without_b2).logs
    assert "scheduler.recovered programs=2 paused=1 tickets=0 ended_turns=2" in logs[0].message
    new, big = other.program("new"), other.program("big")
    assert new.status is Status.ACTING and new.lifecycle is Lifecycle.PAUSED and other.waiting_request_ids() == ()
    assert big.status is Status.ACTING and big.turns == 2
    other.apply_capacity(50.0, snapshot({("w1", 0): 10_000}))
    other.ledger.check_invariants(50.0)


def test_restored_tickets_get_a_fresh_lease_and_lapse_without_a_router():
    core = new_core()
    core.admit(0.0, "p", "", 1_000, "r1")
    other = restored(core, 1_000.0)
    assert other.renew_leases(1_000.0, ["r1"]) == ()
    other.expire_leases(1_029.0)
    assert other.program("p").status is Status.REASONING
    other.expire_leases(1_031.0)
    assert other.program("p").status is Status.ACTING


def test_a_restored_ticket_never_delivered_is_rolled_back_when_it_lapses():
    """A turn whose router died before its client's first byte, and whose scheduler then failed over: the
    new leader must not count it (the client retries the turn) once its lease lapses unconfirmed (chaos
    seed 0, --quick: one phantom turn)."""
    core = new_core()
    done_turn(core, "p", 1_000, 0.0)
    core.admit(1.0, "p", "", 1_100, "r2")  # dispatched to its worker; its router dies before delivery
    other = restored(core, 1_000.0)
    assert other.program("p").turns == 2  # still running as far as the table knows
    other.expire_leases(1_031.0)
    p = other.program("p")
    assert p.turns == 1 and p.status is Status.ACTING
    other.ledger.check_invariants(1_031.0)


def test_a_restored_ticket_that_was_delivered_still_counts_when_it_lapses():
    core = new_core()
    done_turn(core, "p", 1_000, 0.0)
    core.admit(1.0, "p", "", 1_100, "r2")
    core.renew_leases(1.1, [], delivered=["r2"])
    other = restored(core, 1_000.0)
    other.expire_leases(1_031.0)
    p = other.program("p")
    assert p.turns == 2 and p.status is Status.ACTING


def test_a_delivery_reported_to_the_new_leader_confirms_a_restored_ticket():
    core = new_core()
    done_turn(core, "p", 1_000, 0.0)
    core.admit(1.0, "p", "", 1_100, "r2")
    other = restored(core, 1_000.0)
    other.renew_leases(1_000.5, [], delivered=["r2"])
    other.expire_leases(1_031.0)
    assert other.program("p").turns == 2


def test_a_confirmation_is_a_change_to_write_through():
    core = new_core()
    core.admit(0.0, "p", "", 1_000, "r1")
    core.ledger.track_changes()
    core.ledger.take_changes()
    core.renew_leases(0.5, ["r1"])
    assert not core.ledger.take_changes().tickets  # a renewal alone changes nothing stored
    core.renew_leases(0.6, [], delivered=["r1"])
    assert core.ledger.take_changes().tickets == {"r1"}
    assert durable.export_ticket(core.ledger, "r1").confirmed


def test_placements_wait_for_their_replica_in_the_snapshot():
    core = new_core()
    done_turn(core, "p", 2_000, 0.0)
    replica = core.program("p").replica
    other = new_core(caps=None)
    durable.restore(other, 1.0, durable.export_state(core))
    assert other.program("p").replica == replica
    others = {k: v for k, v in CAPS.items() if k != (replica.worker_id, replica.dp_rank)}
    other.apply_capacity(1.0, snapshot(others))  # its worker has not re-registered yet
    assert sum(r.used_tokens for r in other.replica_stats(1.0)) == 0
    other.apply_capacity(2.0, snapshot(CAPS, version=2))
    assert {r.replica: r.used_tokens for r in other.replica_stats(2.0)}[replica] == 2_100
    other.ledger.check_invariants(2.0)


def test_a_newer_format_is_refused_and_restore_needs_an_empty_core():
    with pytest.raises(ValueError, match="newer"):
        durable.restore(new_core(), 0.0, CoreState(meta=CoreMeta(format=STATE_FORMAT + 1)))
    core = new_core()
    core.admit(0.0, "p", "", 1, "r")
    with pytest.raises(RuntimeError):
        durable.restore(core, 0.0, CoreState())


def test_change_tracking_is_off_until_asked_and_a_policy_refresh_touches_nothing():
    core = new_core()
    done_turn(core, "p", 1_000, 0.0)
    core.ledger.track_changes()
    assert not core.ledger.take_changes()
    core.ledger.recharge(core.ledger.programs["p"], touched=False)
    assert not core.ledger.take_changes()
    core.admit(1.0, "p", "", 1_200, "r9")
    changes = core.ledger.take_changes()
    assert changes.programs == {"p"} and changes.tickets == {"r9"}
    core.complete(2.0, "p", "r9", None, 1_300, 0)
    changes = core.ledger.take_changes()
    assert changes.tickets == {"r9"} and durable.export_ticket(core.ledger, "r9") is None


@pytest.mark.parametrize("seed", range(6))
def test_deltas_rebuild_exactly_the_full_export(seed):
    """Apply every take_changes() delta to a dict (what a store does); at any point it equals the
    full export: nothing that changes escapes the tracking."""
    rng = random.Random(seed)
    core = new_core(lease_s=20.0)
    core.ledger.track_changes()
    store_programs: dict = {}
    store_tickets: dict = {}
    now = 0.0
    running: dict[str, str] = {}
    for step in range(400):
        now += rng.random() * 3
        sid = f"p{rng.randrange(25)}"
        op = rng.random()
        if op < 0.45 and sid not in running:
            request_id = rid()
            if (
                core.admit(
                    now,
                    sid,
                    f"p{rng.randrange(25)}" if rng.random() < 0.1 else "",
                    rng.randrange(50, 3_000),
                    request_id,
                ).decision.verdict
                is Verdict.PLACED
            ):
                running[sid] = request_id
        elif op < 0.8 and sid in running:
            core.complete(now, sid, running.pop(sid), None, rng.randrange(100, 4_000), rng.randrange(0, 200))
        elif op < 0.85:
            core.release(now, sid)
            running.pop(sid, None)
        elif op < 0.9:
            core.expire_leases(now)
        elif op < 0.93:
            request_id = rid()
            core.admit(now, "", "", rng.randrange(10, 500), request_id)
            core.bind_request(request_id, ReplicaKey("w2", 0))
        else:
            core.tick(now)
        changes = core.ledger.take_changes()
        for p in changes.programs:
            record = durable.export_program(core.ledger, p)
            store_programs.pop(p, None) if record is None else store_programs.__setitem__(p, record)
        for t in changes.tickets:
            record = durable.export_ticket(core.ledger, t)
            store_tickets.pop(t, None) if record is None else store_tickets.__setitem__(t, record)
        if step % 50 == 49:
            full = durable.export_state(core)
            assert store_programs == {r.session_id: r for r in full.programs}
            assert store_tickets == {r.request_id: r for r in full.tickets}
            core.ledger.check_invariants(now)
            restored(core, now).ledger.check_invariants(now)


def test_a_new_leader_answers_a_retried_admit_of_a_stored_turn_with_the_same_admission():
    """The old leader stored the admission and died before its answer left: the router's retry on the new
    leader (same request id) gets it again, counted once; a second Admit of it is a duplicate."""
    from services.scheduler.core import DuplicateRequest

    core = new_core()
    first = core.admit(0.0, "p", "", 1_000, "r1").decision
    other = restored(core, 5.0)
    again = other.admit(5.0, "p", "", 1_000, "r1").decision
    assert again.verdict is Verdict.PLACED and again.admission_epoch == first.admission_epoch
    assert other.program("p").turns == 1 and other.admissions_total == core.admissions_total
    with pytest.raises(DuplicateRequest):
        other.admit(5.5, "p", "", 1_000, "r1")
    other.complete(6.0, "p", "r1", again.replica, 1_200, 10)
    assert other.program("p").status is Status.ACTING and other.program("p").token_total == 1_210
    other.ledger.check_invariants(6.0)


def test_a_held_turn_is_not_counted_after_restore_so_the_routers_retry_counts_it_once():
    core = new_core(caps={("w1", 0): 10_000})
    done_turn(core, "big", 9_000, 0.0)
    done_turn(core, "p", 300, 0.5)
    core.tick(0.6)  # under pressure: p pauses at its tool boundary
    if core.program("p").lifecycle is not Lifecycle.PAUSED:
        pytest.skip("p was not paused by this control law")
    assert core.admit(1.0, "p", "", 300, "p2").decision.verdict is Verdict.WAIT
    assert core.program("p").turns == 2
    other = restored(core, 50.0, caps={("w1", 0): 10_000})
    assert other.program("p").turns == 1  # the held turn's Admit is asked again
    other.admit(50.0, "p", "", 300, "p2")
    assert other.program("p").turns == 2
    other.ledger.check_invariants(50.0)
