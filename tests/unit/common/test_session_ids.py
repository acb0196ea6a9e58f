"""The one id rule (at most 256 bytes of printable ASCII) and the session header names, as the router's edge
and the scheduler's gRPC API apply them."""

from __future__ import annotations

import pytest

from services.common.web.session_ids import FINAL_HEADER, MAX_ID_BYTES, SESSION_HEADER, id_too_long, printable_ascii
from services.router.errors import BadRequest
from services.router.turn import session
from services.scheduler.adapters.proto import InvalidArgument, validate_session_id


@pytest.mark.parametrize(
    "value, printable",
    [("abc-1 x~", True), ("", True), ("tab\there", False), ("é", False), ("\x7f", False), ("\udcff", False)],
)
def test_printable_ascii(value, printable):
    assert printable_ascii(value) is printable


@pytest.mark.parametrize(
    "value, too_long",
    [("a" * MAX_ID_BYTES, False), ("a" * (MAX_ID_BYTES + 1), True), ("é" * 129, True), ("é" * 128, False)],
)
def test_id_too_long_counts_utf8_bytes(value, too_long):
    assert id_too_long(value) is too_long


@pytest.mark.parametrize("value", ["a" * (MAX_ID_BYTES + 1), "x\ny", "é"])
def test_the_router_and_the_scheduler_refuse_the_same_ids(value):
    with pytest.raises(BadRequest):
        session.normalize_session_id(value, "session_id")
    with pytest.raises(InvalidArgument):
        validate_session_id(value)


def test_the_router_reads_the_headers_the_player_sends():
    from clients.player import FINAL, SESSION

    assert (SESSION, FINAL) == (SESSION_HEADER, FINAL_HEADER) == (session.SESSION_HEADER, session.FINAL_HEADER)
    ident = session.from_headers({SESSION_HEADER: " p-1 ", FINAL_HEADER: "true"})
    assert (ident.session_id, ident.final) == ("p-1", True)
