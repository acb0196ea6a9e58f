"""The peer systems benchmarks run beside Bandmaster, started the same way everywhere."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

from services.common.process import orphan_guard
from services.common.process.child_start import start_child


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_sglang_router(worker_urls: Sequence[str], policy: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """SGLang's own router (`sglang-router` from PyPI) in front of `worker_urls`; returns the process
    and its base URL. It registers workers in the background: callers wait until it routes."""
    port = free_port()
    process = start_child(
        orphan_guard.command(
            sys.executable,
            "sglang_router.launch_router",
            [
                "--worker-urls",
                *worker_urls,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                policy,
                "--log-level",
                "warn",
                # Its metrics port defaults to a fixed 29000: take a free one so that runs do not collide.
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(free_port()),
            ],
        ),
        log_path,
        env={**os.environ, "RUST_LOG": "warn"},
        truncate=True,
    )
    return process, f"http://127.0.0.1:{port}"


def launch_peer_proxy(
    worker_urls: Sequence[str], policy: str, speedup: float, log_path: Path
) -> tuple[subprocess.Popen, str]:
    """A peer system's proxy (`python -m bench.peer_proxy`, harness/peers) in front of `worker_urls`,
    its clock scaled by the workers' `speedup`; returns the process and its base URL. It reads the
    workers' /server_info before it listens: callers wait until it routes."""
    port = free_port()
    process = start_child(
        orphan_guard.command(
            sys.executable,
            "bench.peer_proxy",
            [
                "--policy",
                policy,
                "--worker-urls",
                *worker_urls,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--speedup",
                repr(speedup),
            ],
        ),
        log_path,
        truncate=True,
    )
    return process, f"http://127.0.0.1:{port}"


def peer_stats(base_url: str) -> dict:
    """The peer proxy's counters (GET /peer/stats); empty when it does not answer."""
    try:
        with urllib.request.urlopen(base_url + "/peer/stats", timeout=5) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return {}


def chat_ok(base_url: str, model: str) -> bool:
    """True when `base_url` answers a one-token chat completion: the front door routes."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}).encode()
    request = urllib.request.Request(
        base_url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_routable(base_url: str, model: str, alive: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """A front door is ready once it answers a chat request (routers learn workers in the background)."""
    deadline = time.monotonic() + timeout_s
    while not chat_ok(base_url, model):
        if not alive():
            raise RuntimeError(f"the router behind {base_url} exited during start-up")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base_url} never routed a request within {timeout_s:.0f}s")
        time.sleep(0.2)
