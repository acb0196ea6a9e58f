"""Field rules shared by the HTTP and gRPC edges. Each raises BadRequest naming the field (its `param`).

Everything the router forwards or hashes is checked here first, so that a value a worker or the
scheduler would refuse (or the router itself could not encode or hash) is a 400 / INVALID_ARGUMENT
at the edge, never a 500 or a silently ungoverned turn.
"""

from __future__ import annotations

import math
from typing import Any

from orjson import dumps

from services.common.web.session_ids import MAX_ID_BYTES, id_too_long, printable_ascii
from services.router.errors import BadRequest, quoted

MAX_TOKEN_ID = 2**31 - 1  # SGLang token ids are int32; the prefix hash packs them as u32
# (name, low, high) of the OpenAI sampling fields; SGLang's /generate takes temperature >= 0 unbounded.
OPENAI_RANGES = (
    ("temperature", 0.0, 2.0),
    ("top_p", 0.0, 1.0),
    ("presence_penalty", -2.0, 2.0),
    ("frequency_penalty", -2.0, 2.0),
)
GENERATE_RANGES = (
    ("temperature", 0.0, math.inf),
    ("top_p", 0.0, 1.0),
    ("presence_penalty", -2.0, 2.0),
    ("frequency_penalty", -2.0, 2.0),
)


def number_in_range(value: Any, name: str, low: float, high: float, *, param: str | None = None) -> None:
    """None passes; anything else must be a finite number in [low, high]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"{name} must be a number", param=param or name)
    if not (math.isfinite(value) and low <= value <= high):
        bounds = f">= {low:g}" if math.isinf(high) else f"between {low:g} and {high:g}"
        raise BadRequest(f"{name} must be {bounds}, got {quoted(value)}", param=param or name)


def sampling(fields: dict, ranges=OPENAI_RANGES, *, prefix: str = "") -> None:
    for name, low, high in ranges:
        number_in_range(fields.get(name), prefix + name, low, high)


def is_token_list(value: Any) -> bool:
    """A list of token ids: ints in [0, MAX_TOKEN_ID]."""
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in value
    )


def request_id(value: str, field: str = "request_id") -> str:
    """A client-given request id: at most 256 bytes of printable ASCII (the scheduler's rule)."""
    if id_too_long(value) or not printable_ascii(value):
        raise BadRequest(f"{field} must be at most {MAX_ID_BYTES} characters of printable ASCII", param=field)
    return value


MAX_ENCODABLE_DEPTH = 254
"""orjson.dumps refuses a value nested deeper than this (its loads takes up to 1024)."""


def encodable(body: dict, raw: bytes | None = None) -> None:
    """The body can be forwarded: it re-encodes (orjson refuses nesting deeper than 254 levels). With the
    `raw` JSON it came from, a body with too few brackets to nest that deep is not encoded to find out."""
    if raw is not None and raw.count(b"[") + raw.count(b"{") <= MAX_ENCODABLE_DEPTH:
        return
    try:
        dumps(body)
    except (TypeError, ValueError, RecursionError):
        raise BadRequest("request body is nested too deeply") from None
