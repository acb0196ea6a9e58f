"""gRPC server bootstrap shared by every service.

`ServiceHost` owns the pieces every service has: a `grpc.aio` server with `grpc.health.v1` (and
reflection when `--grpc-reflection` asks for it), TLS / mutual TLS and the bearer-token interceptor
from the service's `SecurityConfig`, a Prometheus `/metrics` HTTP endpoint, and graceful shutdown in
the right order: health -> NOT_SERVING, stop background loops, `server.stop(grace)`, flush telemetry.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
from typing import Any, AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Protocol

import grpc
from aiohttp import web
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from services.common.auth.security import SecurityConfig, Verdict, check_service_binds, log_posture, metrics_guard
from services.common.observe.loop_lag import LoopLag
from services.common.observe.process_metrics import register_process_metrics
from services.common.observe.telemetry import Telemetry, grpc_server_tracing
from services.common.process.ready import write_ready_file
from services.common.serve.ports import PortInUse, binding, port_free, require_free
from services.common.settings.config import parse_host_port
from services.common.web.http_errors import json_errors

log = logging.getLogger(__name__)

Stopper = Callable[[], Awaitable[None]]


MAX_DETAILS_BYTES = 1000
"""Status details longer than this (UTF-8) are cut: an error that quotes a long client value would otherwise
exceed the client's metadata limit once percent-encoded (up to 3 characters a byte), and the client would see
RESOURCE_EXHAUSTED instead of the real status."""


class _Malformed:
    """What the guarded deserializer returns for bytes that are not a valid request message."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _ClippedContext:
    """The servicer context, with `abort` details cut to MAX_DETAILS_BYTES."""

    __slots__ = ("_context",)

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        encoded = details.encode("utf-8", "replace")
        if len(encoded) > MAX_DETAILS_BYTES:
            details = encoded[: MAX_DETAILS_BYTES - 3].decode("utf-8", "ignore") + "..."
        await self._context.abort(code, details, trailing_metadata)


class RequestGuard(grpc.aio.ServerInterceptor):
    """What every unary-request handler, and every two-way stream served by a coroutine (AdmitMux), gets
    from the host:

    * a request message that does not parse (corrupt wire format, a string field that is not UTF-8, as any
      client but this project's can send) ends INVALID_ARGUMENT instead of UNKNOWN with an ERROR traceback:
      the guarded deserializer returns a marker that the handler turns into the abort (on a stream: the
      stream's reader, at that message);
    * the details of an abort are cut to MAX_DETAILS_BYTES."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        deserialize = handler.request_deserializer

        def guarded(data: bytes) -> Any:
            try:
                return deserialize(data)
            except DecodeError as exc:
                return _Malformed(str(exc))

        async def refuse(request: _Malformed, context: grpc.aio.ServicerContext) -> None:
            log.debug("refused a malformed %s request: %s", handler_call_details.method, request.reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request message: {request.reason}")

        if handler.request_streaming:
            if not handler.response_streaming or inspect.isasyncgenfunction(handler.stream_stream):
                return handler  # none served (a client-stream call, a generator-style bidi handler)
            inner_stream = handler.stream_stream

            async def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async for request in requests:
                    if isinstance(request, _Malformed):
                        await refuse(request, context)  # ends the call INVALID_ARGUMENT (raises)
                    yield request

            async def bidi(request_iterator, context):
                context = _ClippedContext(context)
                return await inner_stream(checked(request_iterator, context), context)

            return grpc.stream_stream_rpc_method_handler(
                bidi, request_deserializer=guarded, response_serializer=handler.response_serializer
            )
        if handler.response_streaming:
            inner = handler.unary_stream
            if inspect.isasyncgenfunction(inner):

                async def streamed(request, context):
                    context = _ClippedContext(context)
                    if isinstance(request, _Malformed):
                        await refuse(request, context)
                    responses = inner(request, context)
                    try:
                        async for item in responses:
                            yield item
                    finally:
                        # Closed here, in the call's task: left to the garbage collector, its cleanup (a span's
                        # context among it) would run later in another task.
                        await responses.aclose()

                unary_stream: Callable[..., Any] = streamed
            else:

                async def returned(request, context):
                    context = _ClippedContext(context)
                    if isinstance(request, _Malformed):
                        await refuse(request, context)
                    return await inner(request, context)

                unary_stream = returned

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=guarded, response_serializer=handler.response_serializer
            )
        inner = handler.unary_unary

        async def unary_unary(request, context):
            context = _ClippedContext(context)
            if isinstance(request, _Malformed):
                await refuse(request, context)
            result = inner(request, context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, request_deserializer=guarded, response_serializer=handler.response_serializer
        )


class _Health(health.aio.HealthServicer):
    """grpc's asyncio health servicer, and `List` refused as UNIMPLEMENTED: the generated service has the
    method but grpc's servicer does not implement it, so a call ended UNKNOWN with an ERROR traceback."""

    async def List(self, request, context) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "grpc.health.v1.Health/List is not served")


