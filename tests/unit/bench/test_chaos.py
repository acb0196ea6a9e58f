"""bench/chaos.py: the seeded fault schedule and the invariant checks over made-up recorded events."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench import chaos
from bench.chaos import ACTIONS, FULL, QUICK, Fault, FaultRecord, ProgramOutcome, RequestRecord
from services.common.settings.errors import ConfigError

INSTANCES = {"simworker": 3, "capacity": 1, "scheduler": 1, "router": 2, "planner": 1, "redis": 1}


def _schedule(seed: int, **kw) -> list[Fault]:
    args = dict(first_s=10.0, gap_s=(10.0, 25.0), freeze_s=(1.0, 8.0), down_s=(0.5, 4.0))
    args.update(kw)
    return chaos.fault_schedule(seed, kw.pop("duration_s", 600.0), INSTANCES, **args)


# ------------------------------------------------------------------------------ the schedule


def test_the_schedule_is_a_function_of_the_seed():
    assert _schedule(3) == _schedule(3)
    assert _schedule(3) != _schedule(4)


@pytest.mark.parametrize("seed", range(5))
def test_a_full_schedule_holds_every_kind_and_action_first_and_stays_in_bounds(seed):
    faults = _schedule(seed)
    pairs = {(k, a) for k in INSTANCES for a in ACTIONS}
    assert {(f.kind, f.action) for f in faults[: len(pairs)]} == pairs  # each pair once, first
    assert all(f.at_s < 600.0 for f in faults)
    times = [f.at_s for f in faults]
    assert times == sorted(times) and times[0] == 10.0
    for before, after in zip(faults, faults[1:]):
        assert 10.0 <= after.at_s - before.at_s - before.hold_s <= 25.0 + 0.01  # the gap after the hold
    for f in faults:
        bounds = {"freeze": (1.0, 8.0), "kill": (0.5, 4.0), "restart": (0.0, 0.0)}[f.action]
        assert bounds[0] <= f.hold_s <= bounds[1]
        assert 0 <= f.instance < INSTANCES[f.kind]


def test_a_counted_schedule_holds_the_must_pairs_first():
    faults = _schedule(7, count=5, must=(("scheduler", "kill"), ("router", "kill")))
    assert len(faults) == 5
    assert [(f.kind, f.action) for f in faults[:2]] == [("scheduler", "kill"), ("router", "kill")]
    assert len({(f.kind, f.action) for f in faults}) == 5


def test_targets_name_the_instance_of_kinds_that_have_several():
    assert Fault(0, "router", "kill", 1, 1.0).target == "router-1"
    assert Fault(0, "simworker", "kill", 2, 1.0).target == "simworker-2"
    assert Fault(0, "scheduler", "kill", 0, 1.0).target == "scheduler"


def test_the_configs_are_valid_and_refuse_a_timeout_shorter_than_a_freeze():
    assert QUICK.duration_s < FULL.duration_s
    with pytest.raises(ConfigError, match="turn_timeout_s"):
        chaos.ChaosConfig(freeze_s=(1.0, 30.0), turn_timeout_s=35.0)


# ------------------------------------------------------------------------------ the checks


def _req(program="p", turn=0, outcome="ok", start=1.0, end=2.0, status=200, attempt=0) -> RequestRecord:
    return RequestRecord(program, turn, attempt, start, end, status, outcome)


def _fault(kind: str, action: str, injected: float, answering: float | None) -> FaultRecord:
    fault = Fault(injected, kind, action, 0, 1.0)
    return FaultRecord(fault, injected, resumed_s=injected + 1.0, answering_s=answering, back_s=answering)


def test_clean_endings_pass_and_a_silent_cut_an_empty_stream_and_a_timeout_do_not():
    clean = [
        _req(outcome="ok"),
        _req(outcome="error_event"),
        _req(outcome="http_error", status=503),
        _req(outcome="transport_before_headers", status=0),
    ]
    assert chaos.check_streams(clean, []) == []
    bad = [_req(outcome="silent_cut"), _req(outcome="empty"), _req(outcome="http_error_unclean", status=500)]
    bad.append(_req(outcome="timeout", start=1.0, end=61.0))
    kinds = [(v["invariant"], v["kind"]) for v in chaos.check_streams(bad, [])]
    assert kinds == [
        ("streams", "stream_silent_cut"),
        ("streams", "stream_empty"),
        ("streams", "stream_http_error_unclean"),
        ("waits", "wait_over_bound"),
    ]


def test_a_connection_lost_mid_stream_is_allowed_only_in_a_router_kill_or_restart_window():
    lost = _req(outcome="transport_after_headers", start=10.0, end=11.0)
    assert chaos.check_streams([lost], [_fault("router", "kill", 10.5, 13.0)]) == []
    assert chaos.check_streams([lost], [_fault("router", "restart", 9.0, 10.2)]) == []
    assert len(chaos.check_streams([lost], [_fault("router", "freeze", 10.5, 13.0)])) == 1
    assert len(chaos.check_streams([lost], [_fault("simworker", "kill", 10.5, 13.0)])) == 1
    assert len(chaos.check_streams([lost], [_fault("router", "kill", 20.0, 23.0)])) == 1


def _program(pid="p", known=True, turns=2) -> ProgramOutcome:
    return ProgramOutcome(pid, 2, 2, True, None, turns if known else None, known)


def test_scheduler_turns_equal_to_the_started_turns_pass():
    requests = [_req(turn=0), _req(turn=1, start=3, end=4), _req(turn=-1, outcome="ok")]
    violations, counts = chaos.check_turns([_program(turns=2)], requests, [])
    assert violations == [] and counts == {
        "programs_compared": 1,
        "turns_excused_fail_open": 0,
        "attempts_cut_by_router_faults": 0,
    }


def test_a_refused_attempt_is_not_a_started_turn_and_an_error_event_is():
    requests = [
        _req(turn=0, outcome="http_error", status=503),  # never started: rolled back by the router
        _req(turn=0, attempt=1, outcome="error_event"),  # started, failed mid-stream: counted
        _req(turn=0, attempt=2),
        _req(turn=1, start=3, end=4),
    ]
    assert chaos.check_turns([_program(turns=3)], requests, [])[0] == []
    assert chaos.check_turns([_program(turns=2)], requests, [])[0][0]["kind"] == "missing_turns"


def test_a_phantom_turn_is_always_a_violation():
    requests = [_req(turn=0), _req(turn=1, start=3, end=4)]
    faults = [_fault("scheduler", "kill", 1.0, 3.0)]
    (violation,) = chaos.check_turns([_program(turns=3)], requests, faults)[0]
    assert violation["kind"] == "phantom_turns" and violation["scheduler_turns"] == 3


def test_a_missing_turn_is_excused_only_in_a_scheduler_fault_window():
    requests = [_req(turn=0, start=1, end=2), _req(turn=1, start=20, end=21)]
    inside = [_fault("scheduler", "kill", 1.5, 3.0)]
    violations, counts = chaos.check_turns([_program(turns=1)], requests, inside)
    assert violations == [] and counts["turns_excused_fail_open"] == 1
    # The window reaches back by the store's flush interval, forward by the routers' fail-open bounds.
    assert chaos.check_turns([_program(turns=1)], requests, [_fault("scheduler", "kill", 2.3, 4.0)])[0] == []
    assert chaos.check_turns([_program(turns=1)], requests, [_fault("scheduler", "kill", 50.0, 51.0)])[0]
    assert chaos.check_turns([_program(turns=1)], requests, [_fault("router", "kill", 1.5, 3.0)])[0]
    # One excusable turn excuses one missing, not two.
    (violation,) = chaos.check_turns([_program(turns=0)], requests, inside)[0]
    assert violation["kind"] == "missing_turns" and violation["excusable_fail_open"] == 1


def test_an_attempt_a_router_fault_cut_after_its_headers_may_be_counted_or_not():
    """The router died between the client's first bytes and its delivery report: either count is right for
    that attempt (the client retried the turn), and only for it."""
    requests = [
        _req(turn=0, start=1, end=2),
        _req(turn=1, start=10, end=10.5, outcome="transport_after_headers"),
        _req(turn=1, attempt=1, start=11, end=12),
    ]
    kill = [_fault("router", "kill", 10.2, 11.0)]
    for counted in (2, 3):
        violations, counts = chaos.check_turns([_program(turns=counted)], requests, kill)
        assert violations == [] and counts["attempts_cut_by_router_faults"] == 1
    assert chaos.check_turns([_program(turns=1)], requests, kill)[0][0]["kind"] == "missing_turns"
    assert chaos.check_turns([_program(turns=4)], requests, kill)[0][0]["kind"] == "phantom_turns"
    # Cut outside a router's kill or restart: the turn must be counted.
    for other in ([_fault("router", "freeze", 10.2, 11.0)], [_fault("router", "kill", 30.0, 31.0)]):
        assert chaos.check_turns([_program(turns=2)], requests, other)[0][0]["kind"] == "missing_turns"


def test_a_turn_started_on_a_cached_admission_is_excused_by_a_fault_while_its_admit_is_on_its_way():
    """The fast path: the router starts the turn on its cached admission and sends the Admit in the
    background, so a scheduler fault shortly after the client's end can still leave the turn uncounted."""
    cached = replace(_req(turn=1, start=10, end=10.5), admission="cached")
    admitted = replace(cached, admission="admitted")
    requests = [_req(turn=0, start=1, end=2)]
    fault = [_fault("scheduler", "freeze", 14.0, 16.0)]  # 3.5 s after the turn's end
    violations, counts = chaos.check_turns([_program(turns=1)], [*requests, cached], fault)
    assert violations == [] and counts["turns_excused_fail_open"] == 1
    assert chaos.check_turns([_program(turns=1)], [*requests, admitted], fault)[0][0]["kind"] == "missing_turns"
    # Past the background Admit's bound, a fault no longer excuses it.
    late = [_fault("scheduler", "freeze", 10.5 + chaos.DISPATCHED_SETTLE_S + 1.0, 30.0)]
    assert chaos.check_turns([_program(turns=1)], [*requests, cached], late)[0][0]["kind"] == "missing_turns"


