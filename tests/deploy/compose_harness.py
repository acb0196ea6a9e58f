"""Run docker-compose.yml without a container engine: each service as a local process on its own loopback address.

No container engine runs on the machines that test this project, so the compose file is proven by
running what it says, service for service, the way Compose would:

* variables are interpolated as Compose does (`${VAR:-default}`, `${VAR-default}`, `${VAR:?err}`,
  `$VAR`, `$$`), and interpolated numbers are cast where the specification wants numbers;
* each service started here gets its own address in 127.0.0.0/8 (Linux routes all of it to `lo`), so
  it binds exactly the ports it binds in its container; a service's name, written as `name:PORT` in
  another service's command or environment, is replaced by that address (what the compose network's
  DNS does), and `0.0.0.0` / `127.0.0.1` / `localhost` in a service's own command, environment and
  healthcheck mean its own address (its container's interfaces);
* a named volume becomes a directory; its mount target in a command or variable becomes that path;
* Bandmaster services (those with `build:`) run their `command` with the test's Python in place of the
  image's `python`, with the service's `environment` and nothing inherited but PATH; Redis runs from
  the local `redis-server` binary with the compose command plus the bind address; every other image
  (collector, Jaeger, Prometheus, Grafana) is validated by schema only, and a variable that points a
  started service at one of them is left out (recorded in `Plan.dropped_env`);
* a service starts once every `depends_on` with `condition: service_healthy` is healthy, and is healthy
  when its compose healthcheck passes: `python -m services.common.serve.healthcheck ...` runs in-process (the
  same code, without a Python start-up per probe on a loaded machine), anything else as a subprocess.

Every wait is bounded and fails with the service, its last probe result and the tail of its log.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import yaml

from services.common.serve import healthcheck
from tests.support.processes import Process, start

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
HEALTHCHECK_MODULE = ["python", "-m", "services.common.serve.healthcheck"]

# ---------------------------------------------------------------------------------------------------
# Loading: interpolation and casts, as Compose does before it validates and runs a file.

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


class InterpolationError(ValueError):
    """A `${VAR:?message}` whose variable is missing, or an interpolated number that is not one."""


def interpolate_string(text: str, env: Mapping[str, str]) -> str:
    """One string with every reference replaced; `:-`/`:?` treat an empty variable as unset, `-`/`?` do not."""

    def replace(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("named")
        op, arg = match.group("op"), match.group("arg") or ""
        value = env.get(name)
        unset_or_empty = value is None or (value == "" and op is not None and op.startswith(":"))
        if op in (":-", "-") and unset_or_empty:
            return interpolate_string(arg, env)
        if op in (":?", "?") and unset_or_empty:
            raise InterpolationError(f"${{{name}}} is required: {arg or 'not set'}")
        return value or ""

    return _VARIABLE.sub(replace, text)


def interpolate(node: Any, env: Mapping[str, str]) -> Any:
    """Interpolate every string value (not keys) of a loaded compose document."""
    if isinstance(node, str):
        return interpolate_string(node, env)
    if isinstance(node, list):
        return [interpolate(v, env) for v in node]
    if isinstance(node, dict):
        return {k: interpolate(v, env) for k, v in node.items()}
    return node


def _cast_int(value: Any, where: str) -> Any:
    if isinstance(value, str):
        if not re.fullmatch(r"-?\d+", value.strip()):
            raise InterpolationError(f"{where}: {value!r} is not an integer")
        return int(value)
    return value


def cast_numbers(doc: dict[str, Any]) -> dict[str, Any]:
    """Compose casts interpolated values back to the type the specification wants; the fields this file
    interpolates numbers into are `deploy.replicas` and `healthcheck.retries`."""
    for name, service in (doc.get("services") or {}).items():
        deploy = service.get("deploy") or {}
        if "replicas" in deploy:
            deploy["replicas"] = _cast_int(deploy["replicas"], f"services.{name}.deploy.replicas")
        check = service.get("healthcheck") or {}
        if "retries" in check:
            check["retries"] = _cast_int(check["retries"], f"services.{name}.healthcheck.retries")
    return doc


def load_compose(path: Path = COMPOSE_FILE, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose file as Compose sees it: YAML (anchors and merge keys resolved), interpolated, cast.
    `env` is the variable environment (default: none set, so every default applies)."""
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    return cast_numbers(interpolate(raw, env or {}))


