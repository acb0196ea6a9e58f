"""In-process doubles for batch service tests: an OpenAI-compatible upstream, a batch file, and a running
planner + batch service pair (the batch service follows the planner's lease over gRPC)."""

from __future__ import annotations

import asyncio
import collections
import json
from dataclasses import dataclass

from aiohttp import web

from services.batch.config import BatchConfig
from services.batch.server import RunningBatch, start_batch
from services.planner.server import RunningPlanner, start_planner
from tests.unit.planner.fakes import planner_config


class FakeUpstream:
    """Answers /v1/chat/completions and /v1/completions; counts requests per custom X-Request-Id prefix."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.status_queue: collections.deque[int] = collections.deque()
        self.gate: asyncio.Event | None = None
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> "FakeUpstream":
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.gate is not None:
            await self.gate.wait()
        status = self.status_queue.popleft() if self.status_queue else 200
        if status != 200:
            return web.json_response({"error": {"message": "nope", "type": "server_error"}}, status=status)
        text = "echo:" + json.dumps(body.get("messages", body.get("prompt")))[:40]
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            },
            headers={"X-Request-Id": request.headers.get("X-Request-Id", "")},
        )


def batch_config(tmp_path, planner_address: str, dispatch_url: str, **kw) -> BatchConfig:
    base = dict(
        listen="127.0.0.1:0",
        metrics_port=-1,
        http_listen="127.0.0.1:0",
        registry_path=str(tmp_path / "batch.sqlite3"),
        planner=planner_address,
        dispatch_url=dispatch_url,
        report_interval_seconds=0.1,
        planner_timeout_seconds=1.0,
        shutdown_grace_seconds=0.5,
    )
    base.update(kw)
    return BatchConfig(**base)


@dataclass
class Stack:
    """A planner and the batch service that follows it."""

    planner: RunningPlanner
    batch: RunningBatch

    @property
    def http_url(self) -> str:
        return self.batch.http_url

    @property
    def registry(self):
        return self.batch.registry

    async def stop(self) -> None:
        await self.batch.stop()
        await self.planner.stop()


async def start_stack(tmp_path, dispatch_url: str, *, planner: dict | None = None, **batch_kw) -> Stack:
    running_planner = await start_planner(planner_config(tmp_path, **(planner or {})))
    try:
        running_batch = await start_batch(batch_config(tmp_path, running_planner.address, dispatch_url, **batch_kw))
    except BaseException:
        await running_planner.stop()
        raise
    return Stack(running_planner, running_batch)


def batch_jsonl(n: int, *, url: str = "/v1/chat/completions", prefix: str = "req") -> bytes:
    lines = []
    for i in range(n):
        body = (
            {"model": "m", "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 4}
            if url == "/v1/chat/completions"
            else {"model": "m", "prompt": f"hello {i}", "max_tokens": 4}
        )
        lines.append(json.dumps({"custom_id": f"{prefix}-{i}", "method": "POST", "url": url, "body": body}))
    return ("\n".join(lines) + "\n").encode()
