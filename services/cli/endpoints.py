"""How the client commands (`programs`, `plan`, `status`, `batch`) find a cluster and talk to it.

An address comes from, in order: its own flag; the `--state-dir` of a `bandmaster up` (its children's
ready files); the discovery file a running `bandmaster up` writes (`cluster_file()`: its addresses and
state dir, removed when it stops); the documented default port on loopback. A `--secure` cluster's state
dir also gives the CA, the client certificate and the tokens, unless flags name them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Mapping

import grpc

from services.common.certs import LocalPki
from services.common.ports import DEFAULT_PORTS
from services.common.ready import read_ready_file
from services.common.security import client_security
from services.common.tls_diagnosis import diagnose

CLUSTER_FILE_ENV = "BANDMASTER_CLUSTER_FILE"


def cluster_file(env: Mapping[str, str] = os.environ) -> Path:
    """Where `bandmaster up` says where it is: $BANDMASTER_CLUSTER_FILE, else
    $XDG_RUNTIME_DIR/bandmaster/cluster.json, else ~/.bandmaster/cluster.json."""
    if env.get(CLUSTER_FILE_ENV):
        return Path(env[CLUSTER_FILE_ENV])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "bandmaster" / "cluster.json"
    return Path(env.get("HOME") or Path.home()) / ".bandmaster" / "cluster.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_cluster_file(path: Path) -> dict:
    """The running cluster's record, or {} when there is none (or its `bandmaster up` is gone)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int) or not _alive(record["pid"]):
        return {}
    return record


def write_cluster_file(path: Path, record: dict) -> bool:
    """Publish `record` (it carries this process's pid) unless another live `bandmaster up` owns the file;
    True when written."""
    other = read_cluster_file(path)
    if other and other.get("pid") != record.get("pid"):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)
    return True


def remove_cluster_file(path: Path, pid: int) -> None:
    """Remove the file if it is still `pid`'s."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(record, dict) and record.get("pid") == pid:
        path.unlink(missing_ok=True)


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the --state-dir of `bandmaster up`: addresses (and a --secure cluster's CA, client "
        "certificate and tokens) are read from it (default: the running `bandmaster up` found "
        f"through its discovery file, ${CLUSTER_FILE_ENV} or ~/.bandmaster/cluster.json)",
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


def discover(args: argparse.Namespace, *addresses: str, env: Mapping[str, str] = os.environ) -> None:
    """Without --state-dir and without any of the address flags `addresses`, take the running cluster's
    state dir from the discovery file (when there is one). An address given by flag is taken as it is:
    a discovered secure cluster's certificates must not be sent to some other server."""
    if getattr(args, "state_dir", None) is None and not any(addresses):
        record = read_cluster_file(cluster_file(env))
        if record.get("state_dir"):
            args.state_dir = Path(record["state_dir"])


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


def grpc_address(args: argparse.Namespace, flag_value: str, service: str) -> str:
    """`service`'s gRPC address: the flag, else its ready file in the state dir, else the default port."""
    return (
        flag_value
        or ready(getattr(args, "state_dir", None), service).get("grpc")
        or f"127.0.0.1:{DEFAULT_PORTS[service]}"
    )


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
