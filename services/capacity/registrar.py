"""Worker registrar: keeps one worker registered with the capacity service for as long as it runs.

`python -m services.capacity.registrar --capacity-addr capacity:50051 --worker-url http://10.1.2.3:30000`

For platforms where workers come and go on their own, such as a Kubernetes worker Deployment that
the planner scales: the registrar runs beside the worker (a sidecar container in the same pod) and

* waits until the worker's own `/health` answers 200 (a loading SGLang server can take minutes, and
  a worker registered before it listens would be polled into UNHEALTHY and, past
  `--remove-unhealthy-after-seconds`, removed), unless `--no-wait-for-health`; an https worker is
  verified and the workers' API key is sent (services/common/sglang/worker_client.py);
* then calls `RegisterWorker`, retrying until the capacity service answers;
* calls it again every `--interval-seconds`. Registration is idempotent for the same id and URL, and
  the capacity service keeps its registry in memory, so a restarted capacity service learns the
  worker back within one interval;
* on SIGTERM/SIGINT calls `DeregisterWorker` once (bounded by `--timeout-seconds`) and exits 0, so a
  worker being scaled down leaves the routers' worker set before it stops serving.

Registering a URL does not vouch for the worker: the capacity service polls it and counts it only
once its `/server_info` and `/health` answer. A registration refused as invalid (a malformed URL, an
id or URL taken by another worker) is logged and retried: a stale entry for a reused pod address
disappears when the capacity service removes unhealthy RPC-registered workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import aiohttp
import grpc

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from services.capacity.config import validate_worker_id, validate_worker_url, worker_id_for
from services.common.auth.redact import redact_url
from services.common.auth.security import SecurityConfig, client_security
from services.common.observe.logs import setup_logging
from services.common.settings.config import (
    LOG_LEVELS,
    Setting,
    check_bounds,
    group,
    load_groups,
    parse_host_port,
    parse_settings,
    pop_group,
    require,
    setting,
    settings_of,
)
from services.common.settings.errors import ConfigError
from services.common.sglang.worker_client import WorkerClientConfig, worker_client_group

log = logging.getLogger("services.capacity.registrar")

ENV_PREFIX = "BANDMASTER_REGISTRAR"
PROG = "python -m services.capacity.registrar"
HEALTH_POLL_SECONDS = 1.0


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper()}"


@dataclass(frozen=True)
class ClientSecurityFlags:
    """The flags `client_security` builds the registrar's SecurityConfig from."""

    tls_ca: str = setting("", "PEM CA bundle to verify the capacity service with (turns TLS on)", env=_env("tls_ca"))
    tls_cert: str = setting("", "PEM client certificate (mutual TLS); needs --tls-key", env=_env("tls_cert"))
    tls_key: str = setting("", "PEM private key of --tls-cert", env=_env("tls_key"))
    control_token_file: str = setting(
        "",
        "file with the control-plane bearer token sent on every call (or env BANDMASTER_CONTROL_TOKEN)",
        env=_env("control_token_file"),
    )


def _load_client_security(values: dict[str, Any], env: Mapping[str, str]) -> SecurityConfig:
    return client_security(**pop_group(values, ClientSecurityFlags), env=env)


@dataclass(frozen=True)
class RegistrarConfig:
    """Each `setting()` field is also a flag and a BANDMASTER_REGISTRAR_* variable (declared once, here)."""

    capacity_addr: str = setting(
        "127.0.0.1:50051", "capacity service gRPC address host:port", env=_env("capacity_addr")
    )
    worker_url: str = setting(
        "", "base URL of the worker to register, http(s)://host:port (required)", env=_env("worker_url")
    )
    """Canonical (`load_config` validates it)."""
    worker_id: str = setting("", "worker id (default: host:port of --worker-url)", env=_env("worker_id"))
    interval_seconds: float = setting(
        10.0, "seconds between re-registrations (covers a capacity restart)", env=_env("interval_seconds"), gt=0
    )
    timeout_seconds: float = setting(
        2.0, "deadline of each RegisterWorker / DeregisterWorker call and health check", env=_env("timeout_seconds")
    )
    wait_for_health: bool = setting(
        True, "register only once the worker's /health has answered 200", env=_env("wait_for_health")
    )
    log_level: str = setting("INFO", "log level", env=_env("log_level"), choices=LOG_LEVELS)
    security: SecurityConfig = group(SecurityConfig(), flags=ClientSecurityFlags, load=_load_client_security)
    worker_client: WorkerClientConfig = worker_client_group(ENV_PREFIX)

    def __post_init__(self) -> None:
        check_bounds(self)
        parse_host_port(self.capacity_addr, "capacity_addr")
        require(
            0 < self.timeout_seconds <= self.interval_seconds,
            "timeout_seconds",
            self.timeout_seconds,
            "0 < timeout_seconds <= interval_seconds",
        )


