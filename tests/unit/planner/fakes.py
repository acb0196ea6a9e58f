"""In-process doubles for planner shell tests: an OpenAI-compatible upstream and a planner fixture."""

from __future__ import annotations

import asyncio
import collections
import json

from aiohttp import web

from services.planner.config import PlannerConfig


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


def planner_config(tmp_path, **kw) -> PlannerConfig:
    base = dict(
        listen="127.0.0.1:0",
        metrics_port=-1,
        http_listen="127.0.0.1:0",
        registry_path=str(tmp_path / "planner.sqlite3"),
        tick_interval_seconds=0.1,
        tick_max_duration_seconds=1.0,
        observe_timeout_seconds=0.5,
        effect_timeout_seconds=1.0,
        drain_lease_duration_seconds=10.0,
        assume_no_online_traffic=True,
        virtual_initial_replicas=1,
        safe_rps_per_replica=100.0,
        cold_start_margin_seconds=0.0,
        finalization_margin_seconds=0.0,
        shutdown_grace_seconds=0.5,
    )
    base.update(kw)
    return PlannerConfig(**base)


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
