"""The router's public HTTP port: aiohttp's low-level server with the rules a public port needs.

* At most `max_connections` open connections, and at most `max_connections_per_client` of one client (its
  address; under data tokens, the token's identity once a request on the connection proved it): one more
  is answered `503` (OpenAI-style JSON, `Retry-After: 1`, `Connection: close`) and closed at once. At the
  port's cap, another client's connection closes the longest idle connection of the client that holds the
  most instead (`core/limits.ConnectionShares`), so one client's idle sockets cannot lock the others out.
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
import hashlib
import logging
import ssl
import time
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
from orjson import dumps

from services.common.auth.security import Role, Tokens, Verdict, authorize, bearer_of
from services.common.serve.ports import PortInUse, binding
from services.router.core.limits import ConnectionLimitParams, ConnectionRefusal, ConnectionShares
from services.router.errors import BadRequest, Internal, Overloaded, RouterError, UnsupportedMediaType, quoted
from services.router.observe.metrics import RouterMetrics

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
    max_connections_per_client: int = 1024
    """0 = no cap of its own (only the eviction at `max_connections` shares the port)."""
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


def token_identity(control: Tokens | None, data: Tokens | None) -> Callable[[str | None], str | None] | None:
    """What files a connection under its bearer token (None when no token is configured): the client
    identity of an `Authorization` value that the bearer guard lets through (`token:<sha256 prefix>`, as
    `session.client_identity` names it), else None (the connection stays filed under its address). Only
    with data tokens: without them the data plane is open and any token would do, so addresses count."""
    if data is None:
        return None

    def identify(authorization: str | None) -> str | None:
        token = bearer_of(authorization)
        if token is None or authorize(Role.DATA, token, control, data) is not Verdict.ALLOW:
            return None
        return "token:" + hashlib.sha256(token).hexdigest()[:16]

    return identify


def peer_identity(transport: asyncio.BaseTransport) -> str:
    """`addr:<host>` of a connection's peer (its port is not part of who the client is)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, (tuple, list)) and peer:
        return f"addr:{peer[0]}"
    return f"addr:{peer or 'unknown'}"


