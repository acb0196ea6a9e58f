"""Session identity of a request: `X-Dynamo-Session-ID`, `X-Dynamo-Parent-Session-ID`, `X-Dynamo-Session-Final`.

Values are trimmed and an empty value counts as absent. A present value longer than 256 bytes or with a
character outside printable ASCII is refused (`BadRequest`), before anything reaches the scheduler or a
worker. A parent equal to the session id is dropped (reference/thunderagent.md §1.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from services.router.errors import BadRequest

SESSION_HEADER = "X-Dynamo-Session-ID"
PARENT_HEADER = "X-Dynamo-Parent-Session-ID"
FINAL_HEADER = "X-Dynamo-Session-Final"
MAX_SESSION_ID_BYTES = 256
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class SessionIdentity:
    session_id: str = ""          # "" = passthrough
    parent_session_id: str = ""
    final: bool = False

    @property
    def is_program(self) -> bool:
        return bool(self.session_id)


def normalize_session_id(value: str | None, field: str) -> str:
    """Trim; "" when absent; raise BadRequest when too long or not printable ASCII."""
    if value is None:
        return ""
    text = value.strip()
    if not text:
        return ""
    if len(text.encode("utf-8")) > MAX_SESSION_ID_BYTES:
        raise BadRequest(f"{field} is longer than {MAX_SESSION_ID_BYTES} bytes", param=field)
    if not all(" " <= ch <= "~" for ch in text):
        raise BadRequest(f"{field} must be printable ASCII", param=field)
    return text


def parse_final(value: str | None) -> bool:
    if value is None:
        return False
    text = value.strip().lower()
    if not text or text in _FALSE:
        return False
    if text in _TRUE:
        return True
    raise BadRequest(f"{FINAL_HEADER} must be a boolean (true/false), got {value!r}", param=FINAL_HEADER)


def identity(session_id: str | None, parent_session_id: str | None = None, final: bool = False,
             *, names: tuple[str, str] = ("session_id", "parent_session_id")) -> SessionIdentity:
    sid = normalize_session_id(session_id, names[0])
    parent = normalize_session_id(parent_session_id, names[1])
    if parent == sid:
        parent = ""
    return SessionIdentity(sid, parent, final)


def from_headers(headers: Mapping[str, str]) -> SessionIdentity:
    """Session identity of an HTTP request (header names are case-insensitive in `headers`)."""
    return identity(headers.get(SESSION_HEADER), headers.get(PARENT_HEADER), parse_final(headers.get(FINAL_HEADER)),
                    names=(SESSION_HEADER, PARENT_HEADER))
