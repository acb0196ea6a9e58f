"""Listening ports: the documented defaults, and one clear line when a port is taken.

A service that cannot bind raises `PortInUse` naming the address, what it is for and the flag that
moves it; the entry points print `str(exc)` as one line (no traceback) and exit 1.
"""

from __future__ import annotations

import errno
import socket
from contextlib import contextmanager
from typing import Iterator

DEFAULT_PORTS: dict[str, int] = {
    "capacity": 50051,
    "scheduler": 50052,
    "router": 50053,
    "router_http": 8000,
    "planner": 50061,
    "batch": 50063,
    "batch_http": 8090,
    "capacity_metrics": 9101,
    "scheduler_metrics": 9102,
    "router_metrics": 9103,
    "planner_metrics": 9105,
    "batch_metrics": 9106,
    "simworker": 30000,
}
"""The fixed ports a local cluster uses unless told otherwise (the services' own `--listen` /
`--metrics-port` / `--http-port` defaults are the same; a unit test keeps them equal). Simulated
workers take `simworker`, `simworker + 1`, ... in order."""


class PortInUse(OSError):
    """`host:port` is taken: `what` it was for and the `flag` that chooses another."""

    def __init__(self, host: str, port: int, what: str, flag: str) -> None:
        super().__init__(errno.EADDRINUSE, f"port {port} is already in use")
        self.host = host
        self.port = port
        self.what = what
        self.flag = flag

    def __str__(self) -> str:
        return f"port {self.port} ({self.what}) on {self.host} is already in use; choose another with {self.flag}"


def port_free(host: str, port: int) -> bool:
    """True when `host:port` can be bound now (port 0 always can). A snapshot: another process may
    take it a moment later, which the bind itself then reports."""
    if port == 0:
        return True
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as servers set it, so a port in TIME_WAIT counts as free, a listener as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def require_free(host: str, port: int, what: str, flag: str) -> None:
    """Raise PortInUse unless `host:port` can be bound."""
    if not port_free(host, port):
        raise PortInUse(host, port, what, flag)


@contextmanager
def binding(host: str, port: int, what: str, flag: str) -> Iterator[None]:
    """Around a bind: an 'address already in use' becomes PortInUse naming `what` and `flag`."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE and not isinstance(exc, PortInUse):
            raise PortInUse(host, port, what, flag) from None
        raise


PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"


def listener_uid(port: int, tables: tuple[str, ...] = PROC_NET_TCP) -> int | None:
    """The uid of the process that listens on TCP `port` (any local address), from the kernel's socket
    tables; None when nothing listens there or the tables cannot be read (not Linux)."""
    for table in tables:
        try:
            with open(table, encoding="ascii") as rows:
                next(rows, None)  # the header
                for row in rows:
                    fields = row.split()
                    if len(fields) < 8 or fields[3] != _LISTEN:
                        continue
                    if int(fields[1].rpartition(":")[2], 16) == port:
                        return int(fields[7])
        except (OSError, ValueError):
            continue
    return None
