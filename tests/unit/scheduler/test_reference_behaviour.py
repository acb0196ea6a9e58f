"""The reference's acceptance tests (thunderagent.md §6) that concern the core, as our own tests."""

from __future__ import annotations

import pytest

from services.scheduler.core import (
    Band,
    EventKind,
    Lifecycle,
    ReplicaKey,
    Status,
    TurnOutcome,
    Verdict,
    transition_logs,
)
from services.scheduler.core.control import Pause, Plan
from tests.unit.scheduler.helpers import make_core, place_acting, place_reasoning, rid, snapshot, turn

R10 = ReplicaKey("1", 0)


def test_first_turn_no_capacity_is_not_held():
    core = make_core()
    d = core.admit(0.0, "p", "", 100, rid()).decision
    assert d.verdict is Verdict.PLACED and not d.was_paused and d.priority == 0 and d.replica is None


def test_complete_records_real_tokens_and_acting():
    core = make_core({("1", 0): 10_000})
    request_id = rid()
    core.admit(0.0, "p", "", 50, request_id)
    core.complete(1.0, "p", request_id, R10, 120, 30)
    view = core.program("p")
    assert (view.token_total, view.status, view.tokens_estimated) == (150, Status.ACTING, False)


def test_estimate_recorded_before_admission():
    core = make_core({("1", 0): 100_000})
    core.admit(0.0, "p", "", 1234, rid())
    view = core.program("p")
    assert (view.token_total, view.status, view.tokens_estimated) == (1234, Status.REASONING, True)


def test_replica_stats_report_used_with_buffer():
    core = make_core({("1", 0): 1000, ("2", 0): 1000})
    place_acting(core, "p1", 100, ("1", 0))
    place_reasoning(core, "p2", 25, ("1", 0))
    rows = {s.replica: s for s in core.replica_stats(0.0)}
    row = rows[R10]
    assert (row.retention_tokens, row.used_tokens, row.active_programs, row.resident_programs) == (1000, 325, 1, 2)
    stats = core.stats(0.0)
    assert (stats.programs_active, stats.programs_acting, stats.programs_reasoning) == (2, 1, 1)


def test_bind_request_back_fills_unpinned_turn_and_rejects_unknown_replica():
    core = make_core()
    request_id = rid()
    core.admit(0.0, "p", "", 100, request_id)  # cold start: unpinned
    assert not core.bind_request(request_id, R10)  # not in any snapshot yet
    core.apply_capacity(0.0, snapshot({("7", 2): 1000, ("1", 0): 1000}))
    assert core.bind_request(request_id, ReplicaKey("7", 2))
    assert not core.bind_request(request_id, R10)  # placement is authoritative once made
    core.complete(1.0, "p", request_id, ReplicaKey("7", 2), 100, 10)
    assert core.admit(2.0, "p", "", 110, rid()).decision.replica == ReplicaKey("7", 2)


def test_back_fill_from_superseded_turn_is_ignored():
    core = make_core()
    first = rid()
    core.admit(0.0, "p", "", 100, first)
    core.complete(0.5, "p", first, None, 100, 0)
    second = rid()
    core.admit(1.0, "p", "", 100, second)
    core.apply_capacity(1.0, snapshot({("1", 0): 1000}))
    assert not core.bind_request(first, R10)


def test_replica_leaving_snapshot_releases_placement_and_next_turn_moves():
    core = make_core({("1", 0): 10_000})
    turn(core, "p", 100)
    assert core.program("p").replica == R10
    core.tick(1.0, snapshot({("2", 0): 10_000}, version=2))
    assert core.program("p").replica is None
    assert core.admit(2.0, "p", "", 100, rid()).decision.replica == ReplicaKey("2", 0)
    core.ledger.check_invariants()


def test_stale_replacement_bypasses_new_program_gate():
    core = make_core({("1", 0): 10_000})
    turn(core, "old", 100)
    core.apply_capacity(0.0, snapshot({("1", 0): 10_000, ("2", 0): 10_000}))
    core.apply_capacity(0.0, snapshot({("1", 0): 100, ("2", 0): 10_000}))
    # Fill worker 1 and queue a new program so that something waits.
    core.apply_capacity(0.0, snapshot({("2", 0): 10_000, ("3", 0): 250}))
    place_reasoning(core, "hog", 9_000, ("2", 0))
    queued = core.admit(0.0, "new", "", 5_000, rid()).decision
    assert queued.verdict is Verdict.WAIT
    assert core.admit(1.0, "old", "", 100, rid()).decision.replica == ReplicaKey("2", 0)