# ---------------------------------------------------------------------------------------------------
# The model of one service, as far as running it goes.


def command_argv(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """`environment:` in either form (mapping, or list of NAME=value); a bare NAME is left out here."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = [item.split("=", 1) for item in env if "=" in item]
        return {k: v for k, v in pairs}
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def healthcheck_argv(service: Mapping[str, Any]) -> list[str] | None:
    """The healthcheck as an argv (`CMD-SHELL` through sh -c); None when the service has none."""
    check = service.get("healthcheck") or {}
    test = check.get("test")
    if not test or check.get("disable"):
        return None
    if isinstance(test, str):
        return ["sh", "-c", test]
    kind, *rest = test
    if kind == "NONE":
        return None
    return ["sh", "-c", " ".join(rest)] if kind == "CMD-SHELL" else list(rest)


def duration_seconds(text: str | None, default: float) -> float:
    """A compose duration ('10s', '1m30s', '500ms') in seconds."""
    if not text:
        return default
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text):
        total += float(number) * units[unit]
    return total


def is_bandmaster(service: Mapping[str, Any]) -> bool:
    """Ours: built from this repository's Dockerfile."""
    return "build" in service


def is_redis(service: Mapping[str, Any]) -> bool:
    return str(service.get("image", "")).startswith("redis:")


def replicas(service: Mapping[str, Any]) -> int:
    return int((service.get("deploy") or {}).get("replicas", 1))


def healthy_dependencies(service: Mapping[str, Any]) -> list[str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return []
    return [name for name, spec in deps.items() if (spec or {}).get("condition") == "service_healthy"]


def named_volume_mounts(service: Mapping[str, Any], doc: Mapping[str, Any]) -> dict[str, str]:
    """{container target: volume name} for the service's named volumes (bind mounts are not ours to run)."""
    out: dict[str, str] = {}
    declared = set((doc.get("volumes") or {}).keys())
    for entry in service.get("volumes") or []:
        if isinstance(entry, str):
            source, _, rest = entry.partition(":")
            target = rest.split(":")[0]
        else:
            source, target = entry.get("source", ""), entry.get("target", "")
        if source in declared:
            out[target] = source
    return out


# ---------------------------------------------------------------------------------------------------
# Planning: addresses and the rewritten argv / environment / healthcheck of every started service.

_OWN_HOSTS = ("0.0.0.0", "127.0.0.1", "localhost")


@dataclass
class ServicePlan:
    name: str
    kind: str
    """'bandmaster' or 'redis'."""
    address: str
    argv: list[str]
    env: dict[str, str]
    healthcheck: list[str] | None
    health_timeout_s: float
    depends_on_healthy: list[str]
    workdir: Path


@dataclass
class Plan:
    services: dict[str, ServicePlan]
    addresses: dict[str, str]
    """Every started service's address, by compose name."""
    schema_only: list[str]
    dropped_env: dict[str, list[str]] = field(default_factory=dict)
    """Variables left out per service because they point at a schema-only service."""


class Rewriter:
    """Maps container-world strings of one service to this machine: hostnames, own address, volumes."""

    def __init__(self, own_address: str, addresses: Mapping[str, str], volumes: Mapping[str, Path]) -> None:
        self.own_address = own_address
        self.volumes = dict(volumes)
        names = sorted(addresses, key=len, reverse=True)
        self.addresses = dict(addresses)
        # A service name counts as a host only where a port follows it ("capacity:50051",
        # "http://router-1:8000"), never inside a path or a word ("/var/lib/planner", "redis://").
        self._host = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, names)) + r")(?=:\d)") if names else None
        self._own = re.compile(r"(?<![\w.-])(0\.0\.0\.0|127\.0\.0\.1|localhost)(?=:\d)")

    def __call__(self, value: str) -> str:
        if value in _OWN_HOSTS:
            return self.own_address
        for target, path in self.volumes.items():
            if value == target or value.startswith(target + "/"):
                value = str(path) + value[len(target) :]
        if self._host is not None:
            value = self._host.sub(lambda m: self.addresses[m.group(1)], value)
        return self._own.sub(self.own_address, value)

    def mentions(self, value: str, names: Sequence[str]) -> bool:
        return any(re.search(r"(?<![\w.-])" + re.escape(n) + r"(?=:\d)", value) for n in names)


