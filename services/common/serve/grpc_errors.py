"""Domain errors → gRPC status: the one mapping every servicer uses.

Each service declares its table once (`ErrorTable([(ExcType, code), ...])`, first match wins, so list a
subclass before its base) and wraps each handler body in `async with TABLE.guard(context):`. An error the
table names ends the call with its code and a message (`str(exc)` unless the service says otherwise); any
other exception propagates and gRPC reports it as UNKNOWN, as before.

The details are cut to `services.common.serve.grpc_server.MAX_DETAILS_BYTES` by the host's `RequestGuard`,
which wraps every handler's context; this module does not cut them a second time.
"""

from __future__ import annotations

import contextlib
from typing import AsyncIterator, Callable, Iterable

import grpc

ExceptionTypes = type[BaseException] | tuple[type[BaseException], ...]


class ErrorTable:
    """An ordered table of domain error types and the gRPC status each one ends a call with."""

    __slots__ = ("_rows", "_caught", "_message")

    def __init__(
        self, rows: Iterable[tuple[ExceptionTypes, grpc.StatusCode]], message: Callable[[BaseException], str] = str
    ) -> None:
        self._rows: tuple[tuple[ExceptionTypes, grpc.StatusCode], ...] = tuple(rows)
        caught: list[type[BaseException]] = []
        for types, _ in self._rows:
            caught.extend(types if isinstance(types, tuple) else (types,))
        self._caught = tuple(caught)
        self._message = message

    def status(self, exc: BaseException) -> grpc.StatusCode:
        """The code for `exc`: the first row it is an instance of, else INTERNAL."""
        for types, code in self._rows:
            if isinstance(exc, types):
                return code
        return grpc.StatusCode.INTERNAL

    def handles(self, exc: BaseException) -> bool:
        return isinstance(exc, self._caught)

    def message(self, exc: BaseException) -> str:
        return self._message(exc)

    @contextlib.asynccontextmanager
    async def guard(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Abort the call with the table's status and message when the body raises a domain error."""
        try:
            yield
        except self._caught as exc:
            await context.abort(self.status(exc), self._message(exc))