SETTINGS: list[Setting] = settings_of(RegistrarConfig)
"""The flags and environment variables: RegistrarConfig's fields and groups (TLS and token to the capacity
service, then the workers' API key and TLS)."""


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> RegistrarConfig:
    """Flags and environment -> validated config. Raises ConfigError naming the violated rule."""
    values = parse_settings(
        SETTINGS, argv, env, prog=PROG, description="Keep one worker registered with the Bandmaster capacity service"
    )
    require(bool(values["worker_url"]), "worker_url", "", "--worker-url is required")
    try:
        url = validate_worker_url(values["worker_url"])
        worker_id = validate_worker_id(values["worker_id"] or worker_id_for(url))
    except ValueError as exc:
        raise ConfigError("worker_url", redact_url(values["worker_url"]), str(exc)) from None
    load_groups(RegistrarConfig, values, env)  # TLS and token to the capacity service, the workers' key and TLS
    values.update(worker_url=url, worker_id=worker_id)
    return RegistrarConfig(**values)


class Registrar:
    """Register, keep registered, deregister on `stop()`."""

    def __init__(self, config: RegistrarConfig) -> None:
        self.config = config
        self.registrations = 0
        """Successful RegisterWorker calls (for tests and the log)."""
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        c = self.config
        if c.wait_for_health and not await self._wait_until_healthy():
            return  # stopped before the worker came up: nothing was registered
        async with c.security.channel(c.capacity_addr) as channel:
            stub = pb_grpc.CapacityStub(channel)
            try:
                while not self._stop.is_set():
                    await self._register(stub)
                    try:
                        await asyncio.wait_for(self._stop.wait(), c.interval_seconds)
                    except TimeoutError:
                        pass
            finally:
                await self._deregister(stub)

    async def _wait_until_healthy(self) -> bool:
        """Poll the worker's /health once a second until it answers 200; False if stopped first."""
        c = self.config
        url = f"{c.worker_url}/health"
        timeout = aiohttp.ClientTimeout(total=c.timeout_seconds)
        log.info("waiting for %s to answer 200 before registering", redact_url(url))
        connector = aiohttp.TCPConnector(ssl=c.worker_client.ssl_context())
        async with aiohttp.ClientSession(
            timeout=timeout, connector=connector, headers=c.worker_client.headers
        ) as session:
            while not self._stop.is_set():
                try:
                    async with session.get(url) as response:
                        if response.status == 200:
                            return True
                except (aiohttp.ClientError, TimeoutError):
                    pass
                try:
                    await asyncio.wait_for(self._stop.wait(), HEALTH_POLL_SECONDS)
                except TimeoutError:
                    pass
        return False

    async def _register(self, stub: pb_grpc.CapacityStub) -> None:
        c = self.config
        try:
            await stub.RegisterWorker(
                pb.RegisterWorkerRequest(url=c.worker_url, worker_id=c.worker_id), timeout=c.timeout_seconds
            )
        except grpc.aio.AioRpcError as exc:
            # Logged at WARNING every interval while it lasts: the worker is invisible to the routers.
            log.warning(
                "registering %s as %s with %s failed: %s %s",
                redact_url(c.worker_url),
                c.worker_id,
                c.capacity_addr,
                exc.code().name,
                exc.details(),
            )
            return
        if self.registrations == 0:
            log.info("registered %s as %s with %s", redact_url(c.worker_url), c.worker_id, c.capacity_addr)
        self.registrations += 1

    async def _deregister(self, stub: pb_grpc.CapacityStub) -> None:
        c = self.config
        try:
            await stub.DeregisterWorker(pb.DeregisterWorkerRequest(worker_id=c.worker_id), timeout=c.timeout_seconds)
            log.info("deregistered %s from %s", c.worker_id, c.capacity_addr)
        except grpc.aio.AioRpcError as exc:
            # The capacity service removes an unreachable RPC-registered worker by itself later.
            log.warning("deregistering %s failed: %s %s", c.worker_id, exc.code().name, exc.details())


async def _serve(config: RegistrarConfig) -> None:
    registrar = Registrar(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, registrar.stop)
    await registrar.run()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"registrar: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    asyncio.run(_serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
