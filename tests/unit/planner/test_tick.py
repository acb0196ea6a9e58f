"""The pure tick: every fail-closed rule of reference §3.7 that lives in the core, provenance,
start-up evidence windows, min/max and budgets applied last."""

import dataclasses

import pytest

from services.planner.core.scaling import LoadScalingConfig, ProgramScalingConfig, ThroughputScalingConfig
from services.planner.core.throughput import EngineRate
from services.planner.core.tick import Budgets, TickSettings, TickState, decide
from services.planner.core.types import Opinion, ProgramSignal, ReplicaLoad, Stage, TargetKind
from tests.unit.planner.helpers import NOW, cfg, inventory, job, obs, traffic

OFF = dict(load=LoadScalingConfig(enabled=False), programs=ProgramScalingConfig(enabled=False))


def settings(**kw) -> TickSettings:
    batch_kw = {k: kw.pop(k) for k in list(kw) if k in {f.name for f in dataclasses.fields(cfg())}}
    base = dict(batch=cfg(**batch_kw), **OFF)
    base.update(kw)
    return TickSettings(**base)


def run(o, s=None, state=None, **kw):
    return decide(o, s or settings(), state or TickState(), "d-7", **kw)


# --- fail-closed rules, one row each: (rule, observation, settings kwargs, decide kwargs, reason) ---

FAIL_CLOSED = [
    ("1 job snapshot missing", dict(jobs=None), {}, {}, "policy_safety_pause"),
    ("2 capacity unknown", dict(inv=None), {}, {}, "policy_safety_pause"),
    ("2 unverified rollout", dict(inv=inventory(4, None, scaling=True)), {}, {}, "policy_safety_pause"),
    ("3 traffic missing", dict(traffic_=None), {}, {}, "policy_safety_pause"),
    ("3 traffic stale", dict(traffic_=traffic(age_s=120)), {}, {}, "policy_safety_pause"),
    ("4 job stale", dict(jobs=[job(age_s=120)]), {}, {}, "policy_safety_pause"),
    ("4 wrong work class", dict(jobs=[job(work_class="x")]), {}, {}, "policy_safety_pause"),
    ("7 pipeline failure", {}, {}, dict(pipeline_error="pipeline_failed"), "pipeline_failed"),
    ("7 tick timeout", {}, {}, dict(pipeline_error="tick_timeout"), "tick_timeout"),
    (
        "8 GPU budget below floor",
        dict(jobs=[job(remaining=2000)]),
        dict(budgets=Budgets(max_gpu_budget=4)),
        {},
        "floor_blocked_by_budget",
    ),
    (
        "8 power budget below floor",
        dict(jobs=[job(remaining=2000)]),
        dict(budgets=Budgets(watts_per_replica=700, total_power_limit_w=7000)),
        {},
        "floor_blocked_by_budget",
    ),
    ("9 stale at publication", {}, {}, dict(now_s=NOW + 61), "policy_safety_pause"),
]


@pytest.mark.parametrize("rule, o_kw, s_kw, d_kw, reason", FAIL_CLOSED, ids=[r[0] for r in FAIL_CLOSED])
def test_fail_closed_rules_publish_a_zero_lease(rule, o_kw, s_kw, d_kw, reason):
    d, _ = run(obs(**o_kw), settings(**s_kw), **d_kw)
    assert d.lease.max_admission_rps == 0.0
    assert reason in d.fail_closed
    assert d.lease.decision_id == "d-7" and d.lease.duration_s == 15.0


def test_the_healthy_case_publishes_a_positive_lease():
    d, _ = run(obs())
    assert d.lease.max_admission_rps == 10.0 and d.fail_closed == ()


@pytest.mark.parametrize("error", ["pipeline_failed", "tick_timeout"])
def test_pipeline_failure_also_suppresses_scaling(error):
    d, _ = run(obs(jobs=[job(remaining=2000)]), pipeline_error=error)
    assert d.scale_to is None and d.lease.max_admission_rps == 0


def test_rule5_no_active_jobs_is_cap_zero_but_not_a_failure():
    d, _ = run(obs([]))
    assert d.lease.max_admission_rps == 0 and d.fail_closed == ()


def test_rule6_configured_zero_cap_pauses_without_failure():
    d, _ = run(obs(), settings(max_batch_admission_rps=0.0))
    assert d.lease.max_admission_rps == 0 and d.fail_closed == ()


