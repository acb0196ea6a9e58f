"""Start Bandmaster processes as children on loopback, wait until they serve, stop them with no orphans.

Each child is started with `--ready-file`: once it serves it writes its bound ports there as JSON.
Readiness is then confirmed the way a user would check it: `grpc.health.v1` SERVING for gRPC
services (over mutual TLS with `grpc_credentials` when the cluster is secure), `GET /health` 200 for
HTTP ones. Children run under `services.common.process.orphan_guard`, which asks for PR_SET_PDEATHSIG in the child,
so that even a SIGKILL of the supervisor does not leave them running.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.process import orphan_guard
from services.common.process.child_start import start_child
from services.common.process.child_stop import stop_child
from services.common.process.ready import read_ready_file

log = logging.getLogger(__name__)


@dataclass
class ChildSpec:
    """How to start one child. `kind` says how readiness is checked: "grpc" or "http"."""

    name: str
    module: str
    args: Sequence[str]
    kind: str = "grpc"
    env: dict[str, str] = field(default_factory=dict)
    serving_means_ready: bool = True
    """gRPC children: ready once health says SERVING; False: once health answers at all (the router, whose
    health follows its fleet, is up and serving before any worker is healthy)."""


@dataclass
class Child:
    spec: ChildSpec
    process: subprocess.Popen
    ready_file: Path
    log_path: Path
    ready: dict = field(default_factory=dict)
    log_start: int = 0
    """Where this run's lines begin in `log_path`: a reused state dir keeps earlier runs' lines before it."""

    @property
    def endpoint(self) -> str:
        if self.spec.kind == "grpc":
            return self.ready.get("grpc", "")
        return f"http://127.0.0.1:{self.ready.get('port', 0)}"


class StartupError(RuntimeError):
    pass


class Supervisor:
    """Owns the children of one `bandmaster up`."""

    def __init__(
        self,
        state_dir: Path | None = None,
        python: str = sys.executable,
        grpc_credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="bandmaster-"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.grpc_credentials = grpc_credentials
        """Credentials of the health probes (a client certificate, when the children require one)."""
        self.children: list[Child] = []
        self.trace_dir: Path | None = None
        """Set: every service child writes its spans to `<trace_dir>/<name>.jsonl` (`--trace-file`)."""
        self.trace_background = False
        """With `trace_dir`: background spans too (`--trace-background`), not only the turns'."""

    def trace_args(self, spec: ChildSpec) -> list[str]:
        if self.trace_dir is None or not spec.module.startswith("services."):
            return []
        args = ["--trace-file", str(self.trace_dir / f"{spec.name}.jsonl")]
        return [*args, "--trace-background"] if self.trace_background else args

    def start(self, spec: ChildSpec) -> Child:
        ready_file = self.state_dir / f"{spec.name}.ready.json"
        ready_file.unlink(missing_ok=True)
        log_path = self.state_dir / f"{spec.name}.log"
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        cmd = orphan_guard.command(
            self.python, spec.module, [*spec.args, *self.trace_args(spec), "--ready-file", str(ready_file)]
        )
        log_start = log_path.stat().st_size if log_path.exists() else 0  # where this run's lines begin
        process = start_child(cmd, log_path, env=env, cwd=os.getcwd())
        child = Child(spec, process, ready_file, log_path, log_start=log_start)
        self.children.append(child)
        log.debug("started %s pid=%d: %s", spec.name, process.pid, " ".join(cmd))
        return child

    def wait_ready(self, child: Child, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                raise StartupError(
                    f"{child.spec.name} exited with code {child.process.returncode} before serving:\n"
                    + self.tail(child)
                )
            child.ready = read_ready_file(child.ready_file) or {}
            if child.ready and self._probe(child):
                return
            time.sleep(0.05)
        raise StartupError(f"{child.spec.name} did not report SERVING within {timeout_s:.0f}s:\n" + self.tail(child))

    def _probe(self, child: Child) -> bool:
        if child.spec.kind == "grpc":
            status = grpc_health(child.endpoint, credentials=self.grpc_credentials)
            if child.spec.serving_means_ready:
                return status == health_pb2.HealthCheckResponse.SERVING
            return status is not None
        return http_ok(child.endpoint + "/health")

    def tail(self, child: Child, lines: int = 20) -> str:
        """The last `lines` lines this run of the child wrote (never an earlier run's, in a reused state dir)."""
        try:
            with open(child.log_path, "rb") as fh:
                fh.seek(child.log_start)
                text = fh.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:]) if text else "(no output)"

    def start_all(
        self, specs: Sequence[ChildSpec], timeout_s: float = 60.0, on_ready: Callable[[Child], None] | None = None
    ) -> list[Child]:
        """Start `specs` together and wait for each; on any failure stop everything and raise."""
        started = [self.start(spec) for spec in specs]
        try:
            for child in started:
                self.wait_ready(child, timeout_s)
                if on_ready is not None:
                    on_ready(child)
        except BaseException:
            self.stop_all()
            raise
        return started

    def stop_all(self, grace_s: float = 10.0) -> None:
        """SIGTERM every child (last started first), then SIGKILL what is left after `grace_s`."""
        for child in reversed(self.children):
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
                child.process.send_signal(signal.SIGCONT)  # a frozen child acts on SIGTERM once continued
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            stop_child(child.process, max(0.0, deadline - time.monotonic()), name=child.spec.name, signalled=True)
        self.children.clear()

    def failed(self) -> list[Child]:
        return [c for c in self.children if c.process.poll() is not None]


def grpc_health(address: str, timeout_s: float = 1.0, credentials: grpc.ChannelCredentials | None = None) -> int | None:
    """The overall `grpc.health.v1` status at `address`, None when it does not answer."""
    try:
        with (
            grpc.secure_channel(address, credentials) if credentials is not None else grpc.insecure_channel(address)
        ) as channel:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s).status
    except grpc.RpcError:
        return None


def grpc_serving(address: str, timeout_s: float = 1.0, credentials: grpc.ChannelCredentials | None = None) -> bool:
    return grpc_health(address, timeout_s, credentials) == health_pb2.HealthCheckResponse.SERVING


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
