"""Test doubles for the router's neighbours: a scheduler that records every call (until the real
scheduler service can be started in its place) and a worker that fails on purpose.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import grpc
from aiohttp import web

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.sglang_stub import sglang_info

MODEL = "bandmaster/simworker"


@dataclass
class Call:
    method: str
    request: object
    metadata: dict


class WithoutAdmitMux(pb_grpc.SchedulerServicer):
    """A scheduler double from before AdmitMux: the router sends Admit (AdmitStream) and Complete as calls of
    their own. (The generated base would raise, which gRPC logs as an error and answers UNKNOWN; a scheduler
    built without the method answers UNIMPLEMENTED, as here.)"""

    async def AdmitMux(self, request_iterator, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no AdmitMux in this double")
        yield pb.MuxResponse()  # never reached: makes this a streaming handler


@dataclass
class RecordingScheduler(WithoutAdmitMux):
    """Admits everything at once, except sessions in `hold` (held until removed from it; AdmitStream says
    `held` with `max_hold_seconds` first) and sessions in `silent` (never answered: a frozen scheduler).
    Admit and AdmitStream are both recorded as "Admit"."""

    calls: list[Call] = field(default_factory=list)
    hold: set[str] = field(default_factory=set)
    silent: set[str] = field(default_factory=set)
    block_loop: dict[str, float] = field(default_factory=dict)
    """session -> seconds: AdmitStream blocks the whole event loop that long (time.sleep) before answering,
    as a stalled router process would be (router and double share the test's loop)."""
    answer_after_hops: dict[str, int] = field(default_factory=dict)
    """session -> n: AdmitStream yields to the event loop n times before answering (an answer on its way
    that needs loop turns to arrive: a saturated loop makes each turn slow)."""
    max_hold_seconds: float = 1800.0
    priority: int = 7
    pin: tuple[str, int] | None = None
    released: set[str] = field(default_factory=set)
    server: grpc.aio.Server | None = None
    port: int = 0

    def _record(self, method: str, request, context) -> None:
        self.calls.append(Call(method, request, dict(context.invocation_metadata() or ())))

    def of(self, method: str) -> list:
        return [c.request for c in self.calls if c.method == method]

    async def Admit(self, request, context):
        self._record("Admit", request, context)
        while request.session_id in self.hold:
            await asyncio.sleep(0.02)
        worker, rank = self.pin or ("", 0)
        return pb.AdmitResponse(worker_id=worker, dp_rank=rank, pinned=bool(worker), priority=self.priority)

    async def AdmitStream(self, request, context):
        self._record("Admit", request, context)
        while request.session_id in self.silent:
            await asyncio.sleep(0.02)
        if request.session_id in self.block_loop:
            time.sleep(self.block_loop[request.session_id])
        for _ in range(self.answer_after_hops.get(request.session_id, 0)):
            await asyncio.sleep(0)
        if request.session_id in self.hold:
            await context.write(pb.AdmitUpdate(held=pb.AdmitHeld(max_hold_seconds=self.max_hold_seconds)))
        while request.session_id in self.hold:
            await asyncio.sleep(0.02)
        worker, rank = self.pin or ("", 0)
        await context.write(
            pb.AdmitUpdate(
                decision=pb.AdmitResponse(worker_id=worker, dp_rank=rank, pinned=bool(worker), priority=self.priority)
            )
        )

    async def Bind(self, request, context):
        self._record("Bind", request, context)
        return pb.BindResponse(bound=True)

    async def Complete(self, request, context):
        self._record("Complete", request, context)
        return pb.CompleteResponse()

    async def Release(self, request, context):
        self._record("Release", request, context)
        known = request.session_id in {a.session_id for a in self.of("Admit")} - self.released
        self.released.add(request.session_id)
        return pb.ReleaseResponse(released=known)

    async def WatchEvents(self, request, context):
        # No event stream here: the router's admission fast path stays off (every turn asks Admit first).
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no event stream in this double")
        yield pb.ProgramEvent()  # never reached: makes this a server-stream handler

    async def GetRouterConfig(self, request, context):
        self._record("GetRouterConfig", request, context)
        return pb.RouterConfig(
            router_temperature=0.0,
            kv_overlap_score_weight=1.0,
            use_kv_events=False,
            router_track_active_blocks=True,
            router_track_prefill_tokens=True,
            router_ttl_secs=120.0,
            router_block_size=128,
        )

    async def start(self, address: str = "127.0.0.1:0") -> str:
        self.server = grpc.aio.server()
        pb_grpc.add_SchedulerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(address)
        await self.server.start()
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)


class FaultyWorker:
    """Looks like a healthy SGLang server to the capacity service; generation behaves as `mode` says
    (changeable at any time):

    * `ok`     - a valid answer (streamed: role chunk, two content chunks, finish, usage, [DONE]);
    * `refuse` - 500 before anything;
    * `break`  - streamed: one content chunk, then the connection is cut;
    * `hang`   - nothing at all (not even headers) until `gate` is set, then as `ok`;
    * `stall`  - streamed: headers, then nothing until `gate` is set, then as `ok`;
    * `stall_after_first` - streamed: the first content chunk, then nothing until `gate` is set.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests = 0
        self.last_body: dict = {}
        self.gate = asyncio.Event()
        self.error_message = "boom"
        info = sglang_info(max_total_num_tokens=32768, page_size=16, model_path=MODEL)
        info["served_model_name"] = MODEL
        self.info = info
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _info(self, request):
        return web.json_response(self.info)

    async def _health(self, request):
        return web.Response(status=200)

    async def _generate(self, request):
        self.requests += 1
        mode = self.mode
        body = await request.json()
        self.last_body = body
        if mode == "refuse":
            return web.json_response(
                {"object": "error", "message": self.error_message, "type": "InternalServerError", "code": 500},
                status=500,
            )
        if mode == "hang":
            await self.gate.wait()
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 1,
                    "model": MODEL,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok ok"}, "finish_reason": "stop"}
                    ],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if mode == "stall":
            await self.gate.wait()
        head = '{"id":"x","object":"chat.completion.chunk","created":1,"model":"%s","choices":' % MODEL
        await response.write(
            (
                "data: " + head + '[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
            ).encode()
        )
        await response.write(
            ("data: " + head + '[{"index":0,"delta":{"content":"partial"},"finish_reason":null}]}\n\n').encode()
        )
        if mode == "break":
            request.transport.close()  # cut the connection mid-stream
            return response
        if mode == "stall_after_first":
            await self.gate.wait()
        await response.write(
            ("data: " + head + '[{"index":0,"delta":{"content":" ok"},"finish_reason":"stop"}]}\n\n').encode()
        )
        await response.write(("data: " + head + '[],"usage":%s}\n\n' % json.dumps(usage)).encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/server_info", self._info)
        app.router.add_get("/get_server_info", self._info)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