def test_an_observed_scheduler_outage_excuses_like_a_scheduler_fault():
    """A Redis outage deposes the leader: the watcher's outage excuses the turns routed fail open meanwhile."""
    requests = [_req(turn=0, start=1, end=2), _req(turn=1, start=20, end=21)]
    redis = [_fault("redis", "kill", 19.0, 20.5)]
    assert chaos.check_turns([_program(turns=1)], requests, redis)[0]
    assert chaos.check_turns([_program(turns=1)], requests, redis, outages=[(19.5, 20.2)])[0] == []


def test_under_leader_election_a_redis_fault_excuses_like_a_scheduler_fault():
    """The leader refuses what its store does not take (UNAVAILABLE) while it still leads and serves: the
    watcher sees no outage, the routers fail open all the same."""
    requests = [_req(turn=0, start=1, end=2), _req(turn=1, start=20, end=21)]
    redis = [_fault("redis", "kill", 19.0, 20.5)]
    assert chaos.check_turns([_program(turns=1)], requests, redis)[0]  # one scheduler: it serves on
    assert chaos.check_turns([_program(turns=1)], requests, redis, store_decides=True)[0] == []
    assert chaos.check_turns([_program(turns=3)], requests, redis, store_decides=True)[0][0]["kind"] == "phantom_turns"


