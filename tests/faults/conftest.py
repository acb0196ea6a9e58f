import pytest

from tests.faults.support import ScriptedCapacity
from tests.support.redis_server import redis_server  # noqa: F401  (fixture)

W = ("w1", 0)


@pytest.fixture
async def scripted_capacity():
    """One replica of 10,000 tokens."""
    cap = ScriptedCapacity({W: 10_000})
    await cap.start()
    yield cap
    await cap.stop()
