"""OpenAI-style error bodies, the one builder: `{"error": {"message", "type", "param", "code"}}`.

Every Bandmaster HTTP edge that speaks the OpenAI API answers errors in this shape: the router's domain
errors (services/router/errors.py), the planner's Batch API, the bearer-token guard (security.py) and the
JSON bodies for aiohttp's own 404/405/413 (http_errors.py). `quoted` is the one way an error message
quotes a value a client sent (a path, a header, a model name): at most `ECHO_MAX_CHARS` of it.

Pure: no I/O, no aiohttp (a service's `core/` may build a body too). The simworker is not here on
purpose: it answers as the engine it stands in for (SGLang's flat `{"object": "error", ...}` body).
"""

from __future__ import annotations

ECHO_MAX_CHARS = 64
"""An error message quotes at most this many characters of a client's value (a path or a header may be 8 KB)."""


def quoted(value: object, limit: int = ECHO_MAX_CHARS) -> str:
    """How an error message quotes a value the client sent: its repr, of the first `limit` characters
    only, with `...` after the quote when it was cut (`'abc'`, `'aaaa'...`, `12`)."""
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    text = repr(value)
    return text[:limit] + "..." if len(text) > limit else text


def error_body(
    message: str, *, type_: str = "invalid_request_error", code: str | None = None, param: str | None = None
) -> dict:
    """The OpenAI error body; every key is always present (`param` and `code` may be None)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
