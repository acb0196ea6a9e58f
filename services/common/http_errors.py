"""OpenAI-style JSON bodies for aiohttp's own errors (unknown path 404, wrong method 405, ...), which
aiohttp otherwise answers as plain text: `{"error": {"message", "type", "param", "code"}}`.

`quoted` is the one way an error message quotes a value a client sent (a path, a header, a model
name): at most `ECHO_MAX_CHARS` of it. The router's errors use the same helper."""

from __future__ import annotations

import json
from typing import Awaitable, Callable

from aiohttp import web

ECHO_MAX_CHARS = 64
"""An error message quotes at most this many characters of a client's value (a path or a header may be 8 KB)."""


def quoted(value: object, limit: int = ECHO_MAX_CHARS) -> str:
    """How an error message quotes a value the client sent: its repr, of the first `limit` characters
    only, with `...` after the quote when it was cut (`'abc'`, `'aaaa'...`, `12`)."""
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    text = repr(value)
    return text[:limit] + "..." if len(text) > limit else text


_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def error_body(status: int, message: str) -> dict:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": None,
            "code": _CODES.get(status, str(status)),
        }
    }


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:
            message = f"no route {quoted(request.path)}"
        elif exc.status == 405:
            message = f"{quoted(request.method)} is not allowed on {quoted(request.path)}"
        else:
            message = exc.reason
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return web.Response(
            status=exc.status,
            body=json.dumps(error_body(exc.status, message)).encode(),
            content_type="application/json",
            headers=headers,
        )
