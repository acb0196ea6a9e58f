"""A worker killed (SIGKILL) in the middle of a stream: the client's stream ends at once with an
OpenAI-style error event and [DONE] (never a silent truncation that looks like a finished answer),
and the program's next turn is served by the surviving worker."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from clients import session_headers
from tests.support import router_stack as stack
from tests.support.router_doubles import MODEL

pytestmark = pytest.mark.integration


async def test_a_worker_killed_mid_stream_ends_the_stream_with_an_error_and_the_next_turn_moves(tmp_path):
    st = stack.Stack(tmp_path)
    try:
        # speedup 1: a long answer takes seconds, so the stream is still running when its worker dies
        workers = [st.add(await stack.simworker(tmp_path, f"w{i}", "--speedup", "1")) for i in range(2)]
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"] for w in workers]))
        router = st.add(await stack.router(tmp_path, cap.ready["grpc"], "--no-use-kv-events"))
        url = stack.router_url(router)
        await stack.healthy_workers(url, 2)
        headers = session_headers("agent-1")
        body = {
            "model": MODEL,
            "stream": True,
            "max_tokens": 2000,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "write a long story"}],
        }
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
                chunks = 0
                async for line in r.content:
                    chunks += line.startswith(b"data:")
                    if chunks == 5:
                        break
                loads = [await stack.worker_load(w.ready["url"]) for w in workers]
                serving = max(range(2), key=lambda i: loads[i].get("num_reqs", 0))
                killed_at = time.monotonic()
                workers[serving].kill()
                rest = await asyncio.wait_for(r.read(), 15)
                ended_after = time.monotonic() - killed_at
        events = [line for line in rest.split(b"\n") if line.startswith(b"data:")]
        assert events[-1] == b"data: [DONE]"
        error = json.loads(events[-2][5:])["error"]
        assert set(error) >= {"message", "type"}, error
        assert not any(b'"finish_reason":"stop"' in e or b'"finish_reason":"length"' in e for e in events)
        assert ended_after < 5, ended_after

        survivor = workers[1 - serving]
        before = await stack.metric(survivor.ready["url"], "sglang:prompt_tokens_total")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            async with s.post(
                url + "/v1/chat/completions",
                headers=headers,
                json={**body, "max_tokens": 4, "stream": False, "ignore_eos": False},
            ) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["choices"][0]["message"]["content"]
        assert await stack.metric(survivor.ready["url"], "sglang:prompt_tokens_total") > before
    finally:
        await st.close()
