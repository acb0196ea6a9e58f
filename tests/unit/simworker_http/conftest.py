"""Fixtures: an in-process simworker on 127.0.0.1:0 with the real engine core."""

from __future__ import annotations

import pytest

from services.simworker.config import load_config
from services.simworker.server import RunningSimWorker, start_simworker

MODEL = "test-model"


def _engine_override():
    """None = the real SimEngine; the scripted engine only while engine.py has not landed."""
    try:
        import services.simworker.core.engine  # noqa: F401
        return None
    except ImportError:
        from tests.unit.simworker_http.scripted_engine import ScriptedEngine

        return ScriptedEngine()


@pytest.fixture
async def make_worker():
    started: list[RunningSimWorker] = []

    async def make(*argv: str, env: dict | None = None) -> RunningSimWorker:
        args = ["--port", "0", "--model-name", MODEL, "--speedup", "100", *argv]
        config = load_config(args, env or {})
        worker = await start_simworker(config, engine=_engine_override())
        started.append(worker)
        return worker

    yield make
    for worker in started:
        await worker.stop()


@pytest.fixture
async def worker(make_worker) -> RunningSimWorker:
    return await make_worker("--enable-cache-report")
