"""Token-estimate calibration: a REASONING program is charged the router's estimate scaled by what
the workers report, so the bands measure what the engines hold (ours; off in the reference)."""

from __future__ import annotations

import pytest

from services.scheduler.config import load_config
from services.scheduler.core import ControlParams, ReplicaKey, TurnOutcome
from services.scheduler.core.calibration import MAX_RATIO, PRIOR_TOKENS, EstimateCalibration
from tests.unit.scheduler.helpers import make_core, rid

W = ("w", 0)


def test_the_prior_is_the_estimate_itself():
    cal = EstimateCalibration()
    assert cal.ratio == 1.0
    assert cal.apply(10_000) == 10_000
    assert cal.apply(0) == 0, "0 means no estimate and stays so"


def test_learns_the_ratio_of_reported_to_estimated_tokens():
    cal = EstimateCalibration()
    for _ in range(100):
        cal.observe(40_000, 32_000)  # the router's chars/4 over-counts by 25%
    assert cal.ratio == pytest.approx(0.8, abs=0.002)
    assert cal.apply(50_000) == pytest.approx(40_000, abs=100)
    assert cal.observations == 100


def test_the_prior_weighs_in_only_until_tokens_are_seen():
    cal = EstimateCalibration()
    cal.observe(1_000, 2_000)
    assert 1.0 < cal.ratio < 1.1, f"one small turn barely moves it (prior {PRIOR_TOKENS:.0f} tokens)"


def test_follows_a_change_of_workload():
    cal = EstimateCalibration()
    for _ in range(300):
        cal.observe(10_000, 8_000)
    for _ in range(1_000):
        cal.observe(10_000, 12_000)
    assert cal.ratio == pytest.approx(1.2, rel=0.015)


@pytest.mark.parametrize("estimate, reported", [(0, 5_000), (5_000, 0), (-1, 10), (10, -1)])
def test_turns_without_both_counts_teach_nothing(estimate, reported):
    cal = EstimateCalibration()
    cal.observe(estimate, reported)
    assert cal.observations == 0 and cal.ratio == 1.0


def test_one_broken_report_cannot_blow_the_working_set_up_or_wipe_it_out():
    high, low = EstimateCalibration(), EstimateCalibration()
    high.observe(10, 10**12)
    low.observe(10**12, 1)
    assert high.ratio == MAX_RATIO and low.ratio == 1.0 / MAX_RATIO
    assert low.apply(1) == 1, "a known prompt is never charged 0"


def _turns(core, sid: str, n: int, estimate: int, reported: int, outcome=TurnOutcome.OK) -> None:
    for _ in range(n):
        request_id = rid()
        core.admit(0.0, sid, "", estimate, request_id)
        core.complete(0.0, sid, request_id, ReplicaKey(*W), reported, 100, outcome=outcome)


def test_the_core_charges_calibrated_estimates_when_asked():
    core = make_core({W: 1_000_000}, calibrate_token_estimates=True)
    _turns(core, "a", 50, estimate=20_000, reported=16_000)
    request_id = rid()
    core.admit(0.0, "b", "", 25_000, request_id)
    assert core.program("b").token_total == pytest.approx(20_000, rel=0.01)
    assert (
        core.stats(0.0).replicas[0].used_tokens
        == core.program("b").token_total + core.program("a").token_total + 2 * core.params.buffer_per_program_tokens
    )
    core.ledger.check_invariants(0.0)


def test_the_reference_charges_the_estimate_as_sent():
    assert ControlParams().calibrate_token_estimates is False
    core = make_core({W: 1_000_000})
    _turns(core, "a", 50, estimate=20_000, reported=16_000)
    core.admit(0.0, "b", "", 25_000, rid())
    assert core.program("b").token_total == 25_000


def test_failed_turns_teach_nothing():
    core = make_core({W: 1_000_000}, calibrate_token_estimates=True)
    _turns(core, "a", 50, estimate=20_000, reported=1, outcome=TurnOutcome.FAILED)
    assert core.calibration.observations == 0


def test_passthrough_requests_are_charged_calibrated_estimates():
    core = make_core({W: 1_000_000}, calibrate_token_estimates=True)
    _turns(core, "a", 50, estimate=20_000, reported=16_000)
    request_id = rid()
    core.admit(0.0, "", "", 10_000, request_id)
    assert core.ledger.passthrough[request_id].tokens == pytest.approx(8_000, rel=0.01)


def test_the_environment_sets_it_too():
    env = {"BANDMASTER_SCHEDULER_CALIBRATE_TOKEN_ESTIMATES": "false"}
    assert load_config([], env).control.calibrate_token_estimates is False
