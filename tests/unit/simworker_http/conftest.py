"""Fixtures: an in-process simworker on 127.0.0.1:0 with the real engine core."""

from __future__ import annotations

import pytest

from services.simworker.config import load_config
from services.simworker.server import RunningSimWorker, start_simworker

MODEL = "test-model"


@pytest.fixture
async def make_worker():
    started: list[RunningSimWorker] = []

    async def make(*argv: str, env: dict | None = None) -> RunningSimWorker:
        args = ["--port", "0", "--model-name", MODEL, "--speedup", "100", *argv]
        config = load_config(args, env or {})
        worker = await start_simworker(config)
        started.append(worker)
        return worker

    yield make
    for worker in started:
        await worker.stop()


@pytest.fixture
async def worker(make_worker) -> RunningSimWorker:
    return await make_worker("--enable-cache-report")
