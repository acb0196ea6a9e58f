"""core/defaults.py is the one table of the service's control defaults: the flags read theirs from it, and
service_control_params (what the offline simulator runs) is what load_config gives with no flags."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.scheduler.config import CONTROL_SETTINGS, load_config
from services.scheduler.core.defaults import (
    CONTROL_DEFAULTS,
    REFERENCE_BANDS,
    SERVICE_DEFAULT_PAUSE_POLICY,
    policy_control_defaults,
    service_control_params,
)
from services.scheduler.core.params import ControlParams
from services.scheduler.core.policies import PAUSE_POLICIES


def test_every_control_flag_defaults_from_the_table_or_from_the_policy():
    defaults = {s.name: s.default for s in CONTROL_SETTINGS}
    policy_defaulted = {name for name, default in defaults.items() if default is None}
    assert policy_defaulted == set(REFERENCE_BANDS) == set(policy_control_defaults("cost_aware"))
    assert {name: d for name, d in defaults.items() if d is not None} == CONTROL_DEFAULTS


@pytest.mark.parametrize("policy", sorted(PAUSE_POLICIES))
def test_service_control_params_is_the_service_with_no_flags(policy):
    assert service_control_params(policy) == load_config(["--pause-policy", policy], {}).control


def test_overrides_apply_and_move_the_program_aware_bands_with_the_threshold():
    assert service_control_params() == load_config([], {}).control
    assert load_config([], {}).pause_policy == SERVICE_DEFAULT_PAUSE_POLICY
    params = service_control_params("cost_aware", pause_threshold=0.9, resume_aging_seconds=0.0)
    assert params == load_config(["--pause-threshold", "0.9", "--resume-aging-seconds", "0"], {}).control
    assert params.pause_target == pytest.approx(0.85)


@pytest.mark.parametrize(
    "argv, calibrate, discount",
    [
        ([], True, 60.0),
        (["--pause-policy", "threshold"], False, 0.0),
        (
            ["--pause-policy", "threshold", "--calibrate-token-estimates", "--resume-wait-discount-seconds", "30"],
            True,
            30.0,
        ),
        (["--no-calibrate-token-estimates", "--resume-wait-discount-seconds", "0"], False, 0.0),
    ],
)
def test_program_aware_switches_are_on_except_in_the_reference(argv, calibrate, discount):
    reference = ControlParams()
    assert not reference.calibrate_token_estimates and reference.resume_wait_discount_seconds == 0.0
    control = load_config(argv, {}).control
    assert control.calibrate_token_estimates is calibrate
    assert control.resume_wait_discount_seconds == discount


def test_a_negative_resume_discount_refuses_to_start():
    with pytest.raises(ConfigError, match="resume_wait_discount_seconds >= 0"):
        load_config(["--resume-wait-discount-seconds", "-5"], {})
