"""How the client commands (`programs`, `plan`, `status`, `batch`, `trace`) find a cluster and talk to it.

Every running `bandmaster up` registers itself under a name in the per-user cluster registry
(`clusters_dir()`: one `<name>.json` each, removed when it stops; an entry whose process is gone is
ignored) and writes the same record into its state dir (`<state dir>/cluster.json`). A command takes its
cluster from, in order:

1. `--state-dir DIR` or `--cluster NAME`: that cluster, and nothing else;
2. else, when no address flag is given, the one running cluster of the registry; with several running it
   refuses, listing them, rather than guess;
3. else (no cluster of yours runs) the documented default ports on loopback, but only a port that is
   free or held by one of your own processes: a listener of another user there is someone else's
   cluster, and the command refuses to talk to it (`default_address`).

An address flag wins for its own service. A service the chosen cluster does not run (`--no-planner`,
`--no-scheduler`) is reported absent: it never falls back to a default port, which may be another
cluster's. A `--secure` cluster's state dir also gives the CA, the client certificate and the tokens,
unless flags name them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import grpc

from services.common.auth.certs import LocalPki
from services.common.auth.security import client_security
from services.common.outbound.tls_diagnosis import diagnose
from services.common.process.ready import read_ready_file
from services.common.serve.ports import DEFAULT_PORTS, listener_uid
from services.common.settings.errors import ConfigError

CLUSTERS_DIR_ENV = "BANDMASTER_CLUSTERS_DIR"
RECORD_FILE = "cluster.json"
"""The discovery record a running `bandmaster up` keeps in its state dir."""
DEFAULT_NAME = "default"
"""The name of a cluster started without --name; when a live cluster has it: default-2, default-3, ..."""
MAX_DEFAULT_NAMES = 99
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class ClusterNotFound(Exception):
    """The named cluster does not run, or several run and none is named: the command stops (exit 2)."""


class ServiceAbsent(Exception):
    """The chosen cluster does not run this service: the command says so (exit 1) instead of trying a
    default port."""


def clusters_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The per-user registry of running clusters: $BANDMASTER_CLUSTERS_DIR, else
    $XDG_RUNTIME_DIR/bandmaster/clusters, else ~/.bandmaster/clusters."""
    if env.get(CLUSTERS_DIR_ENV):
        return Path(env[CLUSTERS_DIR_ENV])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "bandmaster" / "clusters"
    return Path(env.get("HOME") or Path.home()) / ".bandmaster" / "clusters"


def check_name(name: str) -> str:
    """A cluster name is a file name in the registry: letters, digits, '.', '_', '-', at most 63."""
    if not _NAME.fullmatch(name):
        raise ConfigError(
            "name", name, "a cluster name is 1-63 letters, digits, '.', '_' or '-', not starting with '.', '_' or '-'"
        )
    return name


