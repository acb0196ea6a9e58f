"""Real processes for the router's integration and end-to-end tests: simworkers, capacity, scheduler, router.

Each process is started by tests/support/processes with `--ready-file` and ports 0 on 127.0.0.1, and stopped
by its own pid.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.support.eventually import assert_eventually
from tests.support.processes import ROOT, Process, base_env, free_port, python_module, start

__all__ = ["ROOT", "Process", "base_env", "free_port"]


async def spawn(
    name: str, module: str, args: list[str], tmp: Path, *, env: dict[str, str] | None = None, timeout_s: float = 30.0
) -> Process:
    """`python -m module args... --ready-file <tmp>/<name>.ready.json`, ready."""
    ready = tmp / f"{name}.ready.json"
    return await start(
        name, python_module(module, *args, "--ready-file", str(ready)), tmp, env=env, ready_file=ready
    ).wait_ready_async(timeout_s)


async def simworker(tmp: Path, name: str, *args: str, kv_events: bool = False) -> Process:
    extra = (
        ["--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}"})]
        if kv_events
        else []
    )
    return await spawn(
        name,
        "services.simworker",
        ["--port", "0", "--speedup", "50", "--enable-cache-report", "--max-total-tokens", "32768", *extra, *args],
        tmp,
    )


async def capacity(tmp: Path, worker_urls: list[str], *args: str) -> Process:
    flags = [f for url in worker_urls for f in ("--worker-url", url)]
    return await spawn(
        "capacity",
        "services.capacity",
        [
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "-1",
            "--poll-interval-seconds",
            "0.25",
            "--poll-timeout-seconds",
            "0.25",
            "--unhealthy-after-failures",
            "1",
            *flags,
            *args,
        ],
        tmp,
    )


async def scheduler(
    tmp: Path, capacity_addr: str, *args: str, listen: str = "127.0.0.1:0", name: str = "scheduler"
) -> Process:
    # Its own state file: tests never share (or lock) the default one under the user's home.
    return await spawn(
        name,
        "services.scheduler",
        [
            "--capacity-addr",
            capacity_addr,
            "--listen",
            listen,
            "--metrics-port",
            "-1",
            "--state-path",
            str(tmp / f"{name}.state.sqlite"),
            *args,
        ],
        tmp,
    )


async def router(
    tmp: Path,
    capacity_addr: str,
    *args: str,
    scheduler_addr: str | None = None,
    name: str = "router",
    env: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> Process:
    sched = ["--scheduler-addr", scheduler_addr] if scheduler_addr else ["--no-scheduler"]
    return await spawn(
        name,
        "services.router",
        [
            "--capacity-addr",
            capacity_addr,
            *sched,
            "--listen",
            "127.0.0.1:0",
            "--http-port",
            "0",
            "--metrics-port",
            "0",
            *args,
        ],
        tmp,
        env=env,
        timeout_s=timeout_s,
    )


# A router serves /metrics on its metrics port only (not on the public HTTP port): `metric` given a
# router's HTTP URL reads its metrics port instead.
_METRICS_URL: dict[str, str] = {}


def router_url(proc: Process) -> str:
    url = f"http://127.0.0.1:{proc.ready['http_port']}"
    if proc.ready.get("metrics_port"):
        _METRICS_URL[url] = metrics_url(proc)
    return url


def metrics_url(proc: Process) -> str:
    return f"http://127.0.0.1:{proc.ready['metrics_port']}"


async def metric(url: str, name: str, labels: str | None = None) -> float:
    """Sum of the samples of `name` (optionally only those whose labels contain `labels`) at url/metrics
    (for a router's HTTP URL: at its metrics port)."""
    url = _METRICS_URL.get(url, url)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/metrics") as r:
            text = await r.text()
    total = 0.0
    pattern = re.compile(r"^" + re.escape(name) + r"(\{[^}]*\})?\s+(\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if m and (labels is None or (m.group(1) and labels in m.group(1))):
            total += float(m.group(2))
    return total


async def healthy_workers(url: str, workers: int, timeout_s: float = 20) -> None:
    """Wait until the router at `url` reports `workers` healthy workers on /health."""

    async def check():
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                return (await r.json())["workers"] == workers

    await assert_eventually(check, timeout_s=timeout_s)


async def worker_load(url: str) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/get_load") as r:
            return (await r.json())[0]


@dataclass
class Stack:
    tmp: Path
    procs: list[Process] = field(default_factory=list)

    def add(self, proc: Process) -> Process:
        self.procs.append(proc)
        return proc

    async def close(self) -> None:
        for proc in reversed(self.procs):
            await proc.stop_async()
