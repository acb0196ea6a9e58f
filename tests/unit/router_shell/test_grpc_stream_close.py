"""A Generate stream that grpc closes from another task must not log 'Failed to detach context'.

grpc.aio runs a server stream's generator in one task and may close it (client gone, deadline) from
another. A span made current across a `yield` attaches the trace context in the first task and detaches it
in the second, which OpenTelemetry refuses and logs at ERROR. Found by the gRPC wire fuzz (CI).
"""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

from opentelemetry import trace

from bandmaster.router.v1 import router_pb2 as rpb
from services.router.core.outcome import Outcome
from services.router.ingress.grpc_api import RouterServicer
from services.router.observe.metrics import RouterMetrics
from services.router.turn.relay import LineKind


class _Turn:
    def __init__(self) -> None:
        self.replica = SimpleNamespace(worker_id="w0")
        self.usage = SimpleNamespace(prompt_tokens=3, completion_tokens=2, cached_tokens=0)
        self.finish_reason = "stop"
        self.closed: list[Outcome] = []

    async def lines(self):
        for n in range(1, 50):
            chunk = {"choices": [{"text": "x"}], "usage": {"completion_tokens": n}}
            yield b"data: " + json.dumps(chunk).encode(), LineKind.DATA
            await asyncio.sleep(0)

    async def close(self, outcome: Outcome) -> None:
        self.closed.append(outcome)


class _Runner:
    def __init__(self) -> None:
        self.turn = _Turn()
        self.parent_span_ids: list[int] = []

    async def open(self, spec):
        self.parent_span_ids.append(trace.get_current_span().get_span_context().span_id)
        return self.turn


class _Context:
    def invocation_metadata(self):
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"


async def test_a_generate_stream_closed_from_another_task_logs_no_error(caplog):
    from opentelemetry.sdk.trace import TracerProvider

    runner = _Runner()
    tracer = TracerProvider().get_tracer("test")
    servicer = RouterServicer(runner, RouterMetrics(), tracer)
    stream = servicer.Generate(rpb.GenerateRequest(session_id="p", prompt="hi"), _Context())
    with caplog.at_level(logging.ERROR):
        first = await asyncio.get_running_loop().create_task(stream.__anext__())
        assert first.text == "x"
        await stream.aclose()  # another task's context, as grpc.aio does on a cancel
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert runner.turn.closed == [Outcome.CANCELLED]
    assert runner.parent_span_ids[0] != 0, "the worker pick still runs inside the request span"