def test_a_program_the_scheduler_no_longer_knows_is_lost_unless_every_turn_was_excusable():
    requests = [_req(turn=0, start=1, end=2), _req(turn=1, start=20, end=21)]
    (violation,) = chaos.check_turns([_program(known=False)], requests, [])[0]
    assert violation["invariant"] == "lost" and violation["kind"] == "program_unknown"
    everything = [_fault("scheduler", "freeze", 0.5, 22.0)]
    assert chaos.check_turns([_program(known=False)], requests, everything)[0] == []


def test_programs_lost_or_unchecked():
    given_up = ProgramOutcome("a", 3, 1, False, gave_up_turn=1)
    unfinished = ProgramOutcome("b", 3, 2, False)
    unanswered = ProgramOutcome("c", 3, 3, True, scheduler_known=None)
    fine = _program("d")
    kinds = [(v["invariant"], v["kind"]) for v in chaos.check_programs([given_up, unfinished, unanswered, fine], QUICK)]
    assert kinds == [
        ("lost", "turn_not_done_within_retry_budget"),
        ("lost", "unfinished_after_drain"),
        ("waits", "scheduler_lookup_unanswered"),
    ]


def test_every_custom_id_exactly_once_over_output_and_error_files():
    ids = ["r0", "r1", "r2"]
    assert chaos.check_batch({"status": "completed", "output_ids": ["r0", "r2"], "error_ids": ["r1"]}, ids) == []
    bad = {"status": "completed", "output_ids": ["r0", "r1", "r1"], "error_ids": ["r1", "x"]}
    found = {v["kind"]: v["ids"] for v in chaos.check_batch(bad, ids)}
    assert found == {"batch_missing_ids": ["r2"], "batch_duplicate_ids": ["r1"], "batch_unknown_ids": ["x"]}
    assert chaos.check_batch({"status": "in_progress"}, ids)[0]["kind"] == "batch_not_completed"
    assert chaos.check_batch(None, ids)[0]["kind"] == "batch_not_submitted"
    assert chaos.check_batch(None, []) == []