def process_start(pid: int, proc: Path = Path("/proc")) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22): with the pid, it names
    one process, where a pid alone may have been reused since. None where there is no /proc, or no `pid`."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[19])  # the fields after the command name, from 3
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, started: object = None, proc: Path = Path("/proc")) -> bool:
    """Is `pid` running, and (when `started` is known) is it still the process that started then?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if isinstance(started, int):
        now = process_start(pid, proc)
        return now is None or now == started
    return True


def read_record(path: Path) -> dict:
    """The record of a running cluster, or {} when there is none (or its `bandmaster up` is gone: its pid is
    not running, or is another process's since, by its start time)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return {}
    if not _alive(record["pid"], record.get("pid_start")):
        return {}
    return record


def running_clusters(directory: Path) -> list[dict]:
    """The live records of the registry, by name (a stale entry, whose process is gone, is skipped)."""
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    found = []
    for path in paths:
        record = read_record(path)
        if record:
            found.append({**record, "name": record.get("name") or path.stem})
    return found


def _write(path: Path, record: dict) -> Path:
    """`record` in a temporary file next to `path` (renamed or linked into place by the caller)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    return tmp


def _claim(path: Path, record: dict) -> bool:
    """Make `record` the entry `path` unless a live process other than record["pid"] holds it. Created by
    link, so two clusters starting at once cannot both take a free name."""
    tmp = _write(path, record)
    try:
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            pass
        holder = read_record(path)
        if holder and holder.get("pid") != record["pid"]:
            return False
        os.replace(tmp, path)  # a stale entry (its process is gone), or this process's own
        return read_record(path).get("pid") == record["pid"]
    finally:
        tmp.unlink(missing_ok=True)


def register(directory: Path, record: dict, name: str = "") -> str:
    """Enter `record` (it carries this process's pid) in the registry under `name`, or without a name under
    the first of default, default-2, ... that no live cluster holds. Returns the name taken, "" when `name`
    is a live cluster's (or every default name is)."""
    candidates = [name] if name else [DEFAULT_NAME, *(f"{DEFAULT_NAME}-{i}" for i in range(2, MAX_DEFAULT_NAMES + 1))]
    for candidate in candidates:
        if _claim(directory / f"{candidate}.json", {**record, "name": candidate}):
            return candidate
    return ""


def unregister(path: Path, pid: int) -> None:
    """Remove a registry entry (or a state dir's record) if it is still `pid`'s."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(record, dict) and record.get("pid") == pid:
        path.unlink(missing_ok=True)


def write_state_record(state_dir: Path, record: dict) -> Path:
    """The record in the cluster's own state dir (what `--state-dir` reads)."""
    path = state_dir / RECORD_FILE
    os.replace(_write(path, record), path)
    return path


def describe(record: Mapping) -> str:
    """One line of a listing: name, state dir, pid, HTTP URL."""
    return (
        f"{record.get('name', '?')}  (state dir {record.get('state_dir', '?')}, pid {record.get('pid', '?')}"
        + (f", {record['http_url']}" if record.get("http_url") else "")
        + ")"
    )


def choose(running: list[dict], name: str = "") -> dict | None:
    """The cluster a command talks to: the one named `name`, else the only one running; None when none runs.
    Raises ClusterNotFound for a name no running cluster has, and when several run and none is named."""
    if name:
        for record in running:
            if record.get("name") == name:
                return record
        listing = "".join(f"\n  {describe(r)}" for r in running) or " none"
        raise ClusterNotFound(f"no running cluster is named {name!r}; running:{listing}")
    if len(running) > 1:
        listing = "".join(f"\n  {describe(r)}" for r in running)
        raise ClusterNotFound(
            f"{len(running)} clusters are running; name one with --cluster NAME (or --state-dir DIR):{listing}"
        )
    return running[0] if running else None


@dataclass(frozen=True)
class Found:
    """The cluster a command talks to: its state dir and, while its `bandmaster up` runs, its record."""

    state_dir: Path
    record: Mapping = field(default_factory=dict)
    """The live discovery record ({} for a state dir whose `bandmaster up` is gone: its ready files then)."""

    @property
    def where(self) -> str:
        name = self.record.get("name")
        return f"cluster {name!r} (state dir {self.state_dir})" if name else f"state dir {self.state_dir}"

    def grpc(self, service: str) -> str:
        """`service`'s gRPC address ("" when this cluster does not run it)."""
        if self.record:
            return str(self.record.get(service) or "")
        return ready(self.state_dir, service).get("grpc") or ""

    def schedulers(self) -> list[str]:
        """Every scheduler replica's address (active/standby: scheduler, scheduler-1, ...)."""
        names = ["scheduler", *(f"scheduler-{i}" for i in range(1, 10))]
        return [a for a in (self.grpc(n) for n in names) if a]

    def batch_http(self) -> str:
        """The batch service's own HTTP base ("" when this cluster has none)."""
        if self.record:
            return str(self.record.get("batch_http") or "")
        return ready(self.state_dir, "batch").get("http") or ""

    def absent(self, service: str) -> ServiceAbsent:
        if self.record:
            label = "batch service" if service == "batch" else service
            return ServiceAbsent(f"{self.where} runs no {label}" + _WHY_ABSENT.get(service, ""))
        return ServiceAbsent(
            f"{self.where} holds no {service}.ready.json: its cluster runs no {service}, or is not running"
        )


_WHY_ABSENT = {
    "planner": " (started with --no-planner)",
    "batch": " (started with --no-planner)",
    "scheduler": " (started with --no-scheduler)",
}


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--cluster",
        default="",
        metavar="NAME",
        help="the running cluster of that name (`bandmaster up --name`); default: the only one running "
        f"(registered in ${CLUSTERS_DIR_ENV}, else $XDG_RUNTIME_DIR/bandmaster/clusters, else "
        "~/.bandmaster/clusters); with several running, name one",
    )
    which.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the --state-dir of `bandmaster up`: addresses (and a --secure cluster's CA, client "
        "certificate and tokens) are read from it",
    )
    parser.add_argument("--tls-ca", default="", help="PEM CA bundle that signed the server's certificate (TLS)")
    parser.add_argument("--tls-cert", default="", help="PEM client certificate (a server with --tls-ca asks for one)")
    parser.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--control-token-file", default="", help="file with the control token (or env BANDMASTER_CONTROL_TOKEN)"
    )
    parser.add_argument(
        "--data-token-file",
        default="",
        help="file with the data token for the router's HTTP API (or env BANDMASTER_DATA_TOKEN)",
    )


