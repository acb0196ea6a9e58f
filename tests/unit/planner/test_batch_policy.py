"""The batch policy's table (reference §7.1), with S=10 rps/replica, min 1, max 20, ready 10, O=90."""

import math

import pytest

from services.planner.core.batch_policy import plan_batch_schedule
from tests.unit.planner.helpers import WALL, cfg, feedback, inventory, job, obs, traffic


def plan(o, **kw):
    return plan_batch_schedule(o, cfg(**kw), "d-1")


def test_work_conserving_headroom_drives_leased_drain_cap():
    p = plan(obs())
    d = p.diagnostics
    assert (p.replica_floor, p.max_admission_rps, p.decision_id, p.lease_duration_s) == (10, 10.0, "d-1", 15.0)
    assert d.required_batch_rps == pytest.approx(6.0)
    assert d.predicted_finish_wall_s == pytest.approx(WALL + 60)
    assert d.minimum_deadline_slack_s == pytest.approx(40)
    assert not d.infeasible and not d.safety_paused


def test_optional_batch_cap_limits_drain_and_predicted_finish():
    p = plan(obs(), max_batch_admission_rps=8.0)
    assert p.max_admission_rps == 8.0
    assert p.diagnostics.predicted_finish_wall_s == pytest.approx(WALL + 75)
    assert p.diagnostics.minimum_deadline_slack_s == pytest.approx(25)


def test_edf_uses_cumulative_work_across_multiple_deadlines():
    o = obs([job("a", 500, 50), job("b", 1000, 100)], traffic_=traffic(0.0), inv=inventory(2))
    p = plan(o, max_batch_admission_rps=30.0)
    assert p.diagnostics.required_batch_rps == pytest.approx(15.0)  # max(500/50, 1500/100)
    assert p.diagnostics.required_replica_floor == 2
    assert p.replica_floor == 2 and p.max_admission_rps == 20.0


def test_deadline_required_rps_scales_the_absolute_replica_floor():
    p = plan(obs([job(remaining=2000)]))
    assert p.diagnostics.required_batch_rps == pytest.approx(20)
    assert p.replica_floor == 11
    assert p.max_admission_rps == 10.0  # today's headroom only
    assert p.diagnostics.planned_batch_capacity_rps == pytest.approx(20)


def test_cold_start_and_finalization_margins_reduce_deadline_window():
    p = plan(obs([job(remaining=600, due_in_s=100)]), cold_start_margin_s=30, finalization_margin_s=10)
    assert p.diagnostics.required_batch_rps == pytest.approx(10)
    assert p.replica_floor == 10
    assert p.diagnostics.predicted_finish_wall_s == pytest.approx(WALL + 70)


def test_replica_ceiling_surfaces_infeasible_deadline_but_drains_safely():
    p = plan(obs([job(remaining=2000)]), max_replicas=10)
    assert p.replica_floor == 10 and p.max_admission_rps == 10.0
    assert "required_replica_floor_exceeds_max_replicas" in p.diagnostics.infeasible_reasons
    assert "negative_deadline_slack" in p.diagnostics.infeasible_reasons
    assert p.diagnostics.minimum_deadline_slack_s == pytest.approx(-100)


def test_batch_cap_below_required_rate_is_diagnosed_infeasible():
    p = plan(obs([job(remaining=1000)]), max_batch_admission_rps=5.0)
    assert "batch_cap_below_required_rps" in p.diagnostics.infeasible_reasons
    assert p.max_admission_rps == 5.0


def test_zero_batch_cap_is_an_explicit_pause_with_fresh_inputs():
    p = plan(obs(), max_batch_admission_rps=0.0)
    assert p.max_admission_rps == 0.0 and not p.diagnostics.safety_paused


def test_zero_batch_cap_does_not_bootstrap_scale_from_zero():
    p = plan(obs(inv=inventory(0), traffic_=traffic(0.0)), max_batch_admission_rps=0.0, min_replicas=0)
    assert p.replica_floor == 0 and p.max_admission_rps == 0.0


def test_exhausted_deadline_window_uses_max_floor_and_reports_infinite_rate():
    p = plan(obs([job(due_in_s=-5)]))
    assert p.replica_floor == 20 and math.isinf(p.diagnostics.required_batch_rps)
    assert "deadline_window_exhausted:job-a" in p.diagnostics.infeasible_reasons


def test_stale_online_traffic_pauses_drain_and_holds_ready_floor():
    p = plan(obs(traffic_=traffic(age_s=61), inv=inventory(7)))
    assert (p.replica_floor, p.max_admission_rps, p.diagnostics.safety_paused) == (7, 0.0, True)
    assert "online_traffic_observation_stale_or_invalid" in p.diagnostics.infeasible_reasons


