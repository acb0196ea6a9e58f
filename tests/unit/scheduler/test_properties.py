"""Property tests of the scheduler core's invariants under random operation sequences."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.scheduler.core import EventKind, ReplicaKey, SchedulerCore, Status, TurnOutcome, Verdict
from services.scheduler.core.params import ControlParams
from tests.unit.scheduler.helpers import snapshot

SIDS = [f"p{i}" for i in range(8)]
REPLICAS = [ReplicaKey("w1", 0), ReplicaKey("w1", 1), ReplicaKey("w2", 0)]

op = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from(SIDS + [""]), st.integers(-5, 3000)),
    st.tuples(st.just("complete"), st.integers(0, 50), st.integers(-5, 3000)),
    st.tuples(st.just("cancel"), st.integers(0, 50), st.just(0)),
    st.tuples(st.just("bind"), st.integers(0, 50), st.integers(0, 2)),
    st.tuples(st.just("release"), st.sampled_from(SIDS), st.just(0)),
    st.tuples(st.just("tick"), st.integers(0, 3), st.just(0)),
)

params_strategy = st.builds(
    lambda p, t, h, w: ControlParams(
        pause_threshold=p,
        pause_target=min(t, p),
        resume_hysteresis=min(h, p),
        soft_demote_threshold=min(0.8, p),
        acting_token_weight=w,
        program_idle_ttl_seconds=60.0,
        resume_timeout_seconds=1e9,
    ),
    st.floats(0.5, 1.0),
    st.floats(0.3, 1.0),
    st.floats(0.0, 0.3),
    st.sampled_from([0.5, 1.0, 2.0]),
)


def state(core: SchedulerCore):
    return (
        core.programs(),
        core.paused_ids(),
        tuple((s.replica, s.used_tokens, s.resident_programs) for s in core.replica_stats(0.0)),
    )


def run(core: SchedulerCore, ops, check):
    now = 0.0
    requests: list[tuple[str, str]] = []
    caps = {(r.worker_id, r.dp_rank): 4000 for r in REPLICAS}
    core.tick(now, snapshot(caps))
    for kind, a, b in ops:
        now += 0.7
        if kind == "admit":
            request_id = f"r{len(requests)}"
            before = state(core)
            result = core.admit(now, a, "", b, request_id)
            requests.append((request_id, a))
            check("admit", core, now, result, before)
        elif kind == "complete" and requests:
            request_id, sid = requests[a % len(requests)]
            core.complete(now, sid, request_id, REPLICAS[b % 3] if b % 2 else None, b, b // 3, outcome=TurnOutcome.OK)
        elif kind == "cancel" and requests:
            request_id, _ = requests[a % len(requests)]
            core.cancel_admission(now, request_id)
        elif kind == "bind" and requests:
            core.bind_request(requests[a % len(requests)][0], REPLICAS[b])
        elif kind == "release":
            core.release(now, a)
            check("release", core, now, a, None)
        elif kind == "tick":
            now += a * 10.0
            if a == 3:  # a replica leaves and comes back smaller
                core.tick(now, snapshot({k: v for k, v in caps.items() if k != ("w2", 0)}, version=2))
                caps[("w2", 0)] = 2000
            result = core.tick(now, snapshot(caps, version=3))
            check("tick", core, now, result, None)
        core.ledger.check_invariants(now)


def check_all(kind, core, now, result, before):
    p = core.params
    if kind == "release":
        sid = result
        assert core.program(sid) is None and sid not in core.paused_ids()
        assert all(sid not in v.children for v in core.programs())
        assert all(core.ledger.turns[r].session_id != sid for r in core.waiting_request_ids())
    if kind == "admit" and result.decision.verdict is Verdict.WAIT:
        assert core.program(result.decision.session_id).replica is None
    if kind == "tick":
        target = min(p.pause_target, p.pause_threshold)
        stats = {s.replica: s for s in core.replica_stats(now)}
        for rec in result.logs:
            if rec.message.startswith("scheduler.tick worker="):
                worker, rank = rec.message.split()[1][7:], int(rec.message.split()[2][8:])
                key = ReplicaKey(worker, rank)
                acting = [v for v in core.programs() if v.replica == key and v.status is Status.ACTING]
                assert stats[key].utilization <= target + 1e-9 or not acting
        resumed_on = {e.replica for e in result.events if e.kind is EventKind.RESUMED}
        for key in resumed_on:
            row = stats[key]
            assert row.used_tokens < row.retention_tokens * p.pause_threshold
            slack = row.resident_programs + 1  # the O(1) decayed sum floors per replica, not per program
            assert row.used_decayed_tokens <= math.floor(row.retention_tokens * p.resume_ceiling) + slack


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params_strategy, st.lists(op, max_size=40))
def test_invariants_hold_under_random_operations(params, ops):
    run(SchedulerCore(params), ops, check_all)


@settings(max_examples=60, deadline=None)
@given(params_strategy, st.lists(op, max_size=30), st.sampled_from(SIDS + [""]), st.integers(0, 5000))
def test_cancelled_admission_leaves_the_table_as_it_found_it(params, ops, sid, tokens):
    core = SchedulerCore(params)
    run(core, ops, lambda *a: None)
    before = state(core)
    core.admit(1e4, sid, "parent" if sid else "", tokens, "the-one")
    core.cancel_admission(1e4, "the-one")
    assert state(core) == before
    core.ledger.check_invariants(1e4)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=40), st.floats(0.5, 1.0), st.floats(0.1, 1.0))
def test_pause_cycle_reaches_target_unless_nothing_acting_is_left(sizes, threshold, target):
    target = min(target, threshold)
    core = SchedulerCore(
        ControlParams(
            pause_threshold=threshold,
            pause_target=target,
            soft_demote_threshold=min(0.8, threshold),
            resume_hysteresis=0.0,
        )
    )
    core.apply_capacity(0.0, snapshot({("w", 0): 10**9}))
    for i, tokens in enumerate(sizes):
        request_id = f"r{i}"
        core.admit(0.0, f"p{i}", "", tokens, request_id)
        core.complete(0.0, f"p{i}", request_id, None, tokens, 0)
    core.apply_capacity(0.0, snapshot({("w", 0): max(1, sum(sizes) // 2)}))
    core.tick(0.5)
    (row,) = core.replica_stats(0.5)
    acting_left = [v for v in core.programs() if v.replica is not None and v.status is Status.ACTING]
    assert row.utilization <= target + 1e-9 or not acting_left
    core.ledger.check_invariants(0.5)
