"""Slow clients against a real router process: hundreds of connections with incomplete bodies, one with
incomplete headers and an idle kept-alive one are all closed within their timeouts, the connection cap
answers 503, and the router keeps serving."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from tests.support import router_stack as stack
from tests.support.router_doubles import MODEL

pytestmark = pytest.mark.integration

SLOW = 200


async def _closed(reader: asyncio.StreamReader, within_s: float) -> bytes:
    async with asyncio.timeout(within_s):
        return await reader.read()


async def test_slow_clients_are_cut_off_and_the_cap_holds(tmp_path):
    st = stack.Stack(tmp_path)
    writers = []
    try:
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        router = st.add(
            await stack.router(
                tmp_path,
                cap.ready["grpc"],
                "--http-header-timeout-seconds",
                "2",
                "--http-body-timeout-seconds",
                "2",
                "--http-keepalive-timeout-seconds",
                "2",
                "--http-max-connections",
                str(SLOW + 2),
            )
        )
        port = router.ready["http_port"]
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        started = time.monotonic()
        readers = []
        for _ in range(SLOW):  # incomplete bodies
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head + body[:10])
            readers.append(reader)
            writers.append(writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # incomplete headers
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Dyn")
        readers.append(reader)
        writers.append(writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # idle kept-alive
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        readers.append(reader)
        writers.append(writer)

        # At the cap: one more connection is refused with an OpenAI-style 503 (the slow ones are not cut yet).
        assert time.monotonic() - started < 1.5
        async with aiohttp.ClientSession() as s:
            async with s.get(stack.router_url(router) + "/health") as r:
                assert r.status == 503 and r.headers["Retry-After"] == "1"
                assert (await r.json())["error"]["type"] == "service_unavailable"
        answers = await asyncio.wait_for(asyncio.gather(*(_closed(r, 10) for r in readers)), 15)
        assert time.monotonic() - started < 8
        assert sum(a.startswith(b"HTTP/1.1 408") for a in answers) == SLOW
        url = stack.router_url(router)
        assert await stack.metric(url, "bandmaster_router_http_timeouts_total", 'phase="body"') == SLOW
        assert await stack.metric(url, "bandmaster_router_http_connections") <= 1
        async with aiohttp.ClientSession() as s:  # still serving
            async with s.post(
                url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == 200
    finally:
        for writer in writers:
            writer.close()
        await st.close()
