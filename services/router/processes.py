"""`python -m services.router --processes N`: N router processes on one HTTP port and one gRPC port.

The router is a stateless data plane whose Python event loop saturates one core; several processes
let it use every core. This parent process:

* checks the HTTP and gRPC ports (a taken port is one line naming its flag), then holds each with an
  SO_REUSEPORT socket that is bound but never listens, so that a port given as 0 is chosen once and
  stays the router's while the children start (the kernel spreads connections over listening
  sockets only, so the held socket takes none);
* starts N children, `python -m services.router` with the same flags plus `--processes 1
  --reuse-port` and the chosen ports, each under the orphan guard (they die with it); each child is
  a whole router: its own scheduler client, capacity watch, KV-event subscriptions and KV index;
* serves `/metrics` on `--metrics-port` for all of them: every child's exposition (scraped from its
  own metrics port, always on loopback: `--metrics-loopback`), each sample labelled
  `router_process="<i>"`, plus `bandmaster_router_process_up{router_process}`;
* writes its ready file (the ports, as one router writes it) once every child wrote its own;
* probes every child's metrics port (served by the child's own event loop) every
  LIVENESS_PERIOD_S: a child that does not answer LIVENESS_FAILURES probes in a row is wedged, and
  counts as exited (no probe when metrics are off, `--metrics-port -1`);
* on SIGTERM/SIGINT stops the children (SIGTERM, then SIGKILL past their shutdown grace + 5 s); when a
  child exits on its own, it stops the others and exits 1, so that the supervisor (bandmaster up,
  Kubernetes, compose) restarts the whole router rather than run one process short unnoticed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from services.common.auth.security import metrics_guard
from services.common.observe.logs import setup_logging
from services.common.process import orphan_guard
from services.common.process.ready import write_ready_file
from services.common.serve.ports import PortInUse, binding, require_free
from services.common.settings.config import parse_host_port
from services.common.web.http_errors import json_errors
from services.router.config import RouterConfig

log = logging.getLogger(__name__)

PROCESS_LABEL = "router_process"
CHILD_START_TIMEOUT_S = 120.0
"""Longest wait for every child to write its ready file (a tokenizer load is the slow part)."""
SCRAPE_TIMEOUT_S = 2.0
LIVENESS_PERIOD_S = 10.0
LIVENESS_FAILURES = 3
STOP_MARGIN_S = 5.0
"""Past its shutdown grace, a child still running after this long is killed."""


def hold_port(host: str, port: int, what: str, flag: str) -> socket.socket:
    """A bound, never-listening SO_REUSEPORT socket on `host:port` (port 0 = any free one): the port
    is checked free first (a listener of any process, SO_REUSEPORT or not, makes it taken)."""
    require_free(host, port, what, flag)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        with binding(host, port, what, flag):
            sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def child_args(argv: Sequence[str], host: str, grpc_port: int, http_port: int, metrics: bool, ready: str) -> list[str]:
    """The flags of one child: the parent's own, then the overrides (the last of a flag wins)."""
    listen = f"[{host}]:{grpc_port}" if ":" in host else f"{host}:{grpc_port}"
    return [
        *argv,
        "--processes",
        "1",
        "--reuse-port",
        "--listen",
        listen,
        "--http-port",
        str(http_port),
        "--metrics-port",
        "0" if metrics else "-1",
        "--metrics-loopback",  # only the parent scrapes a child's metrics
        "--ready-file",
        ready,
    ]


def merge_expositions(texts: Sequence[str | None]) -> bytes:
    """Prometheus text from each child (None = it did not answer) as one exposition: every sample gets
    `router_process="<i>"`; `bandmaster_router_process_up` says which children answered."""
    families: dict[str, Metric] = {}
    up = Metric("bandmaster_router_process_up", "1 when this router process answered the scrape", "gauge")
    for index, text in enumerate(texts):
        up.samples.append(Sample(up.name, {PROCESS_LABEL: str(index)}, 0.0 if text is None else 1.0, None, None))
        for family in text_string_to_metric_families(text or ""):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            for s in family.samples:
                merged.samples.append(
                    Sample(s.name, {**s.labels, PROCESS_LABEL: str(index)}, s.value, s.timestamp, s.exemplar)
                )
    collected = [up, *families.values()]

    class _Collected:
        def collect(self):
            return collected

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collected())
    return generate_latest(registry)