def test_rule8_budget_clamp_to_a_no_op_still_pauses():
    # ready 10 = budget 10 < floor 11: the budget clamps the target to the current count (no scaling).
    d, _ = run(obs([job(remaining=2000)]), settings(budgets=Budgets(max_gpu_budget=10)))
    assert d.scale_to is None and d.lease.max_admission_rps == 0 and "floor_blocked_by_budget" in d.fail_closed


def test_rule13_positive_cap_never_exceeds_ready_headroom():
    d, _ = run(obs([job(remaining=3000)], traffic_=traffic(80.0)))
    assert d.scale_to == 11 and d.lease.max_admission_rps == 10 * 10 - 80  # the floor rises, admission does not
    d, _ = run(obs([job(remaining=2000)], traffic_=traffic(80.0), inv=inventory(1, None, scaling=True, pending=9)))
    assert d.lease.max_admission_rps == 0  # pending replicas give no headroom


def test_proposer_exception_is_a_pipeline_failure(monkeypatch):
    import services.planner.core.tick as tick

    def boom(*a, **k):
        raise RuntimeError("bug")

    monkeypatch.setattr(tick, "load_proposal", boom)
    d, _ = run(obs())
    assert d.lease.max_admission_rps == 0 and "pipeline_failed" in d.fail_closed and d.scale_to is None


def test_a_reject_short_circuits_scaling_and_the_lease(monkeypatch):
    import services.planner.core.tick as tick

    reject = Opinion("load", Stage.PROPOSE, TargetKind.REJECT, None, "operator veto")
    monkeypatch.setattr(tick, "load_proposal", lambda *a: (reject, "veto"))
    d, _ = run(obs(jobs=[job(remaining=2000)]))
    assert d.action == "skip_short_circuit" and d.scale_to is None and d.lease.max_admission_rps == 0
    assert "merge_rejected" in d.fail_closed


# --- floor, idle target, provenance ---


def test_batch_floor_raises_the_target_with_reconcile_provenance():
    d, _ = run(obs([job(remaining=2000)]))
    assert d.scale_to == 11
    step = [s for s in d.steps if s.source == "native_batch_policy"]
    assert step and step[0].stage is Stage.RECONCILE and step[0].effect == "raised_to_floor"
    assert d.lease.max_admission_rps == 10.0


def test_floor_merges_after_a_plugin_proposal():
    loads = tuple(ReplicaLoad(f"w{i}", 1, 0, 0.1) for i in range(2))
    s = settings(load=LoadScalingConfig(enabled=True), programs=ProgramScalingConfig(enabled=False))
    d, _ = run(obs([job(remaining=40, due_in_s=None)], traffic_=traffic(30.0), inv=inventory(2), loads=loads), s)
    # load proposes 1 (scale down), the batch floor (ceil((30+?)/10)) wins.
    assert d.scale_to is None or d.scale_to >= d.plan.replica_floor
    assert any(s.source == "native_batch_policy" for s in d.steps)


def test_floor_does_not_cancel_a_larger_rollout_and_repairs_a_downscale():
    d, _ = run(obs([job(remaining=2000)], inv=inventory(10, 15)))
    assert d.scale_to is None  # expected 15 >= floor 11: no-op
    d, _ = run(obs([job(remaining=2000)], inv=inventory(10, 5)))
    assert d.scale_to == 11


def test_idle_target_is_an_exact_set_that_may_scale_down():
    d, _ = run(obs([], traffic_=traffic(0.0, active=0), inv=inventory(5)), settings(min_replicas=1))
    assert d.scale_to == 1 and d.lease.max_admission_rps == 0
    assert any(s.source == "native_batch_idle_target" and s.effect == "set" for s in d.steps)
    d, _ = run(obs([], traffic_=traffic(0.0, active=0), inv=inventory(1)), settings(min_replicas=1))
    assert d.scale_to is None  # already there


def test_scale_from_zero():
    d, _ = run(obs(traffic_=traffic(0.0), inv=inventory(0)), settings(min_replicas=0))
    assert d.scale_to == 1 and d.lease.max_admission_rps == 0


def test_min_and_max_replicas():
    d, _ = run(obs([job(remaining=5000)]), settings(max_replicas=12))
    assert d.scale_to == 12
    d, _ = run(obs([], inv=inventory(0)), settings(min_replicas=2))
    assert d.scale_to == 2


