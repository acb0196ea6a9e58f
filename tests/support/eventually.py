"""Poll for a condition instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable


async def assert_eventually(
    check: Callable[[], Any | Awaitable[Any]], *, timeout_s: float = 10.0, interval_s: float = 0.02, message: str = ""
) -> Any:
    """Call `check` until it returns a truthy value without raising AssertionError; return that value.

    `check` may be sync or async. On timeout the last AssertionError (or a falsy result) is raised.
    """
    deadline = time.monotonic() + timeout_s
    last_error: AssertionError | None = None
    while True:
        try:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return result
            last_error = AssertionError(message or f"condition still false: {result!r}")
        except AssertionError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise last_error
        await asyncio.sleep(interval_s)


def wait_until(
    check: Callable[[], Any], *, timeout_s: float = 10.0, interval_s: float = 0.02, message: str = ""
) -> Any:
    """The synchronous twin of `assert_eventually`, for tests that drive subprocesses."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
            if result:
                return result
            last_error = AssertionError(message or f"condition still false: {result!r}")
        except AssertionError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise last_error
        time.sleep(interval_s)
