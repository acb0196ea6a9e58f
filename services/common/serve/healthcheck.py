"""A container health probe: `python -m services.common.serve.healthcheck TARGET...`, exit 0 when all are healthy.

One image runs every Bandmaster service, and the slim base image has no curl or grpc_health_probe,
so the image's HEALTHCHECK and each compose service's `healthcheck` call this module with the
service's own endpoints:

    grpc://HOST:PORT      grpc.health.v1 Check of the whole server ("") must answer SERVING
    http://HOST:PORT/PATH GET must answer 2xx (the router's and simworker's `/health`)

With no TARGET it reads them from BANDMASTER_HEALTHCHECK (space-separated), so the image's
default HEALTHCHECK works for whichever service a container runs. Every probe has a deadline
(`--timeout-seconds`): a hung server is unhealthy, not a hung probe. Plain-text gRPC and HTTP only;
a secure cluster (mutual TLS) needs a probe that holds a client certificate.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Mapping, Sequence
from urllib.parse import urlsplit

ENV_TARGETS = "BANDMASTER_HEALTHCHECK"
DEFAULT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ProbeResult:
    """One target's verdict; `detail` is what an operator reads in `docker inspect`."""

    target: str
    healthy: bool
    detail: str


def parse_target(target: str) -> tuple[str, str]:
    """'grpc://h:p' -> ('grpc', 'h:p'); 'http(s)://...' -> ('http', url). ValueError otherwise."""
    parts = urlsplit(target)
    if parts.scheme == "grpc" and parts.hostname and parts.port:
        return "grpc", parts.netloc
    if parts.scheme in ("http", "https") and parts.hostname and parts.port:
        return "http", target
    raise ValueError(f"{target!r}: expected grpc://HOST:PORT or http://HOST:PORT/PATH with an explicit port")


def probe_grpc(address: str, timeout_s: float) -> ProbeResult:
    # Imported here so that an HTTP-only probe (the simworker) does not pay for loading grpc.
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = f"grpc://{address}"
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            return ProbeResult(target, False, f"{exc.code().name}: {exc.details()}")
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return ProbeResult(target, reply.status == health_pb2.HealthCheckResponse.SERVING, status)


def probe_http(url: str, timeout_s: float) -> ProbeResult:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return ProbeResult(url, 200 <= response.status < 300, f"HTTP {response.status}")
    except urllib.error.HTTPError as exc:
        return ProbeResult(url, False, f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return ProbeResult(url, False, f"unreachable: {reason}")


def probe(target: str, timeout_s: float) -> ProbeResult:
    kind, where = parse_target(target)
    return probe_grpc(where, timeout_s) if kind == "grpc" else probe_http(where, timeout_s)


def targets_from(argv_targets: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The command line's targets, else BANDMASTER_HEALTHCHECK's; ValueError when neither names one."""
    targets = list(argv_targets) or env.get(ENV_TARGETS, "").split()
    if not targets:
        raise ValueError(f"no target: pass grpc://HOST:PORT or http://HOST:PORT/PATH, or set {ENV_TARGETS}")
    for target in targets:
        parse_target(target)
    return targets


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1, not argparse's 2: Docker reserves a HEALTHCHECK's exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def run(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, list[ProbeResult]]:
    """Probe every target: (0, results) when all are healthy, else (1, results); a usage error is (1, [])."""
    parser = _Parser(
        prog="python -m services.common.serve.healthcheck",
        description="Probe Bandmaster endpoints (container HEALTHCHECK)",
    )
    parser.add_argument(
        "targets", nargs="*", help=f"grpc://HOST:PORT or http://HOST:PORT/PATH (default: ${ENV_TARGETS})"
    )
    parser.add_argument("--timeout-seconds", type=float, default=DEFAULT_TIMEOUT_S, help="deadline of each probe")
    try:
        args = parser.parse_args(list(argv))
        targets = targets_from(args.targets, env)
    except ValueError as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1, []
    results = [probe(t, args.timeout_seconds) for t in targets]
    return (0 if all(r.healthy for r in results) else 1), results


def main(argv: Sequence[str] | None = None) -> int:
    code, results = run(sys.argv[1:] if argv is None else argv, os.environ)
    for r in results:
        print(f"{'ok' if r.healthy else 'UNHEALTHY'} {r.target}: {r.detail}")
    return code


if __name__ == "__main__":
    sys.exit(main())