def test_budgets_are_applied_last_with_constrain_provenance():
    d, _ = run(obs([job(remaining=2000)]), settings(budgets=Budgets(gpus_per_replica=2, max_gpu_budget=16)))
    # The budget (8 replicas) is the final authority over the floor (11): scale to 8, admission paused.
    assert d.scale_to == 8 and d.lease.max_admission_rps == 0 and "floor_blocked_by_budget" in d.fail_closed
    capped = [s for s in d.steps if s.source == "native_gpu_budget"]
    assert capped[0].stage is Stage.CONSTRAIN and capped[0].effect == "capped_to_ceiling"


def test_budget_scale_down_is_actuated_when_no_floor_is_in_the_way():
    d, _ = run(obs([]), settings(budgets=Budgets(max_gpu_budget=6)))
    assert d.scale_to == 6 and d.lease.max_admission_rps == 0


# --- start-up evidence window ---


def _startup_obs(**kw):
    return obs([], traffic_=traffic(0.0, active=0), inv=inventory(1, None, scaling=True, pending=3), **kw)


def test_startup_is_not_cut_without_an_explicit_fresh_proposal():
    d, _ = run(_startup_obs(), settings(min_replicas=0))
    assert d.scale_to is None


def test_startup_reduction_needs_sustained_explicit_evidence(monkeypatch):
    import services.planner.core.tick as tick

    down = Opinion("load", Stage.PROPOSE, TargetKind.SET, 1, "scale_down", priority=10)
    monkeypatch.setattr(tick, "load_proposal", lambda *a: (down, "scale_down"))
    s = settings(min_replicas=0, startup_reduction_window_s=30)
    d, st = run(_startup_obs(), s)
    assert d.scale_to is None and d.action == "startup_window_started"
    d, st = decide(_startup_obs(), s, st, "d-8", now_s=NOW + 10)
    assert d.scale_to is None and d.action == "startup_window_pending"
    d, st = decide(_startup_obs(), s, st, "d-9", now_s=NOW + 31)
    assert d.scale_to == 1 and d.action == "startup_reduction"


def test_startup_window_restarts_when_inventory_or_floor_changes(monkeypatch):
    import services.planner.core.tick as tick

    down = Opinion("load", Stage.PROPOSE, TargetKind.SET, 1, "scale_down", priority=10)
    monkeypatch.setattr(tick, "load_proposal", lambda *a: (down, "scale_down"))
    s = settings(min_replicas=0, startup_reduction_window_s=30)
    _, st = run(_startup_obs(), s)
    changed = obs([], traffic_=traffic(0.0, active=0), inv=inventory(2, None, scaling=True, pending=2))
    d, st = decide(changed, s, st, "d-8", now_s=NOW + 31)
    assert d.scale_to is None and d.action == "startup_window_started"


def test_replayed_throughput_bound_is_not_startup_evidence():
    s = settings(
        min_replicas=0,
        throughput=ThroughputScalingConfig(enabled=True, interval_s=60, as_lower_bound=False),
        engine=EngineRate(100.0, 8, 10.0),
    )
    o = obs([], traffic_=traffic(50.0, active=0), inv=inventory(1, None, scaling=True, pending=3))
    d, st = run(o, s)  # evaluated: SET 1 (fresh) starts the window
    assert d.reasons["throughput"] == "set_lower_bound" or d.reasons["throughput"] == "scale"
    d, st = decide(o, s, st, "d-8", now_s=NOW + 40)  # replayed: not explicit, window cleared
    assert d.reasons["throughput"] == "replayed" and d.scale_to is None and d.action == "startup_hold"


def test_startup_floor_above_desired_raises_and_keeps_ready_only_lease():
    o = obs([job(remaining=2000)], inv=inventory(1, None, scaling=True, pending=1))
    d, _ = run(o)
    assert d.scale_to == 11  # raised to the floor
    assert d.lease.max_admission_rps == 0  # O=90 > ready 1 * 10: no headroom on ready replicas


# --- program-aware and load proposals inside the tick ---


def test_paused_programs_propose_scale_up_with_propose_provenance():
    s = settings(programs=ProgramScalingConfig(enabled=True, pause_window_s=30), load=LoadScalingConfig(enabled=False))
    sig = ProgramSignal(NOW, paused_programs=2, longest_pause_s=45.0, utilization=0.9, replicas=4)
    d, _ = run(obs([], inv=inventory(4), programs=sig), s)
    assert d.scale_to == 5
    assert any(x.source == "programs" and x.stage is Stage.PROPOSE and x.effect == "set" for x in d.steps)
