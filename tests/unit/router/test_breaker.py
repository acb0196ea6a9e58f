"""The circuit breaker's state machine on an injected clock."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.router.core.breaker import BreakerParams, CircuitBreaker, CircuitState, TransitionReason

CLOSED, OPEN, HALF = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN


def test_opens_after_threshold_consecutive_failures_and_a_success_resets_the_count():
    b = CircuitBreaker(BreakerParams(failure_threshold=3, open_s=5, max_open_s=60))
    assert b.on_failure(0) is None and b.on_failure(1) is None
    assert b.on_success(2) is None and b.failures == 0  # not consecutive any more
    assert b.on_failure(3) is None and b.on_failure(4) is None
    t = b.on_failure(5)
    assert (t.old, t.new, t.reason, t.open_s, t.failures) == (CLOSED, OPEN, TransitionReason.FAILURES, 5, 3)
    assert not b.available(5) and not b.available(9.99) and b.retry_after(7) == pytest.approx(3)


def test_one_probe_after_the_open_time_then_closed_on_success():
    b = CircuitBreaker(BreakerParams(failure_threshold=1, open_s=5, max_open_s=60))
    b.on_failure(0)
    assert b.available(5)
    assert b.on_dispatch(5).new is HALF  # this call is the probe
    assert not b.available(5) and not b.available(100)  # one probe at a time
    t = b.on_success(6)
    assert (t.old, t.new, t.reason) == (HALF, CLOSED, TransitionReason.PROBE_OK)
    assert b.available(6) and b.failures == 0
    assert b.on_dispatch(6) is None  # closed: dispatches change nothing


def test_failed_probes_double_the_open_time_up_to_the_cap_and_success_resets_it():
    b = CircuitBreaker(BreakerParams(failure_threshold=1, open_s=5, max_open_s=15))
    b.on_failure(0)
    now, opens = 0.0, []
    for _ in range(4):
        now += b.retry_after(now)
        b.on_dispatch(now)
        t = b.on_failure(now)
        assert t.reason is TransitionReason.PROBE_FAILED and t.new is OPEN
        opens.append(t.open_s)
    assert opens == [10, 15, 15, 15]
    now += 15
    b.on_dispatch(now)
    b.on_success(now)
    assert b.on_failure(now).open_s == 5  # back to the first open time


def test_abandoned_probe_is_due_again_at_once():
    b = CircuitBreaker(BreakerParams(failure_threshold=1, open_s=5, max_open_s=60))
    b.on_failure(0)
    b.on_dispatch(5)
    t = b.on_abandon(6)
    assert (t.new, t.reason, t.open_s) == (OPEN, TransitionReason.PROBE_ABANDONED, 0)
    assert b.available(6) and b.on_dispatch(6).new is HALF


def test_results_of_calls_dispatched_before_it_opened_change_nothing():
    b = CircuitBreaker(BreakerParams(failure_threshold=1, open_s=5, max_open_s=60))
    b.on_failure(0)
    assert b.on_failure(1) is None and b.on_success(1) is None and b.on_abandon(1) is None
    assert b.state is OPEN and b.retry_after(1) == pytest.approx(4)


def test_threshold_zero_never_opens():
    b = CircuitBreaker(BreakerParams(failure_threshold=0))
    for t in range(100):
        assert b.on_failure(t) is None
    assert b.available(100)


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        ({"failure_threshold": -1}, "failure_threshold >= 0"),
        ({"open_s": 0}, "open_s > 0"),
        ({"open_s": 10, "max_open_s": 5}, "max_open_s >= open_s"),
    ],
)
def test_invalid_params_name_the_rule(kwargs, rule):
    with pytest.raises(ConfigError, match=rule):
        BreakerParams(**kwargs)
