"""The pause margin measured from growth (ControlParams.pause_margin_quantile): where a pause cycle stops."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.scheduler.core import ControlParams, ReplicaKey
from services.scheduler.core.control import GROWTH_WINDOW_SAMPLES as WINDOW
from services.scheduler.core.defaults import service_control_params

from .helpers import make_core, place_acting, place_reasoning, snapshot

A = ("1", 0)
BUDGET = 10_000_000_000  # tokens: room for a window of growth
BANDS = dict(pause_threshold=1.0, pause_target=0.9, soft_demote_threshold=0.9, resume_hysteresis=0.0)


def grow(core, sid: str, tokens: int, now: float) -> None:
    """The acting program `sid` takes a turn that adds `tokens` to its context (on replica A)."""
    program = core.ledger.programs[sid]
    place_acting(core, sid, program.token_total + tokens, A, now)


def warm(core, ticks: int, growth_per_tick: int, now: float = 0.0) -> float:
    """`ticks` ticks with `growth_per_tick` tokens of growth between each pair (program "g" grows)."""
    for _ in range(ticks):
        now += 1.0
        grow(core, "g", growth_per_tick, now)
        core.tick(now)
    return now


def test_without_a_quantile_the_target_is_the_configured_one():
    core = make_core({A: BUDGET}, **BANDS)
    place_acting(core, "g", 1_000, A)
    warm(core, 40, 500)
    assert core.control.pause_margin is None
    assert core.control.pause_target_fraction() == pytest.approx(0.9)


def test_the_margin_is_a_quantile_of_the_growth_between_ticks():
    core = make_core({A: BUDGET}, pause_margin_quantile=0.9, **BANDS)
    place_acting(core, "g", 1_000, A)
    core.tick(0.0)
    assert core.control.pause_margin is None  # no growth measured yet: the configured target
    warm(core, WINDOW, 2_000_000)
    assert core.control.pause_margin == pytest.approx(0.0002)
    assert core.control.pause_target_fraction() == pytest.approx(0.9998)


def test_until_the_window_is_full_the_configured_target_holds():
    core = make_core({A: BUDGET}, pause_margin_quantile=0.9, **BANDS)
    place_acting(core, "g", 1_000, A)
    core.tick(0.0)
    warm(core, WINDOW - 1, 2_000_000)
    assert core.control.pause_margin is None
    assert core.control.pause_target_fraction() == pytest.approx(0.9)


def test_the_margin_is_never_deeper_than_the_pause_target():
    core = make_core({A: 1_000_000}, pause_margin_quantile=0.9, **BANDS)
    core.tick(0.0)
    buffer = core.params.buffer_per_program_tokens
    for i in range(WINDOW):  # a new program of a fifth of the budget between ticks
        place_acting(core, f"n{i}", 200_000 - buffer, A, float(i))
        core.tick(float(i) + 0.5)  # pauses what is over the threshold
    assert core.control.pause_margin == pytest.approx(0.2)
    assert core.control.pause_target_fraction() == pytest.approx(0.9)


def test_a_working_set_that_does_not_grow_gives_no_margin():
    core = make_core({A: BUDGET}, pause_margin_quantile=1.0, **BANDS)
    for i in range(10):
        place_acting(core, f"p{i}", 1_000, A)
    core.tick(0.0)
    for i in range(WINDOW):
        if i < 10:
            core.release(float(i + 1), f"p{i}")  # shrinks, then stays
        core.tick(float(i + 1))
    assert core.control.pause_margin == 0.0
    assert core.control.pause_target_fraction() == pytest.approx(1.0)


def test_the_window_forgets_old_growth():
    core = make_core({A: BUDGET}, pause_margin_quantile=1.0, **BANDS)
    place_acting(core, "g", 1_000, A)
    core.tick(0.0)
    now = warm(core, WINDOW, 5_000_000)
    assert core.control.pause_margin == pytest.approx(0.0005)
    now = warm(core, WINDOW - 1, 100_000, now)
    assert core.control.pause_margin == pytest.approx(0.0005)  # one sample of the old growth is left
    warm(core, 1, 100_000, now)
    assert core.control.pause_margin == pytest.approx(0.00001)


def pause_count(quantile: float) -> int:
    """Pauses when a replica crosses the threshold by one program after ticks of little growth."""
    core = make_core({A: 1_000_000}, pause_margin_quantile=quantile, **BANDS)
    for i in range(99):
        place_acting(core, f"p{i}", 9_000, A)  # 99 x (9,000 + buffer): under the budget
    place_acting(core, "g", 1_000, A)
    core.tick(0.0)
    now = warm(core, WINDOW, 10)
    assert core.tick(now + 1.0).paused == 0
    place_acting(core, "big", 100_000, A, now + 1.0)  # over the threshold by 0.7%
    return core.tick(now + 2.0).paused


def test_a_measured_margin_sheds_what_the_crossing_needs_not_the_configured_band():
    assert pause_count(0.0) == 13  # down to 0.9: the 0.7% over and a tenth of the budget
    assert pause_count(0.9) == 2  # the 0.7% over and the margin (0.001%): the growing one and one more


def test_the_margin_only_moves_the_token_target_not_the_count_target():
    core = make_core(pause_margin_quantile=0.9, **BANDS)
    core.apply_capacity(0.0, snapshot({A: BUDGET}, max_programs={A: 10}))
    place_acting(core, "g", 1_000, A)
    core.tick(0.0)
    warm(core, WINDOW, 100)
    assert core.control.pause_target_fraction() > 0.99
    for i in range(11):
        place_reasoning(core, f"r{i}", 100, A)
    result = core.tick(100.0)
    assert result.marked == 2  # 11 in flight against a count target of 0.9 x 10 = 9


def test_the_program_aware_defaults_measure_the_margin_and_the_reference_does_not():
    assert service_control_params("cost_aware").pause_margin_quantile == 1.0
    assert service_control_params("threshold").pause_margin_quantile == 0.0
    assert ControlParams().pause_margin_quantile == 0.0


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_a_quantile_outside_0_1_is_refused_naming_the_rule(value):
    with pytest.raises(ConfigError) as err:
        ControlParams(pause_margin_quantile=value)
    assert err.value.field == "pause_margin_quantile"


def test_removed_replicas_leave_no_sample():
    core = make_core({A: BUDGET, ("2", 0): BUDGET}, pause_margin_quantile=0.9, **BANDS)
    place_acting(core, "g", 1_000, A)
    core.tick(0.0)
    core.apply_capacity(0.5, snapshot({A: BUDGET}, version=2))
    warm(core, WINDOW, 1_000_000)
    assert ReplicaKey("2", 0) not in core.ledger.caps
    assert core.control.pause_margin == pytest.approx(0.0001)