def ready(state_dir: Path | None, name: str) -> dict:
    """A child's ready file in a `bandmaster up` state dir ({} when absent)."""
    if state_dir is None:
        return {}
    return read_ready_file(state_dir / f"{name}.ready.json") or {}


def locate(state_dir: Path | None, name: str, any_address: bool, env: Mapping[str, str] = os.environ) -> Found | None:
    """The cluster of `--state-dir` or `--cluster` (the rules in the module docstring); None: none is named
    and none runs, or only address flags are given."""
    if state_dir is not None:
        return Found(state_dir, read_record(state_dir / RECORD_FILE))
    if not name and any_address:
        return None  # an address given by flag: a discovered secure cluster's certificates must not go there
    record = choose(running_clusters(clusters_dir(env)), name)
    if record is None:
        return None
    return Found(Path(record["state_dir"]), record)


def discover(args: argparse.Namespace, *addresses: str, env: Mapping[str, str] = os.environ) -> Found | None:
    """Find the command's cluster (`locate`), keep it in `args.found` and its state dir in `args.state_dir`
    (where `fill_security` looks for a secure cluster's certificates)."""
    found = locate(getattr(args, "state_dir", None), getattr(args, "cluster", "") or "", any(addresses), env)
    args.found = found
    if found is not None:
        args.state_dir = found.state_dir
    return found


