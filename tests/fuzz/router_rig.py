"""An in-process router (tests/support/router_inprocess) in front of a healthy worker that answers every
API the router forwards to, and a real in-process batch service (following a real planner) behind its Batch
API (`/v1/files*`, `/v1/batches*`), for the router's HTTP and gRPC fuzz modules.

The worker checks what it is sent: every forwarded body must be a JSON object of the API's shape;
anything else is recorded in `bad_forwards` (the router forwarded something it should have refused).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import tempfile
from pathlib import Path

from aiohttp import web

from services.batch.server import RunningBatch, start_batch
from services.common.auth.security import SecurityConfig, Tokens
from services.planner.server import RunningPlanner, start_planner
from tests.fuzz.common import LoopRig
from tests.support.router_doubles import MODEL
from tests.support.router_inprocess import InProcessRouter
from tests.support.sglang_stub import sglang_info
from tests.unit.batch.fakes import batch_config
from tests.unit.planner.fakes import planner_config

DATA_TOKEN = "fuzz-data-token"


class HealthyWorker:
    """Answers /v1/chat/completions, /v1/completions and /generate, streamed or not, like SGLang."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()  # InProcessRouter.close sets it
        self.requests = 0
        self.bad_forwards: list[str] = []
        info = sglang_info(max_total_num_tokens=32768, page_size=16, model_path=MODEL)
        self.info = info
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _body(self, request: web.Request, *required: str) -> dict | None:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self.bad_forwards.append(f"{request.path}: not JSON ({exc}): {raw[:200]!r}")
            return None
        if not isinstance(body, dict):
            self.bad_forwards.append(f"{request.path}: not an object: {raw[:200]!r}")
            return None
        if not any(name in body for name in required):
            self.bad_forwards.append(f"{request.path}: none of {required}: {raw[:200]!r}")
        for name in ("temperature", "top_p"):
            value = body.get(name)
            if isinstance(value, float) and not math.isfinite(value):
                self.bad_forwards.append(f"{request.path}: {name}={value}")
        return body

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        chat = request.path == "/v1/chat/completions"
        body = await self._body(request, "messages" if chat else "prompt")
        if body is None:
            return web.json_response(
                {"object": "error", "message": "bad body", "type": "BadRequestError", "code": 400}, status=400
            )
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": "ok ok"}, "finish_reason": "stop"}
                if chat
                else {"index": 0, "text": "ok ok", "finish_reason": "stop"}
            )
            return web.json_response(
                {"id": "x", "object": kind, "created": 1, "model": MODEL, "choices": [choice], "usage": usage}
            )
        head = {"id": "x", "object": kind + (".chunk" if chat else ""), "created": 1, "model": MODEL}

        def piece(text: str | None, finish: str | None) -> dict:
            if chat:
                return {"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}
            return {"index": 0, "text": text or "", "finish_reason": finish}

        chunks = [{**head, "choices": [piece("ok", None)]}, {**head, "choices": [piece(" ok", "stop")]}]
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": usage})
        return await self._sse(request, chunks)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        body = await self._body(request, "text", "input_ids")
        if body is None:
            return web.json_response({"error": {"message": "bad body"}}, status=400)
        meta = {
            "id": "x",
            "finish_reason": {"type": "stop", "matched": None},
            "prompt_tokens": 5,
            "completion_tokens": 2,
            "cached_tokens": 0,
        }
        if not body.get("stream"):
            return web.json_response({"text": "ok ok", "output_ids": [1, 2], "meta_info": meta})
        first = {"text": "ok", "output_ids": [1], "meta_info": {**meta, "completion_tokens": 1}}
        return await self._sse(request, [first, {"text": "ok ok", "output_ids": [1, 2], "meta_info": meta}])

    async def _sse(self, request: web.Request, chunks: list[dict]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response(self.info)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/server_info", self._info)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/completions", self._openai)
        app.router.add_post("/generate", self._generate)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# Limits far above what a run reaches (the limiter runs; it never refuses), a short body deadline (a fuzzed
# Content-Length that promises more than is sent costs a quarter second, not thirty); the head deadline stays
# long enough for a loaded machine (every head sent here is complete).
ROUTER_SETTINGS = dict(
    client_max_programs=10**9,
    client_new_programs_per_second=1e9,
    client_new_programs_burst=10**9,
    http_body_timeout_seconds=0.25,
    http_header_timeout_seconds=5.0,
    max_body_bytes=256 * 1024,
)


class RouterRig(LoopRig):
    """An in-process router with one healthy worker, the recording scheduler, a batch service and its planner,
    on its own loop. The batch service holds one input file and one batch from the start (`file_id`, `batch_id`)."""

    def __init__(self, *, secured: bool = False) -> None:
        super().__init__()
        settings = dict(ROUTER_SETTINGS)
        security = SecurityConfig(data_tokens=Tokens([DATA_TOKEN])) if secured else SecurityConfig()
        settings["security"] = security
        self.tmp = Path(tempfile.mkdtemp(prefix="fuzz-planner-"))
        self.worker = HealthyWorker()
        # The planner's lease is a pause (cap 0): the seeded batch stays queued, nothing is dispatched.
        self.planner: RunningPlanner = self.run(start_planner(planner_config(self.tmp, max_batch_admission_rps=0.0)))
        self.batch: RunningBatch = self.run(
            start_batch(batch_config(self.tmp, self.planner.address, "http://127.0.0.1:9", security=security))
        )
        settings["batch_url"] = self.batch.http_url
        self.router: InProcessRouter = self.run(self._start(settings))
        self.file_id, self.batch_id = self.run(self._seed(secured))

    async def _start(self, settings: dict) -> InProcessRouter:
        await self.worker.start()
        router = await InProcessRouter.start((), **settings)
        router.workers.append(self.worker)
        router.set_workers([0])
        return router

    async def _seed(self, secured: bool) -> tuple[str, str]:
        import aiohttp

        line = {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        }
        headers = {"Authorization": f"Bearer {DATA_TOKEN}"} if secured else {}
        async with aiohttp.ClientSession(headers=headers) as session:
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", json.dumps(line).encode() + b"\n", filename="in.jsonl")
            async with session.post(self.router.url + "/v1/files", data=form) as r:
                assert r.status == 200, await r.text()
                file_id = (await r.json())["id"]
            async with session.post(
                self.router.url + "/v1/batches",
                json={"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
            ) as r:
                assert r.status == 200, await r.text()
                batch_id = (await r.json())["id"]
        return file_id, batch_id

    @property
    def port(self) -> int:
        return self.router.port

    def server_errors(self) -> float:
        return sum(
            self.router.sample("bandmaster_router_requests_total", outcome=f"error_{status}") for status in (500, 501)
        )

    def check_worker(self) -> None:
        if self.worker.bad_forwards:
            bad = list(self.worker.bad_forwards)
            self.worker.bad_forwards.clear()
            raise AssertionError("the router forwarded what it should have refused:\n" + "\n".join(bad))

    def trim(self) -> None:
        """Keep the recording scheduler's call log short over thousands of examples."""
        sched = self.router.sched
        if sched is not None and len(sched.calls) > 2000:
            sched.calls.clear()
            sched.released.clear()

    def close(self) -> None:
        self.run(self.router.close())
        self.run(self.batch.stop())
        self.run(self.planner.stop())
        super().close()
        shutil.rmtree(self.tmp, ignore_errors=True)
