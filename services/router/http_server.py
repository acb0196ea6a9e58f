"""The router's public HTTP port: aiohttp's low-level server with the rules a public port needs.

* At most `max_connections` open connections: one more is answered `503` (OpenAI-style JSON,
  `Retry-After: 1`, `Connection: close`) and closed at once.
* Request heads have a deadline: a connection must deliver a complete request line and headers
  within `header_timeout_s` of opening, and on a kept-alive connection within `header_timeout_s`
  of the next request's first byte; otherwise it is closed. An idle kept-alive connection is
  closed after `keepalive_timeout_s`. (Bodies are bounded by the handler: see http_api.)
* A request the HTTP parser refuses (bad bytes in a header, a header too long, conflicting
  Content-Length and Transfer-Encoding, ...) is answered with an OpenAI-style JSON error that
  names the problem but never quotes the request (a header line may hold a token), logged at DEBUG.
* A body is decoded from `identity`, `gzip` or `deflate` only (`check_content_encoding`); any other
  Content-Encoding is a 415, never a body read as if it were identity.
* `Server: bandmaster` unless the framework's name and version are asked for.

`request.protocol.request_started()` / `request_finished()` are called by the dispatch around
every handler (see `GuardedServer.handle`), which is how a connection knows a head is complete.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    ContentEncodingError,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)

from services.common.ports import PortInUse, binding
from services.router.adapters.upstream import dumps
from services.router.errors import BadRequest, Internal, Overloaded, RouterError, UnsupportedMediaType, quoted
from services.router.metrics import RouterMetrics

log = logging.getLogger(__name__)

SERVER_NAME = "bandmaster"
LINGER_S = 1.0
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# The codings aiohttp decodes without optional packages, as it matches them (one value, any case); br and
# zstd need Brotli / backports.zstd, which the router does not rely on.
DECODED_CODINGS = ("gzip", "deflate")


def unsupported_encoding(value: str | None = None) -> UnsupportedMediaType:
    what = "this Content-Encoding" if value is None else f"Content-Encoding {quoted(value)}"
    return UnsupportedMediaType(
        f"{what} is not supported: send the body as identity, gzip or deflate (one Content-Encoding)",
        param="Content-Encoding",
        code="unsupported_content_encoding",
    )


def check_content_encoding(headers: Any) -> None:
    """Refuse (415) a body the server would not decode: a Content-Encoding other than identity (or empty),
    gzip or deflate, or more than one (given twice, or a list of codings). `headers`: a request's
    case-insensitive multidict."""
    values = headers.getall("Content-Encoding", ())
    if not values:
        return
    value = values[0]
    if len(values) > 1:
        raise unsupported_encoding(", ".join(values))
    if value.strip().lower() in ("", "identity") or (value.isascii() and value.lower() in DECODED_CODINGS):
        return
    raise unsupported_encoding(value)


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 60.0
    max_connections: int = 2048
    max_body_bytes: int = 8 * 1024 * 1024
    server_version: bool = False
    """True: the framework's own `Server` header (name and version); False: `Server: bandmaster`."""

    @property
    def server_header(self) -> dict[str, str]:
        return {} if self.server_version else {"Server": SERVER_NAME}