class RouterProcesses:
    """The parent: starts, watches and stops the children, serves their merged metrics."""

    def __init__(self, config: RouterConfig, argv: Sequence[str]) -> None:
        self.config = config
        self.argv = list(argv)
        self.host, self.grpc_port = parse_host_port(config.listen, "listen")
        self.http_port = config.http_port
        self.children: list[subprocess.Popen] = []
        self.child_metrics: list[int] = []
        self._state = tempfile.TemporaryDirectory(prefix="bandmaster-router-")
        self._metrics_runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.metrics_port = 0

    async def start(self) -> None:
        """Hold the ports, start the children, wait until every one serves. Raises PortInUse, or
        RuntimeError when a child exits or is not ready in time (the started ones are stopped)."""
        grpc_hold = hold_port(self.host, self.grpc_port, "router gRPC", "--listen")
        try:
            http_hold = hold_port(self.host, self.http_port, "router HTTP", "--http-port")
        except BaseException:
            grpc_hold.close()
            raise
        try:
            if self.config.metrics_port > 0:
                require_free(
                    self.config.security.metrics_host(self.host),
                    self.config.metrics_port,
                    "router /metrics",
                    "--metrics-port",
                )
            self.grpc_port = grpc_hold.getsockname()[1]
            self.http_port = http_hold.getsockname()[1]
            readies = [Path(self._state.name) / f"router-{i}.ready.json" for i in range(self.config.processes)]
            for index, ready in enumerate(readies):
                args = child_args(
                    self.argv, self.host, self.grpc_port, self.http_port, self.config.metrics_port >= 0, str(ready)
                )
                self.children.append(subprocess.Popen(orphan_guard.command(sys.executable, "services.router", args)))
                log.info("router process %d started (pid %d)", index, self.children[-1].pid)
            ports = await self._wait_ready(readies)
        except BaseException:
            await self.stop()
            raise
        finally:
            grpc_hold.close()
            http_hold.close()
        self.child_metrics = ports
        if self.config.metrics_port >= 0:
            await self._serve_metrics()
        if self.config.ready_file:
            write_ready_file(
                self.config.ready_file,
                {
                    "service": "router",
                    "grpc": f"{self.host}:{self.grpc_port}",
                    "metrics_port": self.metrics_port,
                    "http_port": self.http_port,
                    "pid": os.getpid(),
                    "processes": [child.pid for child in self.children],
                },
            )
        log.info(
            "router serving HTTP on %s:%d and gRPC on %d with %d processes (metrics for all on port %s)",
            self.host,
            self.http_port,
            self.grpc_port,
            len(self.children),
            self.metrics_port or "off",
        )

    async def _wait_ready(self, readies: list[Path]) -> list[int]:
        deadline = time.monotonic() + CHILD_START_TIMEOUT_S
        found: dict[int, dict] = {}
        while len(found) < len(readies):
            for index, child in enumerate(self.children):
                if child.poll() is not None:
                    raise RuntimeError(f"router process {index} exited with {child.returncode} while starting")
            for index, ready in enumerate(readies):
                if index not in found and ready.exists():
                    try:
                        found[index] = json.loads(ready.read_text())
                    except ValueError:
                        pass  # written by rename: complete when it is there, but be safe
            if time.monotonic() > deadline:
                raise RuntimeError(f"router processes not ready within {CHILD_START_TIMEOUT_S:g}s")
            await asyncio.sleep(0.05)
        return [int(found[i].get("metrics_port") or 0) for i in range(len(readies))]

    async def _scrape(self, port: int, timeout_s: float = SCRAPE_TIMEOUT_S) -> str | None:
        if not port or self._session is None:
            return None
        url = f"http://127.0.0.1:{port}/metrics"  # a child's metrics port is on loopback (--metrics-loopback)
        tokens = self.config.security.metrics_tokens
        headers = {"Authorization": f"Bearer {tokens.first}"} if tokens is not None else None
        try:
            async with self._session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    async def _metrics(self, _request: web.BaseRequest) -> web.Response:
        texts = await asyncio.gather(*(self._scrape(port) for port in self.child_metrics))
        return web.Response(body=merge_expositions(texts), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _serve_metrics(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S))
        security = self.config.security
        app = web.Application(middlewares=[json_errors])
        app.router.add_get("/metrics", metrics_guard(self._metrics, security.metrics_tokens, security.control_tokens))
        self._metrics_runner = web.AppRunner(app, access_log=None)
        await self._metrics_runner.setup()
        host = security.metrics_host(self.host)
        site = web.TCPSite(self._metrics_runner, host, self.config.metrics_port)
        with binding(host, self.config.metrics_port, "router /metrics", "--metrics-port"):
            await site.start()
        self.metrics_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def wait(self, stop: asyncio.Event) -> int:
        """Until `stop` is set (0), or a child exits on its own or stops answering its liveness probe (1)."""
        misses = [0] * len(self.children)
        next_probe = time.monotonic() + LIVENESS_PERIOD_S
        while not stop.is_set():
            for index, child in enumerate(self.children):
                if child.poll() is not None:
                    log.error(
                        "router process %d (pid %d) exited with %d; stopping the others",
                        index,
                        child.pid,
                        child.returncode,
                    )
                    return 1
            if self._session is not None and time.monotonic() >= next_probe:
                answers = await asyncio.gather(
                    *(self._scrape(port, LIVENESS_PERIOD_S / 2) for port in self.child_metrics)
                )
                for index, answer in enumerate(answers):
                    misses[index] = 0 if answer is not None else misses[index] + 1
                    if misses[index] >= LIVENESS_FAILURES:
                        log.error(
                            "router process %d (pid %d) did not answer %d liveness probes in a row; stopping "
                            "the router",
                            index,
                            self.children[index].pid,
                            misses[index],
                        )
                        return 1
                next_probe = time.monotonic() + LIVENESS_PERIOD_S
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass
        return 0

    async def stop(self) -> None:
        """SIGTERM every child, SIGKILL the ones still running past their grace; close the metrics port."""
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                child.send_signal(signal.SIGCONT)  # a stopped (wedged) child acts on SIGTERM once continued
        deadline = time.monotonic() + self.config.shutdown_grace_seconds + STOP_MARGIN_S
        while any(child.poll() is None for child in self.children) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for child in self.children:
            if child.poll() is None:
                log.warning("router process pid %d did not stop in time; killing it", child.pid)
                child.kill()
                child.wait(timeout=5)
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        if self._session is not None:
            await self._session.close()
        self._state.cleanup()


def run_processes(config: RouterConfig, argv: Sequence[str]) -> int:
    """Run the parent until SIGINT/SIGTERM or a child's exit; the exit status."""
    setup_logging(config.log_level)
    parent = RouterProcesses(config, argv)

    async def serve() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await parent.start()
        except PortInUse as exc:
            print(f"router: {exc}", file=sys.stderr)
            return 1
        except RuntimeError as exc:
            print(f"router: {exc}", file=sys.stderr)
            return 1
        try:
            return await parent.wait(stop)
        finally:
            await parent.stop()

    return asyncio.run(serve())