def pick_subnet() -> int:
    """A third octet for this run's 127.0.X.0/24: random, so that a concurrent run rarely shares it,
    and checked free on the ports this file uses."""
    rng = random.Random()
    for _ in range(50):
        octet = rng.randint(16, 250)
        if _can_bind(f"127.0.{octet}.10", 50051) and _can_bind(f"127.0.{octet}.11", 8000):
            return octet
    raise RuntimeError("no free 127.0.X.0/24 found for the compose-equivalent run")


def _can_bind(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def plan(doc: Mapping[str, Any], workdir: Path, octet: int) -> Plan:
    services: Mapping[str, Mapping[str, Any]] = doc["services"]
    started = [n for n, s in services.items() if (is_bandmaster(s) or is_redis(s)) and replicas(s) > 0]
    schema_only = [n for n, s in services.items() if not (is_bandmaster(s) or is_redis(s))]
    addresses = {name: f"127.0.{octet}.{10 + i}" for i, name in enumerate(started)}
    out = Plan(services={}, addresses=addresses, schema_only=schema_only)
    for name in started:
        service = services[name]
        home = workdir / name
        home.mkdir(parents=True, exist_ok=True)
        volumes = {target: _volume_dir(workdir, vol) for target, vol in named_volume_mounts(service, doc).items()}
        rewrite = Rewriter(addresses[name], addresses, volumes)
        env: dict[str, str] = {}
        for key, value in environment(service).items():
            if rewrite.mentions(value, schema_only):
                out.dropped_env.setdefault(name, []).append(key)
                continue
            env[key] = rewrite(value)
        check = healthcheck_argv(service)
        argv = [rewrite(a) for a in command_argv(service)]
        kind = "bandmaster" if is_bandmaster(service) else "redis"
        if kind == "bandmaster":
            if argv[:1] != ["python"]:
                raise ValueError(f"{name}: command must start with python (the image's interpreter), got {argv[:1]}")
            argv[0] = sys.executable
        else:
            argv = _redis_argv(argv, addresses[name], _service_port(service, 6379), home)
            if check and check[:1] == ["redis-cli"]:
                check = [check[0], "-h", addresses[name], "-p", str(_service_port(service, 6379)), *check[1:]]
        out.services[name] = ServicePlan(
            name=name,
            kind=kind,
            address=addresses[name],
            argv=argv,
            env=env,
            healthcheck=[rewrite(a) for a in check] if check else None,
            health_timeout_s=duration_seconds((service.get("healthcheck") or {}).get("timeout"), 30.0),
            depends_on_healthy=[d for d in healthy_dependencies(service) if d in addresses],
            workdir=home,
        )
    return out


def _volume_dir(workdir: Path, volume: str) -> Path:
    path = workdir / "volumes" / volume
    path.mkdir(parents=True, exist_ok=True)
    return path


def _service_port(service: Mapping[str, Any], default: int) -> int:
    exposed = service.get("expose") or []
    return int(str(exposed[0]).split("/")[0]) if exposed else default


def _redis_argv(argv: list[str], address: str, port: int, home: Path) -> list[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not installed (make system-deps installs it)")
    if argv[:1] != ["redis-server"]:
        raise ValueError(f"redis command must start with redis-server, got {argv[:1]}")
    # What the container provides implicitly: its own interface, the image's port and data directory,
    # and the official image's protected-mode off.
    return [binary, *argv[1:], "--bind", address, "--port", str(port), "--dir", str(home), "--protected-mode", "no"]


# ---------------------------------------------------------------------------------------------------
# Running.


class ComposeRunError(AssertionError):
    """The stack did not come up: names the service and says why, with its log tail."""


@dataclass
class Running:
    plan: ServicePlan
    process: Process
    healthy: bool = False
    last_probe: str = "not probed yet"


def _base_env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


class ComposeRun:
    """Start a `Plan`, wait until every service is healthy, stop everything on `stop()`."""

    def __init__(self, stack: Plan, log_dir: Path) -> None:
        self.stack = stack
        self.log_dir = log_dir
        self.running: dict[str, Running] = {}

    def start(self, timeout_s: float = 60.0, probe_interval_s: float = 0.3) -> None:
        """Start services as their healthy dependencies allow; return when all are healthy.

        Bounded by `timeout_s` in all; a process that exits, or a service still unhealthy at the
        deadline, raises ComposeRunError naming it."""
        deadline = time.monotonic() + timeout_s
        pending = dict(self.stack.services)
        while True:
            for name in [
                n
                for n, p in pending.items()
                if all(self.running.get(d) and self.running[d].healthy for d in p.depends_on_healthy)
            ]:
                self._spawn(pending.pop(name))
            self._check_alive()
            for item in self.running.values():
                if not item.healthy:
                    item.healthy, item.last_probe = self._probe(item)
            if not pending and all(r.healthy for r in self.running.values()):
                return
            if time.monotonic() >= deadline:
                raise ComposeRunError(self._not_ready_report(pending, timeout_s))
            time.sleep(probe_interval_s)

    def _spawn(self, service: ServicePlan) -> None:
        process = start(
            service.name,
            list(service.argv),
            self.log_dir,
            env={**_base_env(service.workdir), **service.env},
            cwd=service.workdir,
            new_session=True,
        )
        self.running[service.name] = Running(service, process)

    def _check_alive(self) -> None:
        for name, item in self.running.items():
            code = item.process.returncode
            if code is not None:
                raise ComposeRunError(
                    f"{name} exited with status {code} (command: {shlex.join(item.plan.argv)})\n"
                    f"--- {name} log ---\n{item.process.log_tail(25)}"
                )

    def _probe(self, item: Running) -> tuple[bool, str]:
        check = item.plan.healthcheck
        if check is None:
            return True, "no healthcheck: running counts as healthy"
        timeout = min(item.plan.health_timeout_s, 5.0)
        if check[:3] == HEALTHCHECK_MODULE:
            args = [*check[3:], "--timeout-seconds", str(timeout)]
            code, results = healthcheck.run(args, {**_base_env(item.plan.workdir), **item.plan.env})
            return code == 0, "; ".join(f"{r.target}: {r.detail}" for r in results) or "usage error"
        try:
            done = subprocess.run(check, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, f"healthcheck timed out after {timeout:g}s"
        return done.returncode == 0, (done.stdout + done.stderr).strip()[-200:]

    def _not_ready_report(self, pending: Mapping[str, ServicePlan], timeout_s: float) -> str:
        lines = [f"the compose-equivalent stack was not healthy within {timeout_s:g}s"]
        for name, service in pending.items():
            waiting = [d for d in service.depends_on_healthy if not (self.running.get(d) and self.running[d].healthy)]
            lines.append(f"  {name}: not started, waiting for {', '.join(waiting)} to be healthy")
        for name, item in self.running.items():
            if not item.healthy:
                lines.append(
                    f"  {name}: unhealthy ({item.last_probe})\n--- {name} log ---\n{item.process.log_tail(25)}"
                )
        return "\n".join(lines)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every started process (dependants first), then SIGKILL whatever outlives the grace."""
        items = list(self.running.values())[::-1]
        for item in items:
            item.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for item in items:
            try:
                item.process.wait_exit(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                item.process.kill()
                item.process.wait_exit()

    def url(self, service: str, port: int, path: str = "") -> str:
        return f"http://{self.stack.addresses[service]}:{port}{path}"

    def resolve(self, host_port: str) -> str | None:
        """'router-1:9103' -> '127.0.X.Y:9103'; None for a service that is not started here."""
        host, _, port = host_port.rpartition(":")
        address = self.stack.addresses.get(host)
        return f"{address}:{port}" if address else None


@contextmanager
def compose_stack(workdir: Path, env: Mapping[str, str] | None = None, timeout_s: float = 90.0) -> Iterator[ComposeRun]:
    """docker-compose.yml, interpolated with `env`, running and healthy for the `with` body; always stopped."""
    stack = plan(load_compose(COMPOSE_FILE, env), workdir / "services", pick_subnet())
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    run = ComposeRun(stack, logs)
    try:
        run.start(timeout_s=timeout_s)
        yield run
    finally:
        run.stop()