def test_a_process_that_never_answers_again_is_a_wait_over_its_bound():
    faults = [_fault("planner", "kill", 5.0, 7.0), _fault("redis", "freeze", 9.0, None)]
    (violation,) = chaos.check_recovery(faults, QUICK)
    assert violation["target"] == "redis" and violation["kind"] == "not_answering_after_fault"


def test_a_standby_taking_over_does_not_excuse_the_faulted_replica_staying_down_or_a_slow_stop():
    failed_over = _fault("scheduler", "restart", 5.0, 7.0)
    failed_over.back_s = None
    (violation,) = chaos.check_recovery([failed_over], QUICK)
    assert violation["kind"] == "not_answering_after_fault" and "faulted process" in violation["detail"]
    slow_stop = _fault("scheduler", "restart", 5.0, 7.0)
    slow_stop.stop_overran = True
    (violation,) = chaos.check_recovery([slow_stop], QUICK)
    assert violation["kind"] == "stop_over_bound" and violation["bound_s"] == QUICK.stop_timeout_s


def test_recovery_figures():
    fault = _fault("scheduler", "kill", 10.0, 12.5)
    requests = [
        _req(turn=0, start=9.0, end=10.5),  # started before the injection: not the next one
        _req(turn=1, start=10.2, end=14.0, outcome="error_event"),
        _req(turn=2, start=11.0, end=13.25),
        _req(turn=3, start=12.0, end=16.0),
    ]
    assert chaos.next_ok_turn_s(fault, requests) == 3.25
    (row,) = chaos.fault_rows([fault], requests)
    assert row["service_answering_s"] == 2.5 and row["next_ok_turn_s"] == 3.25
    assert row["failed_requests_in_window"] == {"error_event": 1}
    summary = chaos.recovery_summary([row, {**row, "service_answering_s": 4.5, "next_ok_turn_s": None}])
    assert summary == {
        "scheduler/kill": {
            "faults": 2,
            "service_answering_s": {"median": 3.5, "max": 4.5},
            "next_ok_turn_s": {"median": 3.25, "max": 3.25},
        }
    }


@pytest.mark.parametrize(
    "text, clean",
    [
        ('{"error": {"message": "no worker", "type": "server_error"}}', True),
        ('{"error": "plain"}', False),
        ("<html>502</html>", False),
        ("[]", False),
    ],
)
def test_an_openai_style_error_body(text, clean):
    assert chaos.classify_error_body(text) is clean