def test_paused_program_waits_until_resume_with_boost():
    core = make_core({("1", 0): 1000}, resume_hysteresis=0.0)
    turn(core, "p", 100)
    core.apply(0.0, Plan((Pause("p", "test"),)))
    request_id = rid()
    d = core.admit(1.0, "p", "", 100, request_id).decision
    assert d.verdict is Verdict.WAIT
    result = core.tick(2.0)
    (res,) = result.resolutions
    assert (res.request_id, res.verdict, res.was_paused, res.replica, res.priority_seconds, res.priority) == (
        request_id,
        Verdict.PLACED,
        True,
        R10,
        1.0,
        1,
    )
    assert "scheduler.tick resumed=1 still_paused=0" in [r.message for r in result.logs]
    # The reference's DEBUG line, rendered from the RESUMED event (the shell logs it at DEBUG).
    assert "Resumed program p -> worker=1 (tokens=100)" in [r.message for r in transition_logs(result.events)]


def test_forced_resume_after_timeout():
    core = make_core({("1", 0): 1000, ("2", 0): 1000}, resume_timeout_seconds=10.0)
    place_reasoning(core, "hog", 900, ("1", 0))
    place_reasoning(core, "hog2", 900, ("2", 0))
    request_id = rid()
    assert core.admit(0.0, "p", "", 500, request_id).decision.verdict is Verdict.WAIT
    assert core.resume_deadline(request_id) == 10.0
    assert core.tick(5.0).resolutions == ()
    result = core.tick(10.0)
    (res,) = result.resolutions
    assert res.forced_resume and res.was_paused and res.priority == 1 and res.held_seconds == 10.0
    assert core.stats(10.0).forced_resumes_total == 1
    assert core.program("p").lifecycle is Lifecycle.ACTIVE
    assert "Forced resume for p after 10.0s" in [r.message for r in result.logs]
    assert [e.kind for e in result.events if e.session_id == "p"][0] is EventKind.FORCED_RESUME


def test_forced_resume_without_capacity_goes_unpinned():
    core = make_core({("1", 0): 1000}, resume_timeout_seconds=1.0)
    place_reasoning(core, "hog", 900, ("1", 0))
    request_id = rid()
    assert core.admit(0.0, "p", "", 500, request_id).decision.verdict is Verdict.WAIT
    (res,) = core.tick(2.0, snapshot({}, version=2)).resolutions
    assert res.forced_resume and res.replica is None


def test_new_program_queues_when_capacity_full_and_gets_boost_after_resume():
    core = make_core({("1", 0): 1000}, resume_hysteresis=0.0)
    place_reasoning(core, "hog", 850, ("1", 0))  # used 950
    request_id = rid()
    result = core.admit(0.0, "p", "", 100, request_id)
    assert result.decision.verdict is Verdict.WAIT and core.program("p").lifecycle is Lifecycle.PAUSED
    assert any("reason=admission_full" in r.message for r in result.effects.logs)
    core.release(1.0, "hog")
    (res,) = core.tick(2.0).resolutions
    assert res.was_paused and res.priority_seconds == 1.0


def test_cold_start_admits_without_pin():
    core = make_core()
    d = core.admit(0.0, "p", "", 100, rid()).decision
    assert d.replica is None and not d.pinned and core.program("p").lifecycle is Lifecycle.ACTIVE


def test_soft_demote_band_lowers_next_turn_priority():
    core = make_core({("1", 0): 1000})
    place_acting(core, "p", 750, ("1", 0))  # used 850 -> soft band
    result = core.tick(1.0)
    assert [e.kind for e in result.events] == [EventKind.SOFT_DEMOTED]
    assert core.program("p").soft_demoted
    d = core.admit(2.0, "p", "", 750, rid()).decision
    assert d.was_soft_demoted and d.priority_seconds == -2.0 and d.priority == -2
    assert core.admit(20.0, "q", "", 1, rid()).decision.priority == 0


@pytest.mark.parametrize(
    "sizes, paused",
    [
        ({"small": 100, "big": 700}, ["small"]),
        ({"a": 50, "b": 60, "c": 700}, ["a", "b"]),
    ],
)
def test_pause_smallest_acting_first(sizes, paused):
    core = make_core({("1", 0): 1000}, pause_threshold=0.8, pause_target=0.8, soft_demote_threshold=0.8)
    for sid, tokens in sizes.items():
        place_acting(core, sid, tokens, ("1", 0))
    result = core.tick(1.0)
    assert [e.session_id for e in result.events if e.kind is EventKind.PAUSED] == paused


