"""The one retry policy: exponential waits with a cap and jitter, within the caller's deadline; bounded
attempts; only what is retryable is retried, and cancellation never is."""

from __future__ import annotations

import asyncio

import pytest

from services.common.outbound.retry import Backoff, RetryPolicy, retrying
from services.common.settings.errors import ConfigError


@pytest.mark.parametrize(
    "policy, waits",
    [
        (RetryPolicy(0.2, 2.0), [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]),
        (RetryPolicy(0.2, 5.0), [0.2, 0.4, 0.8, 1.6, 3.2, 5.0]),
        (RetryPolicy(0.1, multiplier=1.0), [0.1] * 6),
        (RetryPolicy(0.0, max_attempts=3), [0.0] * 6),
        (RetryPolicy(1.0, 60.0, multiplier=3.0), [1.0, 3.0, 9.0, 27.0, 60.0, 60.0]),
    ],
)
def test_the_waits_grow_to_the_cap(policy, waits):
    assert [round(policy.delay_s(n), 9) for n in range(1, 7)] == waits


def test_a_very_long_outage_stays_at_the_cap():
    assert RetryPolicy(0.2, 5.0).delay_s(100_000) == 5.0


def test_jitter_shortens_a_wait_by_at_most_its_share():
    policy = RetryPolicy(1.0, 8.0, jitter=0.5)
    assert policy.delay_s(3, rand=lambda: 0.0) == 4.0
    assert policy.delay_s(3, rand=lambda: 1.0) == 2.0
    assert all(0.5 <= policy.delay_s(1) <= 1.0 for _ in range(200))


def test_no_wait_passes_the_deadline():
    policy = RetryPolicy(0.2, 2.0)
    assert policy.delay_s(4, remaining_s=0.5) == 0.5
    assert policy.delay_s(4, remaining_s=-3.0) == 0.0


def test_backoff_counts_consecutive_failures_and_resets():
    backoff = Backoff(RetryPolicy(0.2, 5.0))
    assert [backoff.failed() for _ in range(3)] == [0.2, 0.4, 0.8]
    backoff.reset()
    assert backoff.failed() == 0.2 and backoff.failures == 1


@pytest.mark.parametrize(
    "field, kwargs",
    [
        ("first_delay_s", {"first_delay_s": -1.0}),
        ("max_delay_s", {"first_delay_s": 2.0, "max_delay_s": 1.0}),
        ("multiplier", {"first_delay_s": 1.0, "multiplier": 0.5}),
        ("jitter", {"first_delay_s": 1.0, "jitter": 1.5}),
        ("max_attempts", {"first_delay_s": 1.0, "max_attempts": 0}),
    ],
)
def test_an_invalid_policy_names_its_field(field, kwargs):
    with pytest.raises(ConfigError) as err:
        RetryPolicy(**kwargs)
    assert err.value.field == field


class Flaky:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


async def _no_sleep(_: float) -> None:
    return None


async def test_retrying_retries_what_is_retryable_within_the_attempts():
    call, seen = Flaky([OSError("a"), OSError("b")]), []
    policy = RetryPolicy(0.1, 1.0, max_attempts=3, retry_on=(OSError,))
    result = await retrying(call, policy, on_retry=lambda e, n, d: seen.append((str(e), n, d)), sleep=_no_sleep)
    assert result == "ok" and call.calls == 3
    assert seen == [("a", 1, 0.1), ("b", 2, 0.2)]


async def test_retrying_raises_the_last_failure_once_the_attempts_are_spent():
    call = Flaky([OSError("1"), OSError("2"), OSError("3")])
    with pytest.raises(OSError, match="2"):
        await retrying(call, RetryPolicy(0.0, max_attempts=2, retry_on=(OSError,)), sleep=_no_sleep)
    assert call.calls == 2


async def test_retrying_raises_what_is_not_retryable_at_once():
    call = Flaky([ValueError("no")])
    with pytest.raises(ValueError):
        await retrying(call, RetryPolicy(0.0, max_attempts=5, retry_on=(OSError,)), sleep=_no_sleep)
    status = type("Status", (Exception,), {})
    conflict, gone = status("409"), status("404")
    conflict.status, gone.status = 409, 404
    call = Flaky([conflict, gone])
    policy = RetryPolicy(0.0, max_attempts=5, retry_on=(status,), retry_if=lambda e: e.status == 409)
    with pytest.raises(status, match="404"):
        await retrying(call, policy, sleep=_no_sleep)
    assert call.calls == 2


async def test_retrying_never_retries_a_cancellation():
    call = Flaky([asyncio.CancelledError()])
    with pytest.raises(asyncio.CancelledError):
        await retrying(call, RetryPolicy(0.0, retry_on=(BaseException,)), sleep=_no_sleep)
    assert call.calls == 1