def test_future_observation_is_stale():
    p = plan(obs(traffic_=traffic(age_s=-1)))
    assert p.max_admission_rps == 0.0 and p.diagnostics.safety_paused


def test_missing_capacity_pauses_drain_without_a_scaling_opinion():
    p = plan(obs(inv=None))
    assert (p.replica_floor, p.max_admission_rps) == (None, 0.0)
    assert "capacity_observation_missing_or_invalid" in p.diagnostics.infeasible_reasons


def test_rollout_uses_expected_floor_and_conservative_ready_capacity():
    p = plan(obs([job(remaining=600, due_in_s=100)], traffic_=traffic(0.0), inv=inventory(1, 4, scaling=True)))
    assert p.diagnostics.current_safe_headroom_rps == pytest.approx(10)  # ready 1 only
    assert p.max_admission_rps == 10.0
    assert p.replica_floor == 1  # the absolute need; the rollout to 4 is not cancelled by it
    assert p.diagnostics.desired_replicas == 4


def test_verified_startup_uses_ready_plus_pending_floor_and_ready_capacity():
    p = plan(
        obs([job(remaining=100, due_in_s=None)], traffic_=traffic(0.0), inv=inventory(1, None, scaling=True, pending=3))
    )
    assert not p.diagnostics.capacity_stale
    assert p.diagnostics.desired_replicas == 4
    assert p.max_admission_rps == 10.0


def test_verified_startup_safety_pause_holds_ready_plus_pending_desired():
    p = plan(obs(traffic_=None, inv=inventory(1, None, scaling=True, pending=3)))
    assert p.replica_floor == 4 and p.max_admission_rps == 0.0


def test_rollout_with_unknown_expected_target_pauses_without_scaling_opinion():
    p = plan(obs(inv=inventory(2, None, scaling=True)))
    assert p.replica_floor is None and p.max_admission_rps == 0.0 and p.diagnostics.safety_paused


def test_missing_batch_snapshot_pauses_and_holds_ready_floor():
    p = plan(obs(None, inv=inventory(7)))
    assert (p.replica_floor, p.max_admission_rps) == (7, 0.0)
    assert p.diagnostics.infeasible_reasons == ("batch_observation_missing",)


def test_fresh_active_job_bootstraps_zero_pool_while_missing_traffic_pauses_drain():
    p = plan(obs(traffic_=None, inv=inventory(0)), min_replicas=0)
    assert (p.replica_floor, p.max_admission_rps, p.diagnostics.safety_paused) == (1, 0.0, True)


def test_explicit_zero_traffic_is_fresh_and_still_bootstraps_zero_pool():
    p = plan(obs(traffic_=traffic(0.0), inv=inventory(0)), min_replicas=0)
    assert (p.replica_floor, p.max_admission_rps, p.diagnostics.safety_paused) == (1, 0.0, False)


def test_missing_traffic_without_active_jobs_does_not_bootstrap_zero_pool():
    p = plan(obs([], traffic_=None, inv=inventory(0)), min_replicas=0)
    assert (p.replica_floor, p.max_admission_rps, p.diagnostics.safety_paused) == (None, 0.0, False)


@pytest.mark.parametrize("min_replicas", [0, 1, 3])
def test_authoritatively_idle_pool_emits_exact_configured_warm_target(min_replicas):
    p = plan(obs([], traffic_=traffic(0.0, active=0), inv=inventory(5)), min_replicas=min_replicas)
    assert (p.replica_floor, p.idle_replica_target, p.max_admission_rps) == (None, min_replicas, 0.0)


@pytest.mark.parametrize(
    "change",
    [
        dict(traffic_=traffic(1.0, active=0)),
        dict(traffic_=traffic(0.0, active=2)),
        dict(traffic_=traffic(0.0, active=None)),
        dict(traffic_=None),
        dict(traffic_=traffic(0.0, active=0, age_s=61)),
        dict(feedback_=None),
        dict(feedback_=feedback(age_s=61)),
        dict(feedback_=feedback(queued=1)),
        dict(feedback_=feedback(inflight=1)),
        dict(inv=None),
        dict(inv=inventory(5, None, scaling=True)),
        dict(inv=inventory(5, 6)),
        dict(inv=inventory(4, None, scaling=True, pending=1)),
    ],
)
def test_idle_target_is_withheld_until_every_idle_signal_is_authoritative(change):
    kw = dict(traffic_=traffic(0.0, active=0), inv=inventory(5))
    kw.update(change)
    p = plan(obs([], **kw))
    assert p.idle_replica_target is None and p.max_admission_rps == 0.0


