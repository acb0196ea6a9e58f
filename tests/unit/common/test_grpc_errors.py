"""The one domain-error → gRPC status mapping (services/common/serve/grpc_errors.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.common.serve.grpc_errors import ErrorTable


class Missing(LookupError):
    pass


class Narrow(Missing):
    pass


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted


TABLE = ErrorTable(
    [
        (Narrow, grpc.StatusCode.ALREADY_EXISTS),
        (Missing, grpc.StatusCode.NOT_FOUND),
        ((ValueError, TypeError), grpc.StatusCode.INVALID_ARGUMENT),
    ]
)


@pytest.mark.parametrize(
    "exc, code",
    [
        (Narrow("x"), grpc.StatusCode.ALREADY_EXISTS),  # the first matching row wins
        (Missing("x"), grpc.StatusCode.NOT_FOUND),
        (ValueError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (TypeError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (RuntimeError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_status_is_the_first_matching_row(exc: Exception, code: grpc.StatusCode) -> None:
    assert TABLE.status(exc) is code
    assert TABLE.handles(exc) is (code is not grpc.StatusCode.INTERNAL)


def test_guard_aborts_with_the_code_and_message() -> None:
    async def run() -> _Context:
        context = _Context()
        with pytest.raises(_Aborted):
            async with TABLE.guard(context):
                raise Missing("no such program")
        return context

    assert asyncio.run(run()).aborted == (grpc.StatusCode.NOT_FOUND, "no such program")


def test_guard_uses_the_services_message() -> None:
    table = ErrorTable([(Missing, grpc.StatusCode.NOT_FOUND)], message=lambda exc: f"not found: {exc.args[0]}")

    async def run() -> _Context:
        context = _Context()
        with pytest.raises(_Aborted):
            async with table.guard(context):
                raise Missing("job-1")
        return context

    assert asyncio.run(run()).aborted == (grpc.StatusCode.NOT_FOUND, "not found: job-1")


def test_guard_lets_other_errors_and_success_through() -> None:
    async def run() -> _Context:
        context = _Context()
        async with TABLE.guard(context):
            pass
        with pytest.raises(RuntimeError):
            async with TABLE.guard(context):
                raise RuntimeError("bug")
        return context

    assert asyncio.run(run()).aborted is None