def test_the_invariant_table_names_every_invariant():
    table = chaos.invariant_table([{"invariant": "turns"}, {"invariant": "turns"}])
    assert {row["name"]: (row["violations"], row["status"]) for row in table} == {
        "lost": (0, "PASS"),
        "turns": (2, "MISS"),
        "streams": (0, "PASS"),
        "batch": (0, "PASS"),
        "waits": (0, "PASS"),
    }


def test_the_error_summary_groups_failed_attempts_by_what_they_said_and_when():
    requests = [
        _req(outcome="http_error", status=503, start=12.0, end=12.1),
        _req(outcome="http_error", status=503, start=15.0, end=15.1),
        _req(outcome="error_event", start=31.0, end=32.0),
        _req(outcome="ok", start=40.0, end=41.0),
    ]
    requests[0].error = requests[1].error = "HTTP 503: no healthy worker"
    assert chaos.error_summary(requests) == {
        "by_kind": {"http_error 503 HTTP 503: no healthy worker": 2, "error_event 200": 1},
        "by_10s_from": {"10": 2, "30": 1},
    }


def test_only_keeps_the_named_faults():
    faults = _schedule(1, only=("scheduler/freeze", "redis"))
    assert faults and {(f.kind, f.action) for f in faults} <= {("scheduler", "freeze")} | {
        ("redis", a) for a in ACTIONS
    }
    assert {f.kind for f in faults} == {"scheduler", "redis"}


def test_only_refuses_a_fault_that_is_not_one():
    with pytest.raises(ConfigError, match="only"):
        chaos.ChaosConfig(only=("scheduler/nap",))
    with pytest.raises(ConfigError, match="none of these faults"):
        chaos.fault_schedule(
            1,
            600.0,
            {"simworker": 1},
            first_s=10.0,
            gap_s=(10.0, 25.0),
            freeze_s=(1.0, 8.0),
            down_s=(0.5, 4.0),
            only=("scheduler/freeze",),
        )


async def test_the_watcher_takes_a_change_of_leader_between_samples_for_an_outage():
    """A failover quicker than the sampling (no sample finds no leader) is an outage all the same."""
    import asyncio
    import time

    class Stack:
        terms = iter([3, 3, 4, 4, None, None, 5, 5])

        async def scheduler_term(self):
            try:
                return next(self.terms)
            except StopIteration:
                await asyncio.sleep(3600)

    watch = chaos.SchedulerWatch(Stack(), time.monotonic())
    task = asyncio.create_task(watch.run())
    await asyncio.sleep(1.2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(watch.outages) == 2  # the 3 -> 4 change, then the interval with no leader
    (a_start, a_end), (b_start, b_end) = watch.outages
    assert 0.05 <= a_end - a_start <= 0.6 and a_end <= b_start and b_end - b_start >= 0.15


def test_a_dropped_tickets_lapse_waits_one_lease_more_for_each_takeover_within_it():
    """A new leader restores every running ticket with a fresh lease: the look-up of a program whose turn a
    router dropped must wait for that lease too (seed 0 --quick: the count read before the rollback)."""
    lease = chaos.TICKET_LEASE_S + 2.0
    assert chaos.dropped_ticket_lapse(9.0, []) == 9.0 + lease
    assert chaos.dropped_ticket_lapse(9.0, [(2.0, 4.0)]) == 9.0 + lease  # over before the drop
    assert chaos.dropped_ticket_lapse(9.0, [(15.0, 17.0)]) == 17.0 + lease
    chained = [(15.0, 17.0), (17.0 + lease - 1.0, 17.0 + lease + 1.0)]
    assert chaos.dropped_ticket_lapse(9.0, chained) == 17.0 + 2 * lease + 1.0
    assert chaos.dropped_ticket_lapse(9.0, [(9.0 + lease + 1.0, 30.0)]) == 9.0 + lease  # after it lapsed
