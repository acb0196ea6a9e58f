import shutil

import pytest

from tests.faults.support import RedisServer, ScriptedCapacity

W = ("w1", 0)


@pytest.fixture
async def scripted_capacity():
    """One replica of 10,000 tokens."""
    cap = ScriptedCapacity({W: 10_000})
    await cap.start()
    yield cap
    await cap.stop()


@pytest.fixture
def redis_server(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make system-deps installs it)")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
