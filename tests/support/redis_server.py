"""A real redis-server on a free loopback port, for tests (installed by `make test`'s system-deps).

    server = RedisServer(tmp_path).start(); ... server.stop(); server.start()  # same port again, no data

No persistence of its own (`--save ""`, no AOF, files under `tmp`): SIGSTOP/SIGCONT (`signal`) and
SIGKILL (`kill`) + `start` on the same port are the faults. `redis_server` is a pytest fixture (skips
the test when the binary is missing).
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from tests.support.processes import Process, free_port, start

__all__ = ["RedisServer", "free_port", "redis_server"]


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, tmp: Path, port: int | None = None) -> None:
        self.tmp = tmp
        self.port = port or free_port()
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (make system-deps)")
        self.process = start(
            f"redis-{self.port}",
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
                "--protected-mode",
                "no",
            ],
            self.tmp,
            cwd=self.tmp,
        )
        self.process.wait_for(lambda: _pong(self.port), timeout_s=timeout_s, what="answering PING", interval_s=0.02)
        return self

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait_exit()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace_s=10)


@pytest.fixture
def redis_server(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make system-deps installs it)")
    server = RedisServer(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()
