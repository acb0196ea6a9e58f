"""Session identity on the wire: the header names and the rule every id follows.

A program's turns carry `X-Dynamo-Session-ID` (the program), optionally `X-Dynamo-Parent-Session-ID`
(the program that spawned it) and, on its last request, `X-Dynamo-Session-Final: true`. The router
reads them (services/router/turn/session.py); the player, the benches and the peer proxy send them.

An id (a session id, a parent id, a client's request id, a worker id) is at most `MAX_ID_BYTES` bytes of
printable ASCII (`' '`..`'~'`): the router refuses anything else at its edge (400), the scheduler at its
gRPC API (INVALID_ARGUMENT). Each caller words its own error; the rule is here. Pure: no I/O.
"""

from __future__ import annotations

SESSION_HEADER = "X-Dynamo-Session-ID"
PARENT_HEADER = "X-Dynamo-Parent-Session-ID"
FINAL_HEADER = "X-Dynamo-Session-Final"

MAX_ID_BYTES = 256
"""Longest id, in UTF-8 bytes (for the printable ASCII an id may hold, in characters too)."""


def printable_ascii(value: str) -> bool:
    """Every character in `' '`..`'~'` (a header's undecodable bytes arrive as surrogates: not printable ASCII)."""
    return value.isascii() and value.isprintable()


def id_too_long(value: str) -> bool:
    """Longer than `MAX_ID_BYTES` bytes of UTF-8 (a lone surrogate counts as the 3 bytes it would take)."""
    return len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES
