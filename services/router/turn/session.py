"""Session identity of a request: `X-Dynamo-Session-ID`, `X-Dynamo-Parent-Session-ID`, `X-Dynamo-Session-Final`.

Values are trimmed and an empty value counts as absent. A present value longer than 256 bytes or with a
character outside printable ASCII (whatever bytes the client sent), or a header given more than once, is
refused (`BadRequest`), before anything reaches the scheduler or a worker. A parent equal to the session
id is dropped (reference/thunderagent.md §1.1). The final header is `true` or `false` (any case), nothing
else: `1`, `yes` or `on` are refused rather than guessed at.

`client_identity` names the client the per-client limits count against: a hash of its bearer token when
it sends one (never the token itself), else its address.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

from services.common.settings.config import TRUE_OR_FALSE, parse_bool
from services.common.web.session_ids import (  # noqa: F401 - the header names are re-exported
    FINAL_HEADER,
    MAX_ID_BYTES,
    PARENT_HEADER,
    SESSION_HEADER,
    id_too_long,
    printable_ascii,
)
from services.router.errors import BadRequest, quoted

TRAFFIC_HEADER = "X-Bandmaster-Traffic"


@dataclass(frozen=True)
class SessionIdentity:
    session_id: str = ""  # "" = passthrough
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
    # ASCII first: a header's undecodable bytes arrive as surrogates, which cannot even be encoded.
    if not printable_ascii(text):
        raise BadRequest(f"{field} must be printable ASCII", param=field)
    if id_too_long(text):
        raise BadRequest(f"{field} is longer than {MAX_ID_BYTES} bytes", param=field)
    return text


def parse_final(value: str | None) -> bool:
    """`true` / `false` in any case, trimmed; absent or empty is false; anything else raises BadRequest."""
    if value is None or not value.strip():
        return False
    try:
        return parse_bool(value, TRUE_OR_FALSE)
    except ValueError:
        raise BadRequest(
            f"{FINAL_HEADER} must be true or false (case-insensitive), got {quoted(value)}", param=FINAL_HEADER
        ) from None


def identity(
    session_id: str | None,
    parent_session_id: str | None = None,
    final: bool = False,
    *,
    names: tuple[str, str] = ("session_id", "parent_session_id"),
) -> SessionIdentity:
    sid = normalize_session_id(session_id, names[0])
    parent = normalize_session_id(parent_session_id, names[1])
    if parent == sid:
        parent = ""
    return SessionIdentity(sid, parent, final)


def _single(headers: Mapping[str, str], name: str) -> str | None:
    getall = getattr(headers, "getall", None)
    if getall is not None:
        values = getall(name, ())
        if len(values) > 1:
            raise BadRequest(f"{name} must be given once", param=name)
        return values[0] if values else None
    return headers.get(name)


def from_headers(headers: Mapping[str, str]) -> SessionIdentity:
    """Session identity of an HTTP request (`headers`: case-insensitive, a multidict or a plain mapping)."""
    return identity(
        _single(headers, SESSION_HEADER),
        _single(headers, PARENT_HEADER),
        parse_final(_single(headers, FINAL_HEADER)),
        names=(SESSION_HEADER, PARENT_HEADER),
    )


def path_label(headers: Mapping[str, str]) -> str:
    """`program` when a session header is present (valid or not), else `passthrough` (a metrics label)."""
    value = headers.get(SESSION_HEADER)
    return "program" if value is not None and value.strip() else "passthrough"


def client_identity(authorization: str | None, address: str | None) -> str:
    """`token:<sha256 prefix>` of a bearer token (or any Authorization value), else `addr:<host>`."""
    if authorization and authorization.strip():
        value = authorization.strip()
        if value[:7].lower() == "bearer ":
            value = value[7:].strip()
        digest = hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return f"token:{digest}"
    return f"addr:{address or 'unknown'}"


def traffic(headers: Mapping[str, str]) -> str:
    """`batch` when `X-Bandmaster-Traffic: batch` (the batch service's dispatcher marks its requests so), else `online`.
    Any other value is online: marking a request batch only ever lowers its priority."""
    value = headers.get(TRAFFIC_HEADER)
    return "batch" if value is not None and value.strip().lower() == "batch" else "online"
