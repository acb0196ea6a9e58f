"""The router's `/v1/files*` and `/v1/batches*`: a pass-through to the batch service's Batch API (`--batch-url`).

Bodies are streamed both ways, never parsed or buffered whole (a multipart upload may be 200 MB, a
`/content` download is `application/jsonl`). The batch service's status, body and content type reach the
client unchanged, its error bodies included; the client's `Authorization` goes to the batch service, which
checks the data token itself. Only end-to-end headers are forwarded (hop-by-hop ones are not).
A batch service that cannot be reached is a 502 (refused, reset) or 504 (timed out) in the router's own
OpenAI-style body; without `--batch-url` every such route is a 404 `batch_not_configured` naming the
missing batch service (errors.BatchServiceMissing says why not a 5xx).
A client body that stalls for `--http-body-timeout-seconds` is a 408, one that breaks its
Content-Encoding a 400 (a gzip/deflate body is forwarded decoded; the HTTP API answers any other
Content-Encoding 415 before a request gets here).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Callable

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from services.router.errors import BadRequest, RequestTimeout, RouterError, WorkerFailed, WorkerTimeout

log = logging.getLogger(__name__)

PREFIXES = ("/v1/files", "/v1/batches")
_REQUEST_HEADERS = (
    "Authorization",
    "Content-Type",
    "Content-Length",
    "Content-Encoding",
    "Accept",
    "Idempotency-Key",
    "OpenAI-Organization",
    "OpenAI-Project",
    "X-Request-Id",
    "traceparent",
    "tracestate",
)
_RESPONSE_HEADERS = (
    "Content-Type",
    "Content-Length",
    "Content-Disposition",
    "Content-Encoding",
    "X-Request-Id",
    "Retry-After",
    "Allow",
)
_CHUNK_BYTES = 256 * 1024


def is_batch_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PREFIXES)


class BatchApiProxy:
    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        body_timeout_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.body_timeout_s = body_timeout_s
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            # auto_decompress off: the body reaches the client exactly as the batch service sent it.
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector, auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def forward(
        self, request: web.BaseRequest, extra_headers: dict[str, str], on_error: Callable[[RouterError], web.Response]
    ) -> web.StreamResponse:
        """Send `request` to the batch service and stream its answer back."""
        headers = {name: request.headers[name] for name in _REQUEST_HEADERS if name in request.headers}
        if "Content-Encoding" in headers:
            # The router's HTTP server decodes a gzip/deflate body as it reads it: what goes on is the
            # decoded body, whose length the batch service learns from the chunked framing.
            headers.pop("Content-Encoding")
            headers.pop("Content-Length", None)
        body_errors: list[RouterError] = []

        async def body():
            # Each piece of the client's body must come within the body timeout (an upload may be large,
            # so the bound is on silence, not on the whole).
            try:
                while True:
                    async with asyncio.timeout(self.body_timeout_s):
                        chunk = await request.content.read(_CHUNK_BYTES)
                    if not chunk:
                        return
                    yield chunk
            except TimeoutError:
                body_errors.append(
                    RequestTimeout(f"request body stalled for {self.body_timeout_s:g}s", code="body_timeout")
                )
                raise
            except (web.RequestPayloadError, HttpProcessingError):
                body_errors.append(
                    BadRequest("the body does not match its Content-Encoding or framing", code="malformed_body")
                )
                raise

        url = self.base_url + request.rel_url.path_qs
        try:
            upstream = await self._client().request(
                request.method,
                url,
                data=body() if request.body_exists else None,
                headers=headers,
                allow_redirects=False,
            )
        except (
            asyncio.TimeoutError,
            aiohttp.ClientError,
            OSError,
            web.RequestPayloadError,
            HttpProcessingError,
        ) as exc:
            if body_errors:
                # The client's body stalled or broke its Content-Encoding or framing on the way: its fault.
                return on_error(body_errors[0])
            if isinstance(exc, asyncio.TimeoutError):
                return on_error(
                    WorkerTimeout("the batch service's Batch API did not answer in time", code="batch_timeout")
                )
            log.warning("Batch API request to the batch service failed: %s", exc.__class__.__name__)
            return on_error(WorkerFailed("the batch service's Batch API is unreachable", code="batch_unreachable"))
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            response.headers.update(extra_headers)
            for name in _RESPONSE_HEADERS:
                if name in upstream.headers:
                    response.headers[name] = upstream.headers[name]
            if "Content-Length" in upstream.headers:
                response.content_length = int(upstream.headers["Content-Length"])
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_chunked(_CHUNK_BYTES):
                    await response.write(chunk)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                # Headers are gone: all that is left is to cut the connection so the client sees a short body.
                log.warning("Batch API answer from the batch service broke off: %s", exc.__class__.__name__)
                response.force_close()
                return response
            await response.write_eof()
        return response
