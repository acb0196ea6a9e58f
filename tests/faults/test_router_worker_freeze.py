"""A frozen worker (SIGSTOP) must not stall the turns sent to it: before the first token they are retried
on another worker once the first-token timeout passes, and the worker leaves rotation; a stream it froze
in the middle of ends within the inter-token timeout with an OpenAI-style error event and [DONE].

The capacity service is told to keep frozen workers HEALTHY (it would otherwise notice them itself):
this is the router's own detection."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp
import pytest

from tests.support import router_stack as stack
from tests.support.router_doubles import MODEL

pytestmark = pytest.mark.integration

FIRST_TOKEN_S = 1.0
INTER_TOKEN_S = 1.0


async def _stream(url: str, i: int, max_tokens: int = 4) -> tuple[list[bytes], float]:
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        async with s.post(
            url + "/v1/chat/completions",
            json={
                "model": MODEL,
                "stream": True,
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": f"question {i}"}],
            },
        ) as r:
            assert r.status == 200
            events = [line for line in (await r.read()).split(b"\n") if line.startswith(b"data:")]
    return events, time.monotonic() - started


async def test_turns_sent_to_a_frozen_worker_are_retried_before_the_first_token(tmp_path):
    st = stack.Stack(tmp_path)
    frozen = None
    try:
        workers = [st.add(await stack.simworker(tmp_path, f"w{i}")) for i in range(2)]
        cap = st.add(
            await stack.capacity(tmp_path, [w.ready["url"] for w in workers], "--unhealthy-after-failures", "100000")
        )
        router = st.add(
            await stack.router(
                tmp_path,
                cap.ready["grpc"],
                "--no-use-kv-events",
                "--router-temperature",
                "10",
                "--upstream-first-token-timeout-seconds",
                str(FIRST_TOKEN_S),
                "--worker-failure-threshold",
                "2",
                "--worker-eject-seconds",
                "30",
            )
        )
        url = stack.router_url(router)
        await stack.healthy_workers(url, 2)
        frozen = workers[0]
        frozen.send_signal(signal.SIGSTOP)

        results = await asyncio.wait_for(asyncio.gather(*(_stream(url, i) for i in range(6))), 25)
        # Picks are random (temperature 10): top up one by one until two turns met the frozen worker.
        for i in range(6, 40):
            if await stack.metric(url, "bandmaster_router_retries_total") >= 2:
                break
            results.append(await asyncio.wait_for(_stream(url, i), 25))
        for events, elapsed in results:
            assert events[-1] == b"data: [DONE]" and not any(b'"error"' in e for e in events)
            assert elapsed < FIRST_TOKEN_S + 3, elapsed
        retries = await stack.metric(url, "bandmaster_router_retries_total")
        assert retries >= 2
        # The frozen worker left rotation: the next turns go straight to the other one.
        assert await stack.metric(url, "bandmaster_router_workers_out_of_rotation") == 1
        results = await asyncio.wait_for(asyncio.gather(*(_stream(url, 100 + i) for i in range(4))), 25)
        assert all(elapsed < FIRST_TOKEN_S for _, elapsed in results)
        assert await stack.metric(url, "bandmaster_router_retries_total") == retries
        assert "worker " in router.log_text() and "out of rotation" in router.log_text()
    finally:
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
        await st.close()


async def test_a_stream_whose_worker_freezes_ends_with_an_error_event(tmp_path):
    st = stack.Stack(tmp_path)
    worker = None
    try:
        # speedup 1: a few hundred tokens take seconds, so the stream is still running when it freezes
        worker = st.add(await stack.simworker(tmp_path, "w", "--speedup", "1"))
        cap = st.add(await stack.capacity(tmp_path, [worker.ready["url"]], "--unhealthy-after-failures", "100000"))
        router = st.add(
            await stack.router(
                tmp_path,
                cap.ready["grpc"],
                "--no-use-kv-events",
                "--upstream-inter-token-timeout-seconds",
                str(INTER_TOKEN_S),
            )
        )
        url = stack.router_url(router)
        await stack.healthy_workers(url, 1)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            async with s.post(
                url + "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "stream": True,
                    "max_tokens": 2000,
                    "ignore_eos": True,
                    "messages": [{"role": "user", "content": "write a long story"}],
                },
            ) as r:
                assert r.status == 200
                chunks = 0
                async for line in r.content:
                    if line.startswith(b"data:"):
                        chunks += 1
                    if chunks == 5:
                        break
                worker.send_signal(signal.SIGSTOP)
                frozen_at = time.monotonic()
                rest = await asyncio.wait_for(r.read(), INTER_TOKEN_S + 10)
                ended_after = time.monotonic() - frozen_at
        events = [line for line in rest.split(b"\n") if line.startswith(b"data:")]
        assert events[-1] == b"data: [DONE]"
        error = json.loads(events[-2][5:])["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "upstream_timeout"
        assert ended_after < INTER_TOKEN_S + 2.5, ended_after
        assert await stack.metric(url, "bandmaster_router_requests_total", 'outcome="failed"') == 1
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGCONT)
        await st.close()