def test_pause_is_scoped_to_overloaded_worker_and_dp_rank():
    core = make_core({("1", 0): 1000, ("1", 1): 1000, ("2", 0): 1000})
    for sid, tokens, replica in [
        ("a", 100, ("1", 0)),
        ("b", 650, ("1", 0)),
        ("c", 100, ("1", 1)),
        ("d", 100, ("2", 0)),
    ]:
        place_acting(core, sid, tokens, replica)
    result = core.tick(1.0)
    assert [e.session_id for e in result.events if e.kind is EventKind.PAUSED] == ["a"]
    assert [r.message for r in result.logs if r.message.startswith("scheduler.tick")] == [
        "scheduler.tick worker=1 dp_rank=0 paused=1 marked=0 util=0.9500 -> 0.7500"
    ]


def test_admission_spreads_across_dp_ranks():
    core = make_core({("1", 0): 10_000, ("1", 1): 10_000})
    a = core.admit(0.0, "a", "", 100, rid()).decision.replica
    b = core.admit(0.0, "b", "", 100, rid()).decision.replica
    assert {a, b} == {ReplicaKey("1", 0), ReplicaKey("1", 1)}


def test_admission_places_by_in_flight_load_not_resident_tokens():
    core = make_core({("1", 0): 1_000_000, ("1", 1): 1_000_000})
    place_acting(core, "idle", 300_000, ("1", 0), now=0.0)
    place_reasoning(core, "busy", 50_000, ("1", 1), now=0.0)
    assert core.admit(60.0, "new", "", 1000, rid()).decision.replica == ReplicaKey("1", 0)


def test_pause_drives_util_to_target_not_threshold():
    core = make_core({("1", 0): 1_000_000})
    for i in range(10):
        place_acting(core, f"p{i}", 100_000, ("1", 0))
    result = core.tick(1.0)
    assert result.paused == 3
    assert any(
        r.message == "scheduler.tick worker=1 dp_rank=0 paused=3 marked=0 util=1.0010 -> 0.7007" for r in result.logs
    )


def test_tick_resumes_before_pausing_so_no_same_tick_resume():
    core = make_core({("1", 0): 1000}, pause_threshold=1.0, pause_target=0.8)
    for i in range(10):
        place_acting(core, f"p{i}", 100, ("1", 0))
    result = core.tick(1.0)
    assert (result.paused, result.resumed) == (6, 0)


def test_new_program_queues_when_count_ceiling_full():
    core = make_core()
    core.apply_capacity(0.0, snapshot({("1", 0): 1_000_000}, max_programs={("1", 0): 1}))
    place_reasoning(core, "busy", 100, ("1", 0))
    assert core.admit(0.0, "new", "", 100, rid()).decision.verdict is Verdict.WAIT


def test_count_pressure_marks_in_flight_turns():
    core = make_core(pause_threshold=0.8, pause_target=0.8, soft_demote_threshold=0.8)
    core.apply_capacity(0.0, snapshot({("1", 0): 1_000_000}, max_programs={("1", 0): 2}))
    place_reasoning(core, "a", 100, ("1", 0))
    place_reasoning(core, "b", 200, ("1", 0))
    place_reasoning(core, "c", 300, ("1", 0))
    result = core.tick(1.0)
    assert result.paused == 0 and result.marked == 2  # 3 in flight, target 1.6: two must go


def test_idle_programs_do_not_take_request_slots():
    core = make_core()
    core.apply_capacity(0.0, snapshot({("1", 0): 1_000_000}, max_programs={("1", 0): 2}))
    for i in range(5):
        place_acting(core, f"idle{i}", 100, ("1", 0))
    place_reasoning(core, "busy", 100, ("1", 0))
    (row,) = core.replica_stats(0.0)
    assert (row.resident_programs, row.active_programs) == (6, 1)
    result = core.tick(1.0)
    assert (result.paused, result.marked) == (0, 0)
    assert core.admit(1.0, "new", "", 100, rid()).decision.verdict is Verdict.PLACED


def test_resume_respects_count_ceiling_but_not_for_idle_programs():
    core = make_core(resume_hysteresis=0.0, pause_threshold=1.0)
    core.apply_capacity(0.0, snapshot({("1", 0): 1_000_000}, max_programs={("1", 0): 2}))
    place_reasoning(core, "busy", 100, ("1", 0))
    place_reasoning(core, "x", 100, ("1", 0))
    waiting = []
    for sid in ("w1", "w2"):
        turn(core, sid, 100)  # placed, then ACTING
    for sid in ("w1", "w2"):
        core.apply(0.0, Plan((Pause(sid, "test"),)))
        request_id = rid()
        waiting.append(request_id)
        core.admit(0.5, sid, "", 100, request_id)
    core.release(0.6, "x")  # one slot free
    assert core.tick(1.0).resumed == 1


