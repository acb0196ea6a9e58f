"""OpenAI-style JSON bodies for aiohttp's own errors (unknown path 404, wrong method 405, ...), which
aiohttp otherwise answers as plain text. The body is built by services/common/web/openai_errors.py."""

from __future__ import annotations

import json
from typing import Awaitable, Callable

from aiohttp import web

from services.common.web.openai_errors import error_body, quoted

_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def status_error_body(status: int, message: str) -> dict:
    """The body for an HTTP status of aiohttp's: a client's error below 500, the server's from 500 on."""
    return error_body(
        message,
        type_="invalid_request_error" if status < 500 else "server_error",
        code=_CODES.get(status, str(status)),
    )


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
            body=json.dumps(status_error_body(exc.status, message)).encode(),
            content_type="application/json",
            headers=headers,
        )
