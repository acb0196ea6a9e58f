"""Transport security and bearer tokens, the same on every service.

One settings group (`SecurityFlags`, composed into a service's config by `security_group(ENV_PREFIX)`),
the same flags on every gRPC service:

    --tls-cert, --tls-key   this process's certificate chain and private key (PEM). The gRPC server
                            presents them (and the router's HTTP port, which then serves HTTPS); every
                            outbound gRPC channel presents them as its client certificate.
    --tls-ca                CA bundle (PEM). Server: every client must present a certificate signed by
                            it (mutual TLS). Client: servers are verified against it (without it: the
                            system roots).
    --control-token-file    bearer token(s) of the control plane (env BANDMASTER_CONTROL_TOKEN)
    --data-token-file       bearer token(s) of the data plane (env BANDMASTER_DATA_TOKEN)
    --grpc-reflection       serve gRPC reflection (off by default)
    --insecure              allow control ports (gRPC, /metrics) on a non-loopback address unauthenticated
    --metrics-token-file    bearer token(s) /metrics requires (env BANDMASTER_METRICS_TOKEN)
    --metrics-loopback      serve /metrics on 127.0.0.1 only, whatever the listen host

The bind rule (`check_bind`): a control port (every gRPC port, every /metrics port) binds a loopback
address freely; a non-loopback one only when the service authenticates its callers there ("secure":
mutual TLS or a control token for gRPC, a metrics token for /metrics) or `--insecure` says the operator
means it. Otherwise the service refuses to start: "binding <addr> (not loopback) needs --secure or
--insecure". The router's OpenAI HTTP port and the batch service's Batch API port are the data plane: they
are not under the rule (they sit behind a Service or a load balancer; the data token guards them).

Roles (`required_role`): every RPC is a control RPC except the data-plane RPCs in `DATA_METHODS`
and the health checks in `PUBLIC_METHODS`. When a control token is configured, a control RPC needs
it; a data token there is PERMISSION_DENIED. When a data token is configured, a data RPC needs a
data token or a control token. A missing or unknown token is UNAUTHENTICATED, its details saying which
(`refusal_reason`), with a WARNING per peer and reason a minute. A token file may hold
several tokens, one per line (rotation: old and new both accepted); outbound calls send the first
control token. Tokens are compared with `hmac.compare_digest`, never logged, never in a repr.

`load_security(values, env)` reads and checks every file when the service starts (ConfigError naming
the rule); `SecurityConfig` makes the gRPC server credentials, the token interceptor, the outbound
channels and the HTTP TLS context from what it read. docs/security.md has the threat model.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import json
import logging
import os
import ssl
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence

import grpc
from aiohttp import web

from services.common.settings.config import group, parse_host_port, pop_group, setting
from services.common.settings.errors import ConfigError
from services.common.web.openai_errors import error_body

log = logging.getLogger(__name__)

CONTROL_TOKEN_ENV = "BANDMASTER_CONTROL_TOKEN"
DATA_TOKEN_ENV = "BANDMASTER_DATA_TOKEN"
METRICS_TOKEN_ENV = "BANDMASTER_METRICS_TOKEN"
MIN_TOKEN_LENGTH = 16

# The role table (docs/security.md). Full gRPC method names: /package.Service/Method.
PUBLIC_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
DATA_METHODS = frozenset({"/bandmaster.router.v1.Router/Generate", "/bandmaster.router.v1.Router/Release"})
PUBLIC_HTTP_PATHS = frozenset({"/health"})


class Role(enum.Enum):
    PUBLIC = "public"
    DATA = "data"
    CONTROL = "control"


class Verdict(enum.Enum):
    ALLOW = "allow"
    UNAUTHENTICATED = "unauthenticated"  # no token, or one no role knows
    PERMISSION_DENIED = "permission_denied"  # a data token on a control RPC


def required_role(method: str) -> Role:
    if method in PUBLIC_METHODS:
        return Role.PUBLIC
    return Role.DATA if method in DATA_METHODS else Role.CONTROL


class Tokens:
    """The accepted bearer tokens of one role. The repr never shows them."""

    __slots__ = ("_values",)

    def __init__(self, values: Iterable[str]) -> None:
        self._values = tuple(v.encode("ascii") for v in values)
        if not self._values:
            raise ValueError("at least one token")

    def __repr__(self) -> str:
        return f"Tokens(<{len(self._values)} redacted>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokens) and self._values == other._values

    def __hash__(self) -> int:
        return hash(self._values)

    def matches(self, presented: bytes) -> bool:
        """Constant time in the presented token; every accepted token is compared (no early exit)."""
        found = False
        for value in self._values:
            found |= hmac.compare_digest(value, presented)
        return found

    def overlaps(self, other: "Tokens") -> bool:
        return any(other.matches(v) for v in self._values)

    @property
    def first(self) -> str:
        """The token outbound calls send."""
        return self._values[0].decode("ascii")


def bearer_of(authorization: str | None) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` value (scheme case-insensitive), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token.encode("utf-8", "surrogateescape")


def authorize(role: Role, presented: bytes | None, control: Tokens | None, data: Tokens | None) -> Verdict:
    """The one decision: may a caller presenting `presented` call an RPC (or path) of `role`?"""
    if role is Role.PUBLIC:
        return Verdict.ALLOW
    if role is Role.CONTROL and control is None:
        return Verdict.ALLOW
    if role is Role.DATA and data is None and control is None:
        return Verdict.ALLOW
    if role is Role.DATA and data is None:
        # Only a control token configured: the data plane is open (the operator did not ask for a token).
        return Verdict.ALLOW
    if presented is None:
        return Verdict.UNAUTHENTICATED
    # Both comparisons always run: the time taken does not say which role a token has.
    is_control = control.matches(presented) if control is not None else False
    is_data = data.matches(presented) if data is not None else False
    if is_control:
        return Verdict.ALLOW
    if is_data:
        return Verdict.ALLOW if role is Role.DATA else Verdict.PERMISSION_DENIED
    return Verdict.UNAUTHENTICATED


@dataclass(frozen=True)
class SecurityFlags:
    """The security group's flags, the same on every gRPC service (environment `<prefix>_TLS_CERT`, ...);
    `load_security` reads what they name."""

    tls_cert: str = setting(
        "",
        "PEM certificate chain this process presents: the gRPC server's (and the "
        "router's HTTPS port's) and, on outbound gRPC channels, the client certificate; needs --tls-key",
        env="{prefix}_TLS_CERT",
    )
    tls_key: str = setting("", "PEM private key of --tls-cert", env="{prefix}_TLS_KEY")
    tls_ca: str = setting(
        "",
        "PEM CA bundle: the gRPC server then requires client certificates signed by it "
        "(mutual TLS), and outbound channels verify servers against it (default: system roots)",
        env="{prefix}_TLS_CA",
    )
    control_token_file: str = setting(
        "",
        "file with the control-plane bearer token(s), one per line: "
        f"required on control RPCs and sent on outbound calls (or env {CONTROL_TOKEN_ENV})",
        env="{prefix}_CONTROL_TOKEN_FILE",
    )
    data_token_file: str = setting(
        "",
        "file with the data-plane bearer token(s), one per line: required on "
        f"the router's HTTP API and Generate/Release (or env {DATA_TOKEN_ENV})",
        env="{prefix}_DATA_TOKEN_FILE",
    )
    grpc_reflection: bool = setting(
        False,
        "serve gRPC server reflection (a control RPC when a control token is set)",
        env="{prefix}_GRPC_REFLECTION",
    )
    insecure: bool = setting(
        False,
        "allow the gRPC and /metrics ports on a non-loopback address without authentication (no mutual "
        "TLS or control token; no metrics token): anyone who reaches them may call them (docs/security.md)",
        env="{prefix}_INSECURE",
    )
    metrics_token_file: str = setting(
        "",
        "file with the bearer token(s) /metrics requires, one per line; the control token is accepted too "
        f"(or env {METRICS_TOKEN_ENV})",
        env="{prefix}_METRICS_TOKEN_FILE",
    )
    metrics_loopback: bool = setting(
        False, "serve /metrics on 127.0.0.1 only, whatever the listen host", env="{prefix}_METRICS_LOOPBACK"
    )


def security_group(prefix: str) -> Any:
    """A gRPC service's `security` field: `SecurityFlags` listed in its place (environment `<prefix>_*`),
    built by `load_security`."""
    return group(SecurityConfig(), flags=SecurityFlags, prefix=prefix, load=load_security)


# -- the bind rule -------------------------------------------------------------------------------


class Port(enum.Enum):
    """The kinds of control port the bind rule covers (the data-plane HTTP ports are not among them)."""

    GRPC = "gRPC"
    METRICS = "/metrics"


_SECURE_MEANS = {
    Port.GRPC: "secure here is mutual TLS (--tls-cert, --tls-key, --tls-ca) or a control token "
    f"(--control-token-file or {CONTROL_TOKEN_ENV})",
    Port.METRICS: f"secure here is a metrics token (--metrics-token-file or {METRICS_TOKEN_ENV}), "
    "or --metrics-loopback",
}


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; a wildcard (0.0.0.0, ::, "") or any other name is not."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(field_name: str, value: Any, host: str, port: Port, security: "SecurityConfig") -> None:
    """The bind rule: raise ConfigError(field_name, value, ...) when a control port would bind the
    non-loopback `host` with nobody checking who calls it and without `--insecure`."""
    if is_loopback(host) or security.insecure or security.guards(port):
        return
    raise ConfigError(
        field_name,
        value,
        f"binding {host or '0.0.0.0'} (not loopback) needs --secure or --insecure: {_SECURE_MEANS[port]}; "
        "--insecure opens the port to anyone who reaches it",
    )


def check_service_binds(listen: str, metrics_port: int, security: "SecurityConfig") -> None:
    """The bind rule over a service's gRPC `listen` address and its /metrics port (-1 = off)."""
    host, _ = parse_host_port(listen, "listen")
    check_bind("listen", listen, host, Port.GRPC, security)
    if metrics_port >= 0:
        check_bind("metrics_port", metrics_port, security.metrics_host(host), Port.METRICS, security)