def test_resume_restores_idle_programs_past_the_count_ceiling():
    core = make_core(resume_hysteresis=0.0, pause_threshold=1.0)
    core.apply_capacity(0.0, snapshot({("1", 0): 1_000_000}, max_programs={("1", 0): 2}))
    place_acting(core, "idle", 100, ("1", 0))
    place_reasoning(core, "busy", 100, ("1", 0))
    place_reasoning(core, "busy2", 100, ("1", 0))
    core.apply(1.0, Plan((Pause("idle", "test"),)))
    assert "idle" in [e.session_id for e in core.tick(2.0).events if e.kind is EventKind.RESUMED]


def test_idle_program_expires_and_frees_its_budget():
    core = make_core({("1", 0): 10_000}, program_idle_ttl_seconds=5.0)
    turn(core, "p", 100, now=0.0)
    assert core.tick(4.0).expired == 0
    result = core.tick(6.0)
    assert result.expired == 1 and core.program("p") is None
    assert [e.kind for e in result.events] == [EventKind.EXPIRED]
    (row,) = core.replica_stats(6.0)
    assert (row.used_tokens, row.resident_programs) == (0, 0)
    assert core.stats(6.0).expired_total == 1


def test_in_flight_and_held_programs_never_expire_but_paused_ghosts_do():
    core = make_core({("1", 0): 1000}, program_idle_ttl_seconds=5.0)
    place_reasoning(core, "inflight", 100, ("1", 0))
    turn(core, "held", 100)
    core.apply(0.0, Plan((Pause("held", "test"),)))
    core.apply_capacity(0.0, snapshot({("1", 0): 150}))  # nothing can resume
    core.admit(0.0, "held", "", 100, rid())
    place_acting(core, "ghost", 100, ("1", 0))
    core.apply(0.0, Plan((Pause("ghost", "test"),)))
    core.tick(100.0)
    assert core.program("inflight") is not None and core.program("held") is not None
    assert core.program("ghost") is None and "ghost" not in core.paused_ids()


def test_zero_ttl_disables_expiry():
    core = make_core({("1", 0): 1000}, program_idle_ttl_seconds=0.0)
    turn(core, "p", 100)
    core.tick(1e6)
    assert core.program("p") is not None


def test_cancelled_admission_of_new_program_leaves_no_trace():
    core = make_core({("1", 0): 1000})
    place_acting(core, "hog", 50, ("1", 0))  # used 150
    core.apply_capacity(0.0, snapshot({("1", 0): 200}))
    request_id = rid()
    assert core.admit(0.0, "p", "", 500, request_id).decision.verdict is Verdict.WAIT
    core.cancel_admission(0.5, request_id)
    core.cancel_admission(0.6, request_id)  # redelivered cancellation is harmless
    core.tick(1.0)
    assert core.program("p") is None and "p" not in core.paused_ids()
    assert core.replica_stats(1.0)[0].used_tokens == 150
    assert core.waiting_request_ids() == ()


def test_cancelled_admission_restores_prior_turn_exactly():
    core = make_core({("1", 0): 1000})
    turn(core, "p", 110)
    core.apply(0.0, Plan((Pause("p", "test"),)))
    before = core.program("p")
    first = rid()
    core.admit(1.0, "p", "", 500, first)
    second = rid()
    core.admit(1.5, "p", "", 777, second)
    core.cancel_admission(2.0, first)  # a later turn owns it: no rollback
    assert core.program("p").token_total == 777
    core.cancel_admission(2.0, second)
    # Both turns cancelled: the table is as it was before the first admission (reference §6 #37).
    assert core.program("p") == before
    third = rid()
    core.admit(3.0, "p", "", 600, third)
    core.cancel_admission(3.0, third)
    core.ledger.check_invariants()
    assert core.program("p") == before
    assert before.token_total == 110 and before.turns == 1 and "p" in core.paused_ids()


def test_two_cancelled_admissions_of_a_new_program_leave_no_trace():
    core = make_core({("1", 0): 1000})
    first, second = rid(), rid()
    core.admit(1.0, "n", "", 500, first)
    core.admit(1.5, "n", "", 777, second)
    core.cancel_admission(2.0, first)
    core.cancel_admission(2.0, second)
    assert core.program("n") is None
    assert "n" not in core.paused_ids()
    core.ledger.check_invariants()


