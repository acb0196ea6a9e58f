import socket

import pytest


@pytest.fixture
def taken_port():
    """A loopback port held open (listening) for the test: a service asked to bind it must refuse."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]