def test_busy_or_unknown_batch_state_without_jobs_holds_the_current_count():
    assert plan(obs([], feedback_=feedback(queued=3), inv=inventory(5))).replica_floor == 5
    assert plan(obs([], feedback_=None, inv=inventory(5, 6))).replica_floor == 6
    assert plan(obs([], feedback_=feedback(age_s=61), inv=inventory(5))).replica_floor == 5


def test_drained_batch_with_online_traffic_leaves_online_scaling_to_the_scalers():
    # Deviation from the reference (documented): no hold floor once batch work is authoritatively drained.
    assert plan(obs([], traffic_=traffic(50.0), inv=inventory(5))).replica_floor is None


def test_active_batch_job_never_emits_idle_replica_target():
    assert plan(obs(traffic_=traffic(0.0, active=0))).idle_replica_target is None


def test_empty_job_snapshot_is_neutral_despite_online_load_and_missing_capacity():
    p = plan(obs([], inv=None))
    assert (p.replica_floor, p.max_admission_rps, p.diagnostics.safety_paused) == (None, 0.0, False)


def test_stale_active_job_does_not_bootstrap_zero_pool():
    p = plan(obs([job(age_s=61)], traffic_=traffic(0.0), inv=inventory(0)), min_replicas=0)
    assert p.replica_floor == 0 and p.diagnostics.job_stale


def test_missing_traffic_holds_nonzero_ready_pool_without_extra_bootstrap():
    p = plan(obs(traffic_=None, inv=inventory(2)), min_replicas=0)
    assert p.replica_floor == 2 and p.diagnostics.required_replica_floor is None


def test_stale_active_job_pauses_drain_and_holds_ready_floor():
    p = plan(obs([job(age_s=61)], inv=inventory(7)))
    assert (p.replica_floor, p.max_admission_rps) == (7, 0.0)


def test_work_class_mismatch_pauses_and_holds_clipped_ready_floor():
    p = plan(obs([job(work_class="embeddings")], inv=inventory(25)))
    assert (p.replica_floor, p.max_admission_rps) == (20, 0.0)
    assert "work_class_mismatch:job-a:embeddings" in p.diagnostics.infeasible_reasons


def test_latest_raw_job_counters_win_and_terminal_jobs_do_not_add_demand():
    old = job("a", 600, 100, age_s=5)
    new = job("a", 300, 100)
    done = job("b", 0, 100, status="completed", total=500, completed=500)
    p = plan(obs([old, new, done]))
    assert p.diagnostics.required_batch_rps == pytest.approx(3.0)
    assert p.diagnostics.active_job_count == 1


def test_dispatcher_feedback_is_diagnostic_and_freshness_is_explicit():
    p = plan(obs(feedback_=feedback(11, 4, age_s=2, rps=2.5, cap=6.0)))
    d = p.diagnostics
    assert (d.actual_dispatch_rps, d.applied_max_admission_rps, d.dispatcher_age_s) == (2.5, 6.0, 2.0)
    assert p.max_admission_rps == 10.0


def test_best_effort_drain_keeps_a_floor_that_can_sustain_it():
    p = plan(obs([job(due_in_s=None)]))
    assert p.diagnostics.required_batch_rps == 0 and p.diagnostics.required_replica_floor == 9
    assert p.replica_floor == 10 and p.max_admission_rps == 10.0
    assert 90 + p.max_admission_rps <= p.replica_floor * 10


def test_drain_is_clipped_when_replica_ceiling_cannot_sustain_headroom():
    p = plan(obs([job(due_in_s=None)]), max_replicas=9)
    assert p.replica_floor == 9 and p.diagnostics.planned_batch_capacity_rps == 0 and p.max_admission_rps == 0


@pytest.mark.parametrize(
    "bad",
    [
        dict(safe_rps_per_ready_replica=0),
        dict(safe_rps_per_ready_replica=math.inf),
        dict(cold_start_margin_s=-1),
        dict(finalization_margin_s=math.nan),
        dict(drain_lease_duration_s=0),
        dict(min_replicas=-1),
        dict(min_replicas=5, max_replicas=4),
        dict(scale_from_zero_replicas=0),
        dict(scale_from_zero_replicas=30),
        dict(max_batch_admission_rps=-1),
    ],
)
def test_config_rejects_unsafe_values(bad):
    with pytest.raises(ValueError):
        cfg(**bad)


def test_decision_id_is_required():
    with pytest.raises(ValueError):
        plan_batch_schedule(obs(), cfg(), "")
