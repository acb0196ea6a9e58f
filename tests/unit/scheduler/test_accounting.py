"""The accounting alone (core/accounting.py): the ledger's sums follow `recharge`, with no control law."""

from __future__ import annotations

import pytest

from services.scheduler.core import CapacitySnapshot, ControlParams, Lifecycle, ReplicaCapacity, ReplicaKey, Status
from services.scheduler.core.accounting import Ledger, Passthrough

A = ReplicaKey("a", 0)
B = ReplicaKey("b", 0)
BUF = 100


def ledger(caps: dict[ReplicaKey, int] | None = None) -> Ledger:
    led = Ledger(ControlParams(buffer_per_program_tokens=BUF))
    led.set_capacity(
        CapacitySnapshot(
            1, tuple(ReplicaCapacity(k.worker_id, k.dp_rank, t) for k, t in (caps or {A: 10_000, B: 10_000}).items())
        )
    )
    return led


def placed(led: Ledger, sid: str, tokens: int, key: ReplicaKey, status: Status = Status.REASONING, now: float = 0.0):
    program = led.create(now, sid, "")
    program.token_total = tokens
    program.status = status
    program.acting_since = now if status is Status.ACTING else None
    led.place(program, key)
    led.recharge(program)
    return program


def test_a_placed_program_is_charged_its_weight_plus_the_buffer() -> None:
    led = ledger()
    placed(led, "p", 1_000, A)
    assert led.used == {A: 1_100, B: 0}
    assert led.inflight == {A: 1, B: 0}
    assert list(led.resident[A]) == ["p"]
    led.check_invariants(0.0)


@pytest.mark.parametrize("change", ["pause", "move", "remove", "act"])
def test_recharge_after_any_change_keeps_the_sums_exact(change: str) -> None:
    led = ledger()
    program = placed(led, "p", 1_000, A)
    placed(led, "q", 500, A)
    if change == "pause":
        program.lifecycle = Lifecycle.PAUSED
        program.replica = None
        led.enqueue_paused("p")
        led.recharge(program)
        assert led.used[A] == 600
    elif change == "move":
        led.place(program, B)
        led.recharge(program)
        assert (led.used[A], led.used[B]) == (600, 1_100)
    elif change == "remove":
        led.remove(program)
        assert led.used[A] == 600 and "p" not in led.programs
    else:
        program.status = Status.ACTING
        program.acting_since = 0.0
        led.recharge(program)
        assert led.used[A] == 1_700 and led.inflight[A] == 1
    led.check_invariants(0.0)


def test_decayed_working_set_halves_acting_tokens_per_tau() -> None:
    led = ledger()
    placed(led, "p", 1_024, A, Status.ACTING, now=0.0)
    tau = led.params.acting_decay_tau_seconds
    assert led.decayed_used_one(0.0, A) == 1_024 + BUF
    assert led.decayed_used_one(tau, A) == 512 + BUF
    assert led.decayed_used_one(2 * tau, A) == 256 + BUF
    led.check_invariants(2 * tau)


def test_a_bound_passthrough_request_is_charged_until_it_ends() -> None:
    led = ledger()
    pt = Passthrough("r1", 300, A, 0.0)
    led.passthrough["r1"] = pt
    led.recharge_passthrough("r1", pt)
    assert (led.used[A], led.inflight[A], led.pt_count[A]) == (400, 1, 1)
    del led.passthrough["r1"]
    led.recharge_passthrough("r1", None)
    assert (led.used[A], led.inflight[A], led.pt_count[A]) == (0, 0, 0)
    led.check_invariants(0.0)


def test_a_replica_leaving_the_snapshot_unplaces_its_programs() -> None:
    led = ledger()
    program = placed(led, "p", 1_000, A)
    removed = led.set_capacity(CapacitySnapshot(2, (ReplicaCapacity("b", 0, 10_000),)))
    assert removed == [(A, 1)]
    assert program.replica is None and program.last_replica is None
    assert A not in led.used and led.capacity_version == 2
    led.check_invariants(0.0)


def test_the_pause_queue_is_ordered_by_pause_sequence() -> None:
    led = ledger()
    for sid in ("x", "y", "z"):
        led.create(0.0, sid, "")
        led.enqueue_paused(sid)
    assert sorted(led.paused, key=led.paused.__getitem__) == ["x", "y", "z"]
    assert led.next_pause_seq == 3


def test_children_follow_their_parent_and_a_program_is_not_its_own_parent() -> None:
    led = ledger()
    led.create(0.0, "parent", "")
    child = led.create(0.0, "child", "parent")
    assert led.create(0.0, "self", "self").parent_session_id == ""
    assert list(led.children["parent"]) == ["child"]
    led.remove(child)
    assert "parent" not in led.children


def test_tail_turns_is_the_quantile_of_released_programs_turns() -> None:
    led = Ledger(ControlParams(tail_protection_quantile=0.5))
    for turns in (1, 2, 3, 4, 5, 6, 7, 8):
        led.note_release(turns)
    assert led.tail_turns == 5
    long_runner = led.create(0.0, "p", "")
    long_runner.turns = 6
    assert led.is_tail(long_runner)


def test_change_tracking_reports_touched_programs_once() -> None:
    led = ledger()
    led.tracking = True
    placed(led, "p", 10, A)
    assert led.take_changes().programs == frozenset({"p"})
    assert led.take_changes().programs == frozenset()


def test_check_invariants_catches_a_sum_that_drifted() -> None:
    led = ledger()
    placed(led, "p", 1_000, A)
    led.used[A] += 1
    with pytest.raises(AssertionError):
        led.check_invariants()