def error_response(err: RouterError, headers: dict[str, str]) -> web.Response:
    """The one mapping of domain errors to HTTP responses."""
    extra = dict(headers)
    if err.retry_after_s is not None:
        extra["Retry-After"] = str(max(1, int(-(-err.retry_after_s // 1))))  # whole seconds, rounded up
    response = web.Response(
        status=err.http_status, body=dumps(err.body()), content_type="application/json", headers=extra
    )
    if err.http_status == 408:
        response.force_close()  # the rest of the body may still be on its way
    return response


def malformed(exc: BaseException | None, status: int) -> RouterError:
    """What a client is told about a request the HTTP parser refused: the kind of problem, never its bytes."""
    if status >= 500 or not isinstance(exc, HttpProcessingError):
        return Internal("internal error")
    if isinstance(exc, ContentEncodingError) and "install" in exc.message:
        # A coding aiohttp knows but has no decoder for here (br without Brotli, zstd without
        # backports.zstd): refused while parsing the head, before a handler could.
        return unsupported_encoding()
    if isinstance(exc, LineTooLong):
        reason = "a request line or header field is longer than the limit"
    elif isinstance(exc, (BadHttpMethod, BadStatusLine)):
        reason = "malformed request line"
    elif isinstance(exc, InvalidURLError):
        reason = "malformed request target"
    elif isinstance(exc, InvalidHeader):
        reason = "malformed header"
    elif isinstance(exc, (ContentLengthError, TransferEncodingError)):
        reason = "malformed or conflicting Content-Length / Transfer-Encoding"
    elif isinstance(exc, ContentEncodingError):
        reason = "the body does not match its Content-Encoding"
    else:
        reason = "malformed request (headers or framing)"
    err = BadRequest(f"malformed HTTP request: {reason}", code="malformed_http")
    err.http_status = status if 400 <= status < 500 else 400
    return err


class _Refusal(asyncio.Protocol):
    """A connection over the cap: one 503, then closed."""

    def __init__(self, payload: bytes) -> None:
        self._payload = payload

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self._payload)  # type: ignore[attr-defined]
        transport.close()


class _Connection(web.RequestHandler):
    """One client connection: aiohttp's handler plus the head deadline and JSON errors."""

    def __init__(self, manager: "GuardedServer", **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_request = False
        self._counted = False
        self.unsupported_version = False  # the request being handled named an HTTP version other than 1.x

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._counted = True
        self._guard.opened()
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._in_request and self._head_timer is None:
            self._arm()  # the first byte of the next request head
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if self._counted:
            self._counted = False
            self._guard.closed()
        super().connection_lost(exc)

    def request_started(self) -> None:
        self._in_request = True
        self._disarm()

    def request_finished(self) -> None:
        self._in_request = False

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self._guard.limits.header_timeout_s, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self._in_request:
            self._guard.metrics.http_timeouts.labels("header").inc()
            self.force_close()

    def log_exception(self, *args, **kwargs) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, (web.RequestPayloadError, HttpProcessingError)):
            # aiohttp drains a body the handler did not read (or refused) after answering; one that breaks
            # its Content-Encoding or framing fails there. The client's fault, not an unhandled error.
            log.debug("discarded the rest of a malformed request body (%s)", exc.__class__.__name__)
            return
        super().log_exception(*args, **kwargs)

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        err = malformed(exc, status)
        if isinstance(err, Internal):
            # Our bug, not the client's: the traceback goes to the log (credentials are redacted there).
            log.error("unhandled error serving %s %s", request.method, request.path, exc_info=exc)
        else:
            log.debug(
                "refused a malformed HTTP request from %s: %s (%s)", request.remote, err.message, exc.__class__.__name__
            )
        self._guard.metrics.request("http", "none", f"error_{err.http_status}").inc()
        response = error_response(err, self._guard.limits.server_header)
        response.force_close()
        return response


class GuardedServer(web.Server):
    """`web.Server` whose connections are `_Connection`s, counted and capped."""

    def __init__(self, handler: Handler, limits: HttpLimits, metrics: RouterMetrics) -> None:
        self.limits = limits
        self.metrics = metrics
        self.open_connections = 0
        self._app_handler = handler
        # lingering_time: after an error answer to a request whose body is still arriving (408, 413), the
        # rest is read and dropped for at most this long before the connection closes (aiohttp: 10 s).
        self._handler_kwargs = dict(
            keepalive_timeout=limits.keepalive_timeout_s, access_log=None, lingering_time=LINGER_S
        )
        refusal = error_response(Overloaded("too many connections; retry later", retry_after_s=1.0), {})
        head = [
            "HTTP/1.1 503 Service Unavailable",
            "Content-Type: application/json",
            f"Content-Length: {len(refusal.body)}",
            "Retry-After: 1",
            "Connection: close",
            *(f"{k}: {v}" for k, v in limits.server_header.items()),
        ]
        self._refusal = ("\r\n".join(head) + "\r\n\r\n").encode() + refusal.body
        super().__init__(self.handle, request_factory=self._make_request, handler_cancellation=True)

    def _make_request(self, message, payload, protocol, writer, task) -> web.BaseRequest:
        if message.version not in (HttpVersion10, HttpVersion11) and isinstance(protocol, _Connection):
            # llhttp takes "HTTP/0.9" and "HTTP/2.0" request lines and aiohttp answers in the request's
            # version: refuse it (see handle) with an answer a client can read.
            message = message._replace(version=HttpVersion10, should_close=True)
            protocol.unsupported_version = True
        return web.BaseRequest(
            message,
            payload,
            protocol,
            writer,
            task,
            asyncio.get_running_loop(),
            client_max_size=self.limits.max_body_bytes,
        )

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]
        if self.open_connections >= self.limits.max_connections:
            self.metrics.http_connections_refused.inc()
            return _Refusal(self._refusal)
        return _Connection(self, loop=asyncio.get_running_loop(), **self._handler_kwargs)

    def opened(self) -> None:
        self.open_connections += 1
        self.metrics.http_connections.set(self.open_connections)

    def closed(self) -> None:
        self.open_connections -= 1
        self.metrics.http_connections.set(self.open_connections)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        guarded = isinstance(connection, _Connection)
        if guarded:
            connection.request_started()
            if connection.unsupported_version:
                connection.unsupported_version = False
                connection.request_finished()
                log.debug("refused a request with an unsupported HTTP version from %s", request.remote)
                self.metrics.request("http", "none", "error_400").inc()
                err = BadRequest(
                    "malformed HTTP request: unsupported HTTP version (1.0 and 1.1 are served)", code="malformed_http"
                )
                response = error_response(err, self.limits.server_header)
                response.force_close()
                return response
        try:
            return await self._app_handler(request)
        finally:
            if guarded:
                connection.request_finished()


async def start_http(
    handler: Handler,
    limits: HttpLimits,
    metrics: RouterMetrics,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
) -> tuple[web.ServerRunner, int]:
    """Serve `handler` on host:port (HTTPS with `ssl_context`; SO_REUSEPORT with `reuse_port`, for one of
    several router processes on the port); returns the runner (cleanup() stops it) and the bound port."""
    runner = web.ServerRunner(GuardedServer(handler, limits, metrics), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port or None, ssl_context=ssl_context)
    try:
        with binding(host, port, "router HTTP", "--http-port"):
            await site.start()
    except PortInUse:
        await runner.cleanup()
        raise
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, bound
