"""Clients of a replicated service with one leader (the scheduler's active/standby pair).

A standby ends a call FAILED_PRECONDITION with the leader's address in the `bandmaster-scheduler-leader`
trailing metadata ("" when it knows none yet). A client is given every replica's address (a comma-
separated list) and follows: a redirect names the next address to try, an UNAVAILABLE moves on to the
next address of the list. `FollowingStub` does this for plain unary calls (the planner's GetStats /
ListPrograms); the router's scheduler client (services/router/adapters/scheduler.py) does its own,
with the decision deadline and the circuit breaker around it, on the same two helpers.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import grpc

from services.common.settings.config import parse_host_port

log = logging.getLogger(__name__)

LEADER_METADATA_KEY = "bandmaster-scheduler-leader"
"""Trailing metadata of a "not the leader" FAILED_PRECONDITION: the leader's host:port ("" = unknown)."""

MUX_OPS_METADATA_KEY = "bandmaster-mux-ops"
"""Initial metadata of a scheduler's AdmitMux stream: the operations it takes, comma-separated."""

FOLLOW = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION}
"""Codes after which a call is retried on another replica."""


def parse_addresses(text: str, field_name: str) -> list[str]:
    """'a:1,b:2' -> ['a:1', 'b:2'] (each host:port checked, duplicates dropped); ConfigError otherwise."""
    addresses: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        parse_host_port(part, field_name)
        if part not in addresses:
            addresses.append(part)
    return addresses


def leader_hint(exc: grpc.RpcError) -> str | None:
    """The leader a standby named in a FAILED_PRECONDITION ("" = it knows none), None if `exc` is not a
    standby's refusal."""
    code = exc.code() if hasattr(exc, "code") else None
    if code != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    metadata = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in metadata or ():
        if key == LEADER_METADATA_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


class FollowingStub:
    """An async stub whose unary calls go to whichever replica leads. `make_channel(address)` opens a
    channel (the caller closes them: it owns them), `make_stub(channel)` wraps it. At most
    len(addresses) + 1 attempts per call, each with the caller's timeout."""

    def __init__(
        self, addresses: list[str], make_channel: Callable[[str], grpc.aio.Channel], make_stub: Callable[[Any], Any]
    ) -> None:
        if not addresses:
            raise ValueError("no address")
        self.addresses = list(addresses)
        self.current = self.addresses[0]
        self._make_channel = make_channel
        self._make_stub = make_stub
        self._stubs: dict[str, Any] = {}

    def _stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = self._make_stub(self._make_channel(address))
        return stub

    def _next(self, after: str) -> str:
        if after in self.addresses:
            return self.addresses[(self.addresses.index(after) + 1) % len(self.addresses)]
        return self.addresses[0]

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(request, **kwargs):
            last: grpc.RpcError | None = None
            address = self.current
            for _ in range(len(self.addresses) + 1):
                try:
                    answer = await getattr(self._stub(address), method)(request, **kwargs)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in FOLLOW:
                        raise
                    last = exc
                    hint = leader_hint(exc)
                    address = hint if hint and hint != address else self._next(address)
                    continue
                if address != self.current:
                    log.info("following the leader at %s (was %s)", address, self.current)
                    self.current = address
                return answer
            assert last is not None
            raise last

        return call