def where(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> str:
    """Which cluster the command talked to, for its messages."""
    found = getattr(args, "found", None)
    if found is not None:
        return found.where
    return f"default ports (no cluster of yours runs: none in {clusters_dir(env)})"


def secure_dir(args: argparse.Namespace) -> Path | None:
    state = getattr(args, "state_dir", None)
    if state is not None and (state / "secure" / "ca.pem").exists():
        return state / "secure"
    return None


def fill_security(args: argparse.Namespace) -> None:
    """Flags win; a --secure cluster's state dir fills what is not given."""
    secure = secure_dir(args)
    if secure is None:
        return
    pki = LocalPki(secure)
    defaults = {
        "tls_ca": pki.ca,
        "tls_cert": pki.cert("client"),
        "tls_key": pki.key("client"),
        "control_token_file": pki.control_token_file,
        "data_token_file": pki.data_token_file,
    }
    for name, path in defaults.items():
        if not getattr(args, name) and path.exists():
            setattr(args, name, str(path))


def grpc_address(args: argparse.Namespace, flag_value: str, service: str, *, required: bool = True) -> str:
    """`service`'s gRPC address: the flag, else the found cluster's, else (no cluster found) the default
    port. Raises ServiceAbsent when the found cluster does not run it, or returns "" with required=False."""
    if flag_value:
        return flag_value
    found: Found | None = getattr(args, "found", None)
    state_dir = getattr(args, "state_dir", None)
    if found is None and state_dir is not None:
        found = Found(state_dir, read_record(state_dir / RECORD_FILE))
    if found is None:
        return default_address(service)
    address = found.grpc(service)
    if not address and required:
        raise found.absent(service)
    return address


def default_address(service: str, *, uid: int | None = None, tables: tuple[str, ...] | None = None) -> str:
    """`127.0.0.1:<documented default port>` of `service`, when no cluster of yours was found. Raises
    ServiceAbsent when another user's process listens there: on a shared machine that is someone else's
    cluster, and its answers (or your requests and tokens) must not be mixed with yours."""
    port = DEFAULT_PORTS[service]
    owner = listener_uid(port) if tables is None else listener_uid(port, tables)
    mine = os.getuid() if uid is None else uid
    if owner is not None and owner != mine:
        raise ServiceAbsent(
            f"no cluster of yours runs, and the default {service} port {port} is held by another user "
            f"(uid {owner}): not yours. Start one with `bandmaster up`, or name the address with a flag"
        )
    return f"127.0.0.1:{port}"


def channel(address: str, args: argparse.Namespace) -> tuple[grpc.Channel, tuple[tuple[str, str], ...]]:
    """A channel to `address` (TLS when a CA or certificate is given) and the call metadata (the control
    token, when one is given)."""
    security = client_security(
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        control_token_file=args.control_token_file,
        env=os.environ,
    )
    metadata: tuple[tuple[str, str], ...] = ()
    if security.control_tokens is not None:
        metadata = (("authorization", f"Bearer {security.control_tokens.first}"),)
    credentials = security.channel_credentials()
    if credentials is None:
        return grpc.insecure_channel(address), metadata
    return grpc.secure_channel(address, credentials), metadata


def _pem(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes() if path else None
    except OSError:
        return None


DIAGNOSIS_TTL_S = 30.0
_diagnoses: dict[tuple[str, bytes | None, bytes | None, bytes | None], tuple[float, str | None]] = {}


def _diagnosis(address: str, ca: bytes | None, cert: bytes | None, key: bytes | None) -> str | None:
    """`tls_diagnosis.diagnose` of `address`, kept DIAGNOSIS_TTL_S: the live `bandmaster status` view
    redraws every couple of seconds and must not spend up to 2 s re-probing a peer each time."""
    entry = (address, ca, cert, key)
    now = time.monotonic()
    kept = _diagnoses.get(entry)
    if kept is not None and now - kept[0] < DIAGNOSIS_TTL_S:
        return kept[1]
    why = diagnose(address, tls=bool(ca or cert), ca_pem=ca, cert_pem=cert, key_pem=key)
    for old in [k for k, (at, _) in _diagnoses.items() if now - at >= DIAGNOSIS_TTL_S]:
        del _diagnoses[old]  # (a long-lived `status` view meets few peers, but never keeps the expired)
    _diagnoses[entry] = (now, why)
    return why


def rpc_error(exc: grpc.RpcError, address: str, args: argparse.Namespace) -> str:
    """One line for a failed call: the status and its details; for UNAVAILABLE, what a TLS probe of
    `address` (`tls_diagnosis.diagnose`, at most 2 s, run only here, after the failure, and its answer
    kept 30 s) says is wrong."""
    code = exc.code()
    details = " ".join((exc.details() or "").split())
    if code is grpc.StatusCode.UNAVAILABLE:
        why = _diagnosis(address, _pem(args.tls_ca), _pem(args.tls_cert), _pem(args.tls_key))
        if why:
            return f"{code.name}: {why} (grpc: {details})"
    return f"{code.name}: {details}"
