"""The one retry policy: how long a loop waits after a failure, how often it tries, what it retries.

A `RetryPolicy` is exponential backoff with a cap and jitter: the wait after the n-th consecutive failure
is `first_delay_s * multiplier**(n-1)`, at most `max_delay_s`, shortened at random by up to `jitter` of
itself (so that many clients that lost one server do not come back in step), and never past the
caller's deadline (`remaining_s`). `multiplier=1` is a fixed pause. `max_attempts` bounds the tries
(None: the caller bounds the loop by a deadline or by cancelling it: every wait stays bounded either
way, so a hanging dependency cannot hang the fleet). `retry_on` says what is retryable.

    backoff = Backoff(POLICY)                   # a reconnect loop: reset after every success
    await asyncio.sleep(backoff.failed())       # after a failure

    result = await retrying(call, POLICY, on_retry=lambda exc, failures, delay_s: log.warning(...))

The policy is pure (the random source is injectable); `retrying` is the async loop over it.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

from services.common.settings.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    first_delay_s: float
    """The wait after the first failure (0: retry at once)."""
    max_delay_s: float | None = None
    """Cap on any one wait; None: `first_delay_s` (with `multiplier=1`, a fixed pause)."""
    multiplier: float = 2.0
    """Each further consecutive failure multiplies the wait by this (1: a fixed pause)."""
    jitter: float = 0.0
    """Each wait is drawn from [(1 - jitter) * delay, delay]; 0: exactly the delay."""
    max_attempts: int | None = None
    """Tries in all (the first included); None: bounded by the caller's deadline or cancellation."""
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    """The exceptions worth another try; any other is raised at once."""
    retry_if: Callable[[BaseException], bool] | None = None
    """A further test of a `retry_on` exception (an HTTP 409, say); None: every one is retryable."""

    def __post_init__(self) -> None:
        if not self.first_delay_s >= 0:
            raise ConfigError("first_delay_s", self.first_delay_s, "must be >= 0")
        if self.max_delay_s is not None and not self.max_delay_s >= self.first_delay_s:
            raise ConfigError("max_delay_s", self.max_delay_s, "must be >= first_delay_s")
        if not self.multiplier >= 1:
            raise ConfigError("multiplier", self.multiplier, "must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ConfigError("jitter", self.jitter, "must be in [0, 1]")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ConfigError("max_attempts", self.max_attempts, "must be >= 1")

    def delay_s(
        self, failures: int, *, remaining_s: float | None = None, rand: Callable[[], float] = random.random
    ) -> float:
        """The wait after the `failures`-th consecutive failure (1 for the first), within `remaining_s`."""
        cap = self.first_delay_s if self.max_delay_s is None else self.max_delay_s
        delay, growth = self.first_delay_s, failures - 1
        # Stop growing at the cap: no float overflow and no long loop however long the outage.
        while growth > 0 and 0 < delay < cap and self.multiplier > 1:
            delay *= self.multiplier
            growth -= 1
        delay = min(delay, cap)
        if self.jitter:
            delay *= 1.0 - self.jitter * rand()
        if remaining_s is not None:
            delay = min(delay, max(0.0, remaining_s))
        return delay

    def retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, self.retry_on) and (self.retry_if is None or self.retry_if(exc))

    def may_try_again(self, failures: int) -> bool:
        """Whether another try follows `failures` failed ones (the attempt bound only)."""
        return self.max_attempts is None or failures < self.max_attempts


class Backoff:
    """One loop's consecutive failures under a policy: `failed()` gives the next wait, `reset()` after a
    success starts again from `first_delay_s`."""

    def __init__(self, policy: RetryPolicy, rand: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self.failures = 0
        self._rand = rand

    def failed(self, remaining_s: float | None = None) -> float:
        self.failures += 1
        return self.policy.delay_s(self.failures, remaining_s=remaining_s, rand=self._rand)

    def reset(self) -> None:
        self.failures = 0


async def retrying(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    on_retry: Callable[[BaseException, int, float], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`await call()` until it returns; a retryable failure is retried after the policy's wait while the
    policy allows another try (`on_retry(exc, failures, delay_s)` first: the caller's log line); the last
    failure, or one that is not retryable, is raised as it is. Cancellation is never retried."""
    backoff = Backoff(policy)
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if not policy.retryable(exc) or not policy.may_try_again(backoff.failures + 1):
                raise
            delay_s = backoff.failed()
            if on_retry is not None:
                on_retry(exc, backoff.failures, delay_s)
            if delay_s > 0:
                await sleep(delay_s)
