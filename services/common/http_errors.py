"""OpenAI-style JSON bodies for aiohttp's own errors (unknown path 404, wrong method 405, ...), which
aiohttp otherwise answers as plain text: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import json
from typing import Awaitable, Callable

from aiohttp import web

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
            message = f"no route {request.path!r}"
        elif exc.status == 405:
            message = f"{request.method} is not allowed on {request.path}"
        else:
            message = exc.reason
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return web.Response(
            status=exc.status,
            body=json.dumps(error_body(exc.status, message)).encode(),
            content_type="application/json",
            headers=headers,
        )
