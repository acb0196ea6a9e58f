"""Fixtures shared by the batch service's tests."""

from __future__ import annotations

import pytest

from tests.unit.batch.fakes import FakeUpstream


@pytest.fixture
async def upstream():
    """A fake OpenAI-compatible endpoint the dispatcher sends batch requests to."""
    up = await FakeUpstream().start()
    yield up
    await up.stop()