class ServiceHost:
    """One service's listening endpoints and lifecycle."""

    def __init__(
        self,
        name: str,
        *,
        listen: str = "127.0.0.1:0",
        metrics_port: int = 0,
        registry: CollectorRegistry | None = None,
        telemetry: Telemetry | None = None,
        shutdown_grace_seconds: float = 5.0,
        interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
        security: SecurityConfig | None = None,
        reuse_port: bool = False,
        trace_calls: bool = True,
    ) -> None:
        """`reuse_port`: bind the gRPC port with SO_REUSEPORT and skip the taken-port check, for one of
        several processes that share the port (the router's `--processes`: its parent checked the port).
        `trace_calls=False`: no SERVER span per unary call (a process whose spans nobody exports and whose
        calls make no outbound call a span could be the parent of: the scheduler, see `_host` there)."""
        self.name = name
        self.reuse_port = reuse_port
        self.host, self._port = parse_host_port(listen, "listen")
        self._metrics_port_wanted = metrics_port
        self.registry = registry or CollectorRegistry()
        register_process_metrics(self.registry, name)
        self.telemetry = telemetry
        self.grace = shutdown_grace_seconds
        self.security = security or SecurityConfig()
        # The bind rule (load_config checks it first; here too, so that no composition path skips it).
        check_service_binds(listen, metrics_port, self.security)
        self.metrics_host = self.security.metrics_host(self.host)
        self.auth_refusals = Counter(
            "bandmaster_auth_refusals",
            "calls refused for a missing, unknown or under-privileged bearer token",
            ["interface", "reason"],
            registry=self.registry,
        )
        token_check = self.security.server_interceptor(self.count_refusal)
        # The token check runs first: a refused call reaches no other interceptor. The request guard wraps
        # every handler (the refusal too), so a message that does not parse is INVALID_ARGUMENT.
        # Tracing (unary calls; the global provider without `telemetry`) wraps the guard, so a refused
        # malformed request is a span with its status too.
        chain: list[grpc.aio.ServerInterceptor] = [RequestGuard(), *interceptors]
        if trace_calls:
            chain.insert(0, telemetry.grpc_server_interceptor() if telemetry is not None else grpc_server_tracing())
        if token_check is not None:
            chain.insert(0, token_check)
        # No SO_REUSEPORT (grpc's default) unless asked: a second process on the same port must fail, not
        # share it.
        self.server = grpc.aio.server(interceptors=chain, options=[("grpc.so_reuseport", int(reuse_port))])
        self.health = _Health()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._service_names: list[str] = []
        self._stoppers: list[Stopper] = []
        self._http_runner: web.AppRunner | None = None
        self.http_app = web.Application(middlewares=[json_errors])
        self.http_app.router.add_get(
            "/metrics",
            metrics_guard(
                self._metrics, self.security.metrics_tokens, self.security.control_tokens, self.count_refusal
            ),
        )
        self.grpc_port = 0
        self.metrics_port = 0
        self._stopped = asyncio.Event()
        self.loop_lag = LoopLag(name, self.registry)

    def count_refusal(self, interface: str, verdict: Verdict) -> None:
        self.auth_refusals.labels(interface, verdict.value).inc()

    def add_service(self, full_name: str) -> None:
        """Record a service added to `self.server` (for health and reflection)."""
        self._service_names.append(full_name)

    def on_stop(self, stopper: Stopper) -> None:
        """Run `stopper` during shutdown, after health goes NOT_SERVING and before the server stops."""
        self._stoppers.append(stopper)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    async def _metrics(self, _request: web.BaseRequest) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def check_ports(self) -> None:
        """Raise PortInUse when the gRPC or metrics port is taken: called by `start`, and by a service before it
        builds anything that would need closing. A taken port is then one clear line, not grpc's own error log
        and a RuntimeError."""
        if self.reuse_port:
            return  # shared on purpose, with a port the parent process checked
        require_free(self.host, self._port, f"{self.name} gRPC", "--listen")
        if self._metrics_port_wanted > 0:
            require_free(self.metrics_host, self._metrics_port_wanted, f"{self.name} /metrics", "--metrics-port")

    async def start(self) -> None:
        if self.security.grpc_reflection:
            reflection.enable_server_reflection(
                [
                    *self._service_names,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    reflection.SERVICE_NAME,
                ],
                self.server,
            )
        bind = f"[{self.host}]:{self._port}" if ":" in self.host else f"{self.host}:{self._port}"
        credentials = self.security.server_credentials()
        self.check_ports()
        try:
            if credentials is None:
                self.grpc_port = self.server.add_insecure_port(bind)
            else:
                self.grpc_port = self.server.add_secure_port(bind, credentials)
        except RuntimeError:  # grpc's "Failed to bind": taken between the check and the bind
            if self._port and not port_free(self.host, self._port):
                raise PortInUse(self.host, self._port, f"{self.name} gRPC", "--listen") from None
            raise
        if self.grpc_port == 0:
            raise OSError(f"{self.name}: could not bind gRPC on {bind}")
        await self.server.start()
        self.loop_lag.start()
        if self._metrics_port_wanted >= 0:
            self._http_runner = web.AppRunner(self.http_app, access_log=None)
            await self._http_runner.setup()
            site = web.TCPSite(self._http_runner, self.metrics_host, self._metrics_port_wanted)
            with binding(self.metrics_host, self._metrics_port_wanted, f"{self.name} /metrics", "--metrics-port"):
                await site.start()
            self.metrics_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        for service in ["", *self._service_names]:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log_posture(self.name, self.security, self.host)
        log.info(
            "%s serving gRPC on %s (%s), metrics on port %s",
            self.name,
            self.address,
            self.security.describe(),
            self.metrics_port or "off",
        )

    def write_ready_file(self, path: str) -> None:
        """Publish the bound ports atomically for a supervising process."""
        write_ready_file(
            path, {"service": self.name, "grpc": self.address, "metrics_port": self.metrics_port, "pid": os.getpid()}
        )

    async def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        log.info("%s shutting down", self.name)
        await self.health.enter_graceful_shutdown()
        for stopper in reversed(self._stoppers):
            try:
                await stopper()
            except Exception:
                log.exception("%s: error while stopping a component", self.name)
        await self.server.stop(self.grace)
        await self.loop_lag.stop()
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self.telemetry is not None:
            self.telemetry.shutdown()
        log.info("%s stopped", self.name)

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()


class Stoppable(Protocol):
    """What `serve_until_signal` stops: a ServiceHost, or a service without one (the simworker)."""

    async def stop(self) -> None: ...


async def serve_until_signal(host: Stoppable) -> None:
    """Block until SIGINT/SIGTERM, then shut the host down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await host.stop()


def run(main: Callable[[], Coroutine[Any, Any, int | None]]) -> int:
    """Run an async entry point on uvloop and return its exit code."""
    import uvloop

    result = uvloop.run(main())
    return int(result or 0)