def test_cancelled_admission_of_existing_program_restores_fields_and_queue_position():
    core = make_core({("1", 0): 1000})
    turn(core, "a", 100)
    turn(core, "p", 110)
    core.apply(0.0, Plan((Pause("p", "test"),)))
    core.apply(0.0, Plan((Pause("a", "test"),)))
    before = (core.program("p"), core.paused_ids())
    request_id = rid()
    core.admit(1.0, "p", "", 500, request_id)
    core.cancel_admission(2.0, request_id)
    assert (core.program("p"), core.paused_ids()) == before
    view = core.program("p")
    assert (view.lifecycle, view.status, view.turns, view.token_total, view.replica) == (
        Lifecycle.PAUSED,
        Status.ACTING,
        1,
        110,
        None,
    )


def test_cancel_after_release_does_not_resurrect():
    core = make_core({("1", 0): 1000})
    request_id = rid()
    core.admit(0.0, "p", "", 100, request_id)
    core.release(0.5, "p")
    core.admit(0.6, "p", "", 100, rid())
    core.cancel_admission(1.0, request_id)
    assert core.program("p").turns == 1


def test_marked_program_pauses_at_tool_boundary_and_marks_clear_when_pressure_goes():
    core = make_core({("1", 0): 1000})
    request_id = place_reasoning(core, "p", 980, ("1", 0))
    result = core.tick(1.0)
    assert result.marked == 1 and core.program("p").marked
    assert any(
        r.message == "scheduler.tick worker=1 dp_rank=0 paused=0 marked=1 util=1.0800 -> 1.0800" for r in result.logs
    )
    effects = core.complete(2.0, "p", request_id, R10, 980, 10, outcome=TurnOutcome.OK)
    assert [e.kind for e in effects.events] == [EventKind.PAUSED]
    assert core.program("p").lifecycle is Lifecycle.PAUSED
    # A mark is dropped once the replica is back within target.
    core2 = make_core({("1", 0): 1000})
    place_reasoning(core2, "q", 980, ("1", 0))
    core2.tick(1.0)
    core2.apply_capacity(1.0, snapshot({("1", 0): 10_000}))
    core2.tick(2.0)
    assert not core2.program("q").marked


def test_release_removes_every_trace_and_unblocks_waiters():
    core = make_core({("1", 0): 1000})
    turn(core, "parent", 100)
    core.admit(0.0, "child", "parent", 100, rid())
    assert core.program("parent").children == ("child",)
    released, effects = core.release(1.0, "child")
    assert released and core.program("child") is None and core.program("parent").children == ()
    assert core.release(1.0, "child")[0] is False
    assert effects.logs[-1].message == "thunderagent.program terminated program=child remaining=1"


def test_passthrough_is_counted_while_in_flight():
    core = make_core({("1", 0): 1000})
    request_id = rid()
    d = core.admit(0.0, "  ", "", 300, request_id).decision
    assert d.verdict is Verdict.PLACED and d.replica is None and d.session_id == ""
    assert core.bind_request(request_id, R10)
    (row,) = core.replica_stats(0.0)
    assert (row.used_tokens, row.passthrough_requests) == (400, 1)
    core.complete(1.0, "", request_id, R10, 300, 20)
    assert core.replica_stats(1.0)[0].used_tokens == 0


def test_band_edges_at_threshold_pause():
    core = make_core({("1", 0): 1000})
    place_acting(core, "p", 850, ("1", 0))  # used exactly 950 = 0.95
    assert core.replica_stats(0.0)[0].band is Band.PAUSE


def test_the_debug_line_of_each_pause_and_resume_is_rendered_from_its_event():
    from services.scheduler.core import ProgramEvent

    events = [
        ProgramEvent(EventKind.PAUSED, "a", ReplicaKey("w1", 0), 800, 1.0, "pressure"),
        ProgramEvent(EventKind.MARKED, "b", ReplicaKey("w1", 0), 900, 1.0, "pressure"),
        ProgramEvent(EventKind.RESUMED, "a", ReplicaKey("w2", 1), 800, 2.0),
        ProgramEvent(EventKind.FORCED_RESUME, "c", None, 50, 3.0),
    ]
    assert [(r.level, r.message) for r in transition_logs(events)] == [
        (10, "Paused program a (tokens=800)"),
        (10, "Resumed program a -> worker=w2 (tokens=800)"),
        (10, "Resumed program c -> worker=any (tokens=50)"),
    ]