class _Connection(web.RequestHandler):
    """One client connection: aiohttp's handler plus the head deadline and JSON errors."""

    def __init__(self, manager: "GuardedServer", **kwargs) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_request = False
        self._counted = False
        self._refused = False
        self._idle = True  # no request on it and no byte of the next head: it may be evicted at the cap
        self._head_pending = False  # bytes of a request head arrived that no handler has started on yet
        self.identified = False  # a request's token filed it (or tried to): see GuardedServer.handle
        self.unsupported_version = False  # the request being handled named an HTTP version other than 1.x

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit(self, transport):
            self._refused = True
            transport.write(self._guard.refusal)  # type: ignore[attr-defined]
            transport.close()
            return
        super().connection_made(transport)
        self._counted = True
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._in_request:
            self._head_pending = True
            if self._idle:
                self._idle = False
                self._guard.shares.busy(self)
            if self._head_timer is None:
                self._arm()  # the first byte of the next request head
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        self._disarm()
        if self._counted:
            self._counted = False
            self._guard.closed(self)
        super().connection_lost(exc)

    def evict(self) -> None:
        """Closed to make room for another client's connection (it was idle)."""
        self._disarm()
        self.force_close()

    def request_started(self) -> None:
        self._in_request = True
        self._head_pending = False
        self._disarm()
        if self._idle:
            self._idle = False
            self._guard.shares.busy(self)

    def request_finished(self) -> None:
        self._in_request = False

    async def _handle_request(self, request, start_time, request_handler):
        # Idle (evictable) once the answer is written out, not when the handler returns it.
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            if not self._idle and self._counted and not self._head_pending:
                self._idle = True
                self._guard.shares.idle(self, time.monotonic())

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

    def __init__(
        self,
        handler: Handler,
        limits: HttpLimits,
        metrics: RouterMetrics,
        identify: Callable[[str | None], str | None] | None = None,
    ) -> None:
        self.limits = limits
        self.metrics = metrics
        self.shares = ConnectionShares(ConnectionLimitParams(limits.max_connections, limits.max_connections_per_client))
        self._identify = identify
        self._app_handler = handler
        # lingering_time: after an error answer to a request whose body is still arriving (408, 413), the
        # rest is read and dropped for at most this long before the connection closes (aiohttp: 10 s).
        self._handler_kwargs = dict(
            keepalive_timeout=limits.keepalive_timeout_s, access_log=None, lingering_time=LINGER_S
        )
        refusal = error_response(Overloaded("too many connections; retry later", retry_after_s=1.0), {})
        assert isinstance(refusal.body, bytes)  # error_response's body is the encoded JSON
        head = [
            "HTTP/1.1 503 Service Unavailable",
            "Content-Type: application/json",
            f"Content-Length: {len(refusal.body)}",
            "Retry-After: 1",
            "Connection: close",
            *(f"{k}: {v}" for k, v in limits.server_header.items()),
        ]
        self.refusal = ("\r\n".join(head) + "\r\n\r\n").encode() + refusal.body
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

    @property
    def open_connections(self) -> int:
        return self.shares.total

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]
        return _Connection(self, loop=asyncio.get_running_loop(), **self._handler_kwargs)

    def admit(self, connection: _Connection, transport: asyncio.BaseTransport) -> bool:
        """A new connection: counted (closing another client's idle one if the port is full), or refused."""
        verdict = self.shares.open(connection, peer_identity(transport), time.monotonic())
        if not verdict.allowed:
            self.metrics.http_connections_refused.inc()
            if verdict.refusal is ConnectionRefusal.CLIENT_CAP:
                self.metrics.http_connection_shares.labels("refused_client_cap").inc()
            return False
        if isinstance(verdict.evict, _Connection):
            self.metrics.http_connection_shares.labels("evicted_idle").inc()
            verdict.evict._counted = False  # already forgotten by the shares
            verdict.evict.evict()
        self.metrics.http_connections.set(self.shares.total)
        return True

    def closed(self, connection: _Connection) -> None:
        self.shares.close(connection)
        self.metrics.http_connections.set(self.shares.total)

    def _file_by_token(self, connection: _Connection, request: web.BaseRequest) -> bool:
        """Under data tokens, file the connection under its token's identity at its first request that
        carries a valid one. False: that identity already holds its share (the request is refused)."""
        identity = self._identify(request.headers.get("Authorization")) if self._identify is not None else None
        if identity is None:
            return True
        connection.identified = True
        if self.shares.move(connection, identity, time.monotonic()):
            return True
        self.metrics.http_connections_refused.inc()
        self.metrics.http_connection_shares.labels("refused_client_cap").inc()
        return False

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol if isinstance(request.protocol, _Connection) else None
        if connection is not None:
            connection.request_started()
            if (
                not connection.identified
                and self._identify is not None
                and not self._file_by_token(connection, request)
            ):
                connection.request_finished()
                response = error_response(
                    Overloaded("too many connections from this client; retry later", retry_after_s=1.0),
                    self.limits.server_header,
                )
                response.force_close()
                return response
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
            if connection is not None:
                connection.request_finished()


async def start_http(
    handler: Handler,
    limits: HttpLimits,
    metrics: RouterMetrics,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
    identify: Callable[[str | None], str | None] | None = None,
) -> tuple[web.ServerRunner, int]:
    """Serve `handler` on host:port (HTTPS with `ssl_context`; SO_REUSEPORT with `reuse_port`, for one of
    several router processes on the port); returns the runner (cleanup() stops it) and the bound port.
    `identify` (`token_identity`) files connections under their bearer token's identity."""
    runner = web.ServerRunner(GuardedServer(handler, limits, metrics, identify), access_log=None)
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