# -- outbound channels ---------------------------------------------------------------------------


class _BearerDetails:
    def __init__(self, token: str) -> None:
        self._pair = ("authorization", f"Bearer {token}")

    def details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*tuple(d.metadata or ()), self._pair)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)


class _UnaryUnary(_BearerDetails, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self.details(client_call_details), request)


class _UnaryStream(_BearerDetails, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self.details(client_call_details), request)


class _StreamUnary(_BearerDetails, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self.details(client_call_details), request_iterator)


class _StreamStream(_BearerDetails, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self.details(client_call_details), request_iterator)


def bearer_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Client interceptors that add `authorization: Bearer <token>` to every call of a channel."""
    return [_UnaryUnary(token), _UnaryStream(token), _StreamUnary(token), _StreamStream(token)]


# -- the server side -----------------------------------------------------------------------------


def _refusal(
    handler: grpc.RpcMethodHandler,
    code: grpc.StatusCode,
    details: str,
    on_call: Callable[[grpc.aio.ServicerContext], None] | None = None,
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only aborts with `code` (after `on_call(context)`,
    which sees the peer)."""

    async def unary(_request: Any, context: grpc.aio.ServicerContext) -> None:
        if on_call is not None:
            on_call(context)
        await context.abort(code, details)

    async def streaming(_request: Any, context: grpc.aio.ServicerContext):
        if on_call is not None:
            on_call(context)
        await context.abort(code, details)
        yield  # pragma: no cover - abort raises

    behavior = streaming if handler.response_streaming else unary
    factory = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return factory(
        behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


def refusal_reason(role: Role, verdict: Verdict, authorization: str | None, *, http: bool = False) -> str:
    """What was wrong with a refused call's credentials, in words for the caller and the server log (gRPC
    metadata, or with `http` the HTTP header). It never quotes what was presented."""
    wanted = "the control token" if role is Role.CONTROL else "the data or control token"
    carrier, send = ("Authorization header", "Authorization") if http else ("authorization metadata", "authorization")
    if verdict is Verdict.PERMISSION_DENIED:
        return "a data-plane token may not call control RPCs: send the control token"
    if authorization is None:
        return f"missing {carrier}: send `{send}: Bearer <token>` with {wanted}"
    if bearer_of(authorization) is None:
        return f"{carrier} is not `Bearer <token>`: send `{send}: Bearer <token>` with {wanted}"
    return f"bearer token not accepted: it is not {wanted} of this service"


REFUSAL_LOG_INTERVAL_S = 60.0


class OncePer:
    """Says yes to a key at most once per `interval_s` (by the injected clock): one log line per peer and
    reason a minute, however many calls a misconfigured client makes. Holds at most `max_keys` keys."""

    def __init__(self, interval_s: float, clock: Callable[[], float], max_keys: int = 1024) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._last: dict[Any, float] = {}

    def __call__(self, key: Any) -> bool:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        if len(self._last) >= self._max_keys:
            self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
            if len(self._last) >= self._max_keys:
                return False  # a flood of distinct peers: stay quiet rather than grow
        self._last[key] = now
        return True


# One for the process: the batch service builds its guard per request.
_HTTP_REFUSAL_LOG = OncePer(REFUSAL_LOG_INTERVAL_S, time.monotonic)


def peer_host(peer: str) -> str:
    """grpc's peer string without the client's port ("ipv4:127.0.0.1:53012" -> "ipv4:127.0.0.1")."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Checks the `authorization` metadata of every call against the role table (`authorize`). A refused
    call ends UNAUTHENTICATED (or PERMISSION_DENIED) with details saying what was wrong, and a WARNING names
    the peer and the reason, at most once per peer and reason per `REFUSAL_LOG_INTERVAL_S`."""

    def __init__(
        self,
        control: Tokens | None,
        data: Tokens | None,
        on_refusal: Callable[[str, Verdict], None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.control = control
        self.data = data
        self._on_refusal = on_refusal
        self._log_once = OncePer(REFUSAL_LOG_INTERVAL_S, clock or time.monotonic)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        authorization = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                authorization = value if isinstance(value, str) else value.decode("latin-1")
                break
        role = required_role(method)
        verdict = authorize(role, bearer_of(authorization), self.control, self.data)
        if verdict is Verdict.ALLOW:
            return handler
        if self._on_refusal is not None:
            self._on_refusal("grpc", verdict)
        reason = refusal_reason(role, verdict, authorization)
        code = (
            grpc.StatusCode.PERMISSION_DENIED
            if verdict is Verdict.PERMISSION_DENIED
            else grpc.StatusCode.UNAUTHENTICATED
        )

        def note(context: grpc.aio.ServicerContext) -> None:
            peer = peer_host(context.peer() or "unknown peer")
            if self._log_once((peer, reason)):
                log.warning("refused %s from %s: %s (logged once a minute per peer and reason)", method, peer, reason)
            else:
                log.debug("refused %s from %s: %s", method, peer, reason)

        return _refusal(handler, code, reason, note)


# -- the HTTP side (the router's OpenAI API) -----------------------------------------------------

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def openai_auth_error(
    verdict: Verdict, headers: Mapping[str, str] | None = None, reason: str | None = None
) -> web.Response:
    """What OpenAI answers for a missing/invalid key (401) or a key without the permission (403); `reason`
    (`refusal_reason`) says which, when the caller knows."""
    if verdict is Verdict.PERMISSION_DENIED:
        status, message, code = 403, "this token may not use this endpoint", "insufficient_permissions"
    else:
        status, message, code = (
            401,
            reason or "missing or invalid bearer token (Authorization: Bearer <token>)",
            "invalid_api_key",
        )
    body = error_body(message, code=code)
    return web.Response(
        status=status,
        text=json.dumps(body),
        content_type="application/json",
        headers={**(headers or {}), "WWW-Authenticate": 'Bearer realm="bandmaster"'},
    )


def bearer_guard(
    handler: Handler,
    control: Tokens | None,
    data: Tokens | None,
    *,
    headers: Mapping[str, str] | None = None,
    public_paths: frozenset[str] = PUBLIC_HTTP_PATHS,
    on_refusal: Callable[[str, Verdict], None] | None = None,
    log_once: OncePer | None = None,
) -> Handler:
    """`handler` behind the data-plane bearer token: every path but `public_paths` needs a data (or
    control) token when one is configured; otherwise OpenAI-style 401 JSON saying what was wrong, before
    the body is read, and a WARNING (peer and reason, `log_once`: by default once a minute per peer and
    reason across the process)."""
    if data is None and control is None:
        return handler
    once = log_once or _HTTP_REFUSAL_LOG

    async def guarded(request: web.BaseRequest) -> web.StreamResponse:
        if request.path in public_paths:
            return await handler(request)
        authorization = request.headers.get("Authorization")
        verdict = authorize(Role.DATA, bearer_of(authorization), control, data)
        if verdict is not Verdict.ALLOW:
            if on_refusal is not None:
                on_refusal("http", verdict)
            reason = refusal_reason(Role.DATA, verdict, authorization, http=True)
            peer = request.remote or "unknown peer"
            if once((peer, reason)):
                log.warning(
                    "refused %s %s from %s: %s (logged once a minute per peer and reason)",
                    request.method,
                    request.path,
                    peer,
                    reason,
                )
            return openai_auth_error(verdict, headers, reason)
        return await handler(request)

    return guarded


def metrics_guard(
    handler: Handler,
    metrics: Tokens | None,
    control: Tokens | None,
    on_refusal: Callable[[str, Verdict], None] | None = None,
) -> Handler:
    """`handler` (a /metrics page) behind the metrics token when one is configured: a metrics token or the
    control token is accepted (Prometheus sends `Authorization: Bearer` from its `authorization`
    credentials); otherwise 401 JSON that never quotes what was presented."""
    if metrics is None:
        return handler

    async def guarded(request: web.BaseRequest) -> web.StreamResponse:
        presented = bearer_of(request.headers.get("Authorization"))
        # Both comparisons always run, in constant time: the time taken does not say which token matched.
        allowed = presented is not None and (
            metrics.matches(presented) | (control.matches(presented) if control is not None else False)
        )
        if not allowed:
            if on_refusal is not None:
                on_refusal("metrics", Verdict.UNAUTHENTICATED)
            return openai_auth_error(Verdict.UNAUTHENTICATED)
        return await handler(request)

    return guarded


# -- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SecurityConfig:
    """What a service serves and dials with. The default is plaintext, no tokens, no reflection.

    A CA without a certificate only makes sense for a client (verify servers, present nothing);
    `load_security` refuses it for a service."""

    tls_cert: str = ""
    """Path of the certificate chain (for messages); the PEM bytes are in `cert_pem`."""
    tls_key: str = ""
    tls_ca: str = ""
    cert_pem: bytes | None = field(default=None, repr=False)
    key_pem: bytes | None = field(default=None, repr=False)
    ca_pem: bytes | None = field(default=None, repr=False)
    control_tokens: Tokens | None = None
    """Accepted on control RPCs (and data ones); the first is sent on outbound calls."""
    data_tokens: Tokens | None = None
    """Accepted on data-plane RPCs and the router's HTTP API only."""
    grpc_reflection: bool = False
    insecure: bool = False
    """`--insecure`: control ports may bind a non-loopback address unauthenticated (`check_bind`)."""
    metrics_tokens: Tokens | None = None
    """Required on /metrics (the control token is accepted too); None = /metrics is open."""
    metrics_loopback: bool = False
    """Serve /metrics on 127.0.0.1 whatever the listen host."""
    notes: tuple[str, ...] = ()
    """Warnings found while loading (a group/world-readable token file), logged when the service starts."""

    def __post_init__(self) -> None:
        if (self.cert_pem is None) != (self.key_pem is None):
            raise ConfigError(
                "tls_key" if self.key_pem is None else "tls_cert", "", "--tls-cert and --tls-key go together"
            )
        if (
            self.control_tokens is not None
            and self.data_tokens is not None
            and self.control_tokens.overlaps(self.data_tokens)
        ):
            raise ConfigError(
                "data_token_file",
                "<redacted>",
                "the data token must differ from the control token "
                "(otherwise data-plane clients could call control RPCs)",
            )

    @property
    def tls(self) -> bool:
        return self.cert_pem is not None

    def guards(self, port: Port) -> bool:
        """Whether this service authenticates the callers of `port` (the bind rule's "secure")."""
        if port is Port.GRPC:
            return self.mutual_tls or self.control_tokens is not None
        return self.metrics_tokens is not None

    def metrics_host(self, listen_host: str) -> str:
        """Where /metrics binds: the listen host, or loopback with `--metrics-loopback`."""
        return "127.0.0.1" if self.metrics_loopback else listen_host

    @property
    def mutual_tls(self) -> bool:
        """A server with a CA asks every client for a certificate signed by it."""
        return self.tls and self.ca_pem is not None

    @property
    def outbound_tls(self) -> bool:
        return self.cert_pem is not None or self.ca_pem is not None

    def describe(self) -> str:
        """The start log line's summary, e.g. 'mTLS, control token, data token'."""
        parts = ["mTLS" if self.mutual_tls else "TLS" if self.tls else "plaintext"]
        if self.control_tokens is not None:
            parts.append("control token")
        if self.data_tokens is not None:
            parts.append("data token")
        if self.metrics_tokens is not None:
            parts.append("metrics token")
        if self.grpc_reflection:
            parts.append("reflection")
        if self.insecure:
            parts.append("--insecure")
        return ", ".join(parts)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem, require_client_auth=self.mutual_tls
        )

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not self.outbound_tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    def server_interceptor(self, on_refusal: Callable[[str, Verdict], None] | None = None) -> TokenInterceptor | None:
        if self.control_tokens is None and self.data_tokens is None:
            return None
        return TokenInterceptor(self.control_tokens, self.data_tokens, on_refusal)

    def channel(
        self,
        address: str,
        options: Sequence[tuple[str, Any]] | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> grpc.aio.Channel:
        """An outbound channel to `address`: TLS (with this process's client certificate) when TLS is
        configured, and the first control token on every call when one is; `interceptors` (tracing) first."""
        chain = list(interceptors)
        if self.control_tokens is not None:
            chain.extend(bearer_interceptors(self.control_tokens.first))
        outbound = chain or None
        credentials = self.channel_credentials()
        if credentials is None:
            return grpc.aio.insecure_channel(address, options=options, interceptors=outbound)
        return grpc.aio.secure_channel(address, credentials, options=options, interceptors=outbound)

    def http_ssl_context(self) -> ssl.SSLContext | None:
        """Server-side TLS for an HTTP port (no client certificate asked: the bearer token authenticates)."""
        if not self.tls:
            return None
        assert self.cert_pem is not None and self.key_pem is not None
        return _server_context(self.tls_cert, self.tls_key)


def _server_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_path, key_path)
    return context


def _read(field_name: str, path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError(field_name, path, f"cannot read: {exc.strerror or exc}") from None
    if not data.strip():
        raise ConfigError(field_name, path, "the file is empty")
    return data


def _check_pem(values: Mapping[str, str]) -> None:
    """Parse the files the way TLS will use them, so that a wrong file is refused at start, by name."""
    cert, key, ca = values["tls_cert"], values["tls_key"], values["tls_ca"]
    if cert:
        try:
            _server_context(cert, key)
        except ssl.SSLError as exc:
            raise ConfigError(
                "tls_key", key, f"not a PEM private key matching --tls-cert ({exc.reason or exc})"
            ) from None
    if ca:
        try:
            ssl.create_default_context(cafile=ca)
        except ssl.SSLError as exc:
            raise ConfigError("tls_ca", ca, f"not a PEM CA bundle ({exc.reason or exc})") from None


def _parse_tokens(field_name: str, shown: str, text: str) -> Tokens:
    tokens = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not tokens:
        raise ConfigError(field_name, shown, "no token (the file is empty or only comments)")
    for i, token in enumerate(tokens, 1):
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(field_name, shown, f"token {i} is shorter than {MIN_TOKEN_LENGTH} characters")
        if not all(0x21 <= ord(c) <= 0x7E for c in token):
            raise ConfigError(field_name, shown, f"token {i} must be printable ASCII without spaces")
    return Tokens(tokens)


def _load_tokens(field_name: str, path: str, env_name: str, env: Mapping[str, str], notes: list[str]) -> Tokens | None:
    from_env = env.get(env_name, "").strip()
    if path and from_env:
        raise ConfigError(
            field_name, path, f"give the token by --{field_name.replace('_', '-')} or {env_name}, not both"
        )
    if from_env:
        return _parse_tokens(env_name, "<redacted>", from_env)
    if not path:
        return None
    return _parse_tokens(field_name, path, load_secret_file(field_name, path, notes))


def load_secret_file(field_name: str, path: str, notes: list[str] | None = None) -> str:
    """The ASCII text of a file holding secrets: refused when other users may write it (ConfigError), a
    note in `notes` when they may read it."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(field_name, path, f"cannot read: {exc.strerror or exc}") from None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(field_name, path, f"writable by other users (mode {stat.S_IMODE(mode):o}): chmod 600")
    if mode & (stat.S_IRGRP | stat.S_IROTH) and notes is not None:
        notes.append(f"{field_name} {path} is readable by other users (mode {stat.S_IMODE(mode):o}); chmod 600")
    try:
        return _read(field_name, path).decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(field_name, path, "tokens must be printable ASCII") from None


def load_security(values: dict[str, Any], env: Mapping[str, str]) -> SecurityConfig:
    """Pop the security group out of `values` (from `parse_settings`), read and check every file it
    names, and return the config. Raises ConfigError naming the setting and the rule."""
    raw = pop_group(values, SecurityFlags)
    if bool(raw["tls_cert"]) != bool(raw["tls_key"]):
        missing = "tls_key" if raw["tls_cert"] else "tls_cert"
        raise ConfigError(missing, "", "--tls-cert and --tls-key go together")
    if raw["tls_ca"] and not raw["tls_cert"]:
        raise ConfigError(
            "tls_ca",
            raw["tls_ca"],
            "--tls-ca (mutual TLS) needs --tls-cert and --tls-key: the server must present a certificate of its own",
        )
    pem = {name: _read(name, raw[name]) if raw[name] else None for name in ("tls_cert", "tls_key", "tls_ca")}
    _check_pem(raw)
    notes: list[str] = []
    control = _load_tokens("control_token_file", raw["control_token_file"], CONTROL_TOKEN_ENV, env, notes)
    data = _load_tokens("data_token_file", raw["data_token_file"], DATA_TOKEN_ENV, env, notes)
    metrics = _load_tokens("metrics_token_file", raw["metrics_token_file"], METRICS_TOKEN_ENV, env, notes)
    security = SecurityConfig(
        tls_cert=raw["tls_cert"],
        tls_key=raw["tls_key"],
        tls_ca=raw["tls_ca"],
        cert_pem=pem["tls_cert"],
        key_pem=pem["tls_key"],
        ca_pem=pem["tls_ca"],
        control_tokens=control,
        data_tokens=data,
        grpc_reflection=bool(raw["grpc_reflection"]),
        insecure=bool(raw["insecure"]),
        metrics_tokens=metrics,
        metrics_loopback=bool(raw["metrics_loopback"]),
        notes=tuple(notes),
    )
    if "listen" in values:  # a serving process: the bind rule, before anything starts
        check_service_binds(values["listen"], values.get("metrics_port", -1), security)
    return security


def client_security(
    *,
    tls_ca: str = "",
    tls_cert: str = "",
    tls_key: str = "",
    control_token_file: str = "",
    env: Mapping[str, str] | None = None,
) -> SecurityConfig:
    """For client-only tools (the CLI, tests): `--tls-ca` alone (verify the server, present no
    certificate) is allowed here."""
    if bool(tls_cert) != bool(tls_key):
        raise ConfigError("tls_key" if tls_cert else "tls_cert", "", "--tls-cert and --tls-key go together")
    pem = {
        name: _read(name, path) if path else None
        for name, path in (("tls_cert", tls_cert), ("tls_key", tls_key), ("tls_ca", tls_ca))
    }
    control = _load_tokens("control_token_file", control_token_file, CONTROL_TOKEN_ENV, env or {}, [])
    return SecurityConfig(
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_ca=tls_ca,
        cert_pem=pem["tls_cert"],
        key_pem=pem["tls_key"],
        ca_pem=pem["tls_ca"],
        control_tokens=control,
    )


def log_posture(name: str, security: SecurityConfig, host: str) -> None:
    """One INFO line of what protects the service, and the warnings an operator should see."""
    for note in security.notes:
        log.warning("%s: %s", name, note)
    loopback = is_loopback(host)
    if not loopback and not security.guards(Port.GRPC):
        log.warning(
            "%s listens on %s with --insecure and no control token: anyone who reaches the port may call its "
            "control RPCs (see docs/security.md)",
            name,
            host,
        )
    if not loopback and not security.tls and (security.control_tokens or security.data_tokens):
        log.warning("%s: bearer tokens travel in clear text on %s; give --tls-cert/--tls-key", name, host)
