"""With no cluster of yours running, the client commands use the documented default ports, but never a port
that another user's process listens on (someone else's cluster on a shared machine)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from services.cli import endpoints
from services.common.serve.ports import DEFAULT_PORTS, listener_uid

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _table(tmp_path, rows: list[tuple[int, str, int]]) -> str:
    """A /proc/net/tcp of (port, state, uid) rows."""
    path = tmp_path / "tcp"
    lines = [
        f"   {i}: 0100007F:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000  {uid}        0 1"
        for i, (port, state, uid) in enumerate(rows)
    ]
    path.write_text(HEADER + "\n".join(lines) + "\n")
    return str(path)


def test_the_listener_of_a_port_is_read_from_the_kernel_table(tmp_path):
    table = _table(tmp_path, [(50052, "01", 1001), (50052, "0A", 1002), (8000, "0A", 0)])
    assert listener_uid(50052, (table,)) == 1002  # the LISTEN row, not an established connection's
    assert listener_uid(8000, (table,)) == 0
    assert listener_uid(9999, (table,)) is None
    assert listener_uid(8000, (str(tmp_path / "missing"),)) is None


def test_a_default_port_held_by_another_user_is_refused(tmp_path):
    port = DEFAULT_PORTS["scheduler"]
    table = _table(tmp_path, [(port, "0A", 1002)])
    with pytest.raises(endpoints.ServiceAbsent, match=rf"default scheduler port {port} is held by another user"):
        endpoints.default_address("scheduler", uid=1001, tables=(table,))
    assert endpoints.default_address("scheduler", uid=1002, tables=(table,)) == f"127.0.0.1:{port}"
    free = _table(tmp_path, [])
    assert endpoints.default_address("scheduler", uid=1001, tables=(free,)) == f"127.0.0.1:{port}"


def test_own_listener_on_this_machine_is_found():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert listener_uid(listener.getsockname()[1]) == os.getuid()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to listen as another user")
def test_a_real_listener_of_another_user_is_seen_as_theirs():
    code = (
        "import os, socket, sys, time\n"
        "os.setuid(65534)\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); time.sleep(30)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        port = int(other.stdout.readline())
        deadline = time.monotonic() + 5
        while listener_uid(port) != 65534 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listener_uid(port) == 65534
    finally:
        other.kill()
        other.wait()
