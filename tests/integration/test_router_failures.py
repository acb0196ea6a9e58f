"""Failure semantics with real processes: retry before the first token, error event after it,
scheduler outage (fail open, then back to admission), no healthy worker."""

from __future__ import annotations

import aiohttp
import pytest
from openai import AsyncOpenAI

from bandmaster.scheduler.v1 import scheduler_pb2 as spb
from clients import session_headers
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL, FaultyWorker, RecordingScheduler

pytestmark = pytest.mark.integration


def _client(url: str, **headers) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="none", default_headers=headers, max_retries=0)


async def test_worker_failing_before_first_token_is_retried_on_another(tmp_path):
    st = stack.Stack(tmp_path)
    faulty = FaultyWorker("refuse")
    await faulty.start()
    try:
        good = st.add(await stack.simworker(tmp_path, "good"))
        cap = st.add(await stack.capacity(tmp_path, [faulty.url, good.ready["url"]]))
        # temperature high: picks spread over both workers, so the faulty one is chosen at some point
        router = st.add(
            await stack.router(tmp_path, cap.ready["grpc"], "--router-temperature", "10", "--no-use-kv-events")
        )
        url = stack.router_url(router)
        await stack.healthy_workers(url, 2)
        client = _client(url)
        for i in range(8):
            stream = await client.chat.completions.create(
                model=MODEL, max_tokens=3, stream=bool(i % 2), messages=[{"role": "user", "content": f"q{i}"}]
            )
            if i % 2:
                assert [c async for c in stream]
            else:
                assert stream.choices[0].message.content
            if faulty.requests:
                break
        assert faulty.requests >= 1
        assert await stack.metric(url, "bandmaster_router_retries_total") == faulty.requests
    finally:
        await st.close()
        await faulty.stop()


async def test_worker_failing_after_first_token_ends_stream_with_error_and_failed_turn(tmp_path):
    st = stack.Stack(tmp_path)
    faulty = FaultyWorker("break")
    await faulty.start()
    sched = RecordingScheduler()
    try:
        address = await sched.start()
        cap = st.add(await stack.capacity(tmp_path, [faulty.url]))
        router = st.add(await stack.router(tmp_path, cap.ready["grpc"], scheduler_addr=address))
        url = stack.router_url(router)
        await stack.healthy_workers(url, 1)
        async with aiohttp.ClientSession() as s:
            async with s.post(
                url + "/v1/chat/completions",
                headers=session_headers("prog-broken"),
                json={"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            ) as r:
                assert r.status == 200
                events = [line for line in (await r.read()).split(b"\n") if line.startswith(b"data:")]
        assert b'"partial"' in events[1]
        assert events[-2].startswith(b'data: {"error"') and events[-1] == b"data: [DONE]"
        done = await assert_eventually(lambda: sched.of("Complete"))
        assert done[0].session_id == "prog-broken" and done[0].outcome == spb.TURN_OUTCOME_FAILED
    finally:
        await st.close()
        await faulty.stop()
        await sched.stop()


async def test_scheduler_outage_fails_open_then_admission_resumes(tmp_path):
    st = stack.Stack(tmp_path)
    sched = RecordingScheduler()
    try:
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        address = f"127.0.0.1:{stack.free_port()}"
        router = st.add(
            await stack.router(
                tmp_path, cap.ready["grpc"], "--block-size", "16", "--no-use-kv-events", scheduler_addr=address
            )
        )
        url = stack.router_url(router)
        await stack.healthy_workers(url, 1)
        client = _client(url, **session_headers("prog-open"))
        for i in range(3):
            answer = await client.chat.completions.create(
                model=MODEL, max_tokens=2, messages=[{"role": "user", "content": f"t{i}"}]
            )
            assert answer.choices[0].message.content
        assert await stack.metric(url, "bandmaster_router_scheduler_fail_open_total") == 3
        assert await stack.metric(url, "bandmaster_router_scheduler_reachable") == 0
        assert router.log_text().count("failing open") == 1

        await sched.start(address)  # the scheduler comes back

        async def admitted():
            await client.chat.completions.create(
                model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "again"}]
            )
            return sched.of("Admit")

        await assert_eventually(admitted, timeout_s=15, interval_s=0.2)
        assert await stack.metric(url, "bandmaster_router_scheduler_reachable") == 1
        assert "reachable again" in router.log_text()
        await assert_eventually(lambda: sched.of("Complete"))
    finally:
        await st.close()
        await sched.stop()


async def test_no_healthy_worker_is_503(tmp_path):
    st = stack.Stack(tmp_path)
    try:
        cap = st.add(await stack.capacity(tmp_path, []))
        router = st.add(await stack.router(tmp_path, cap.ready["grpc"]))
        url = stack.router_url(router)
        async with aiohttp.ClientSession() as s:
            async with s.post(
                url + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            ) as r:
                assert r.status == 503
                assert (await r.json())["error"]["type"] == "service_unavailable"
            async with s.get(url + "/health") as r:
                assert r.status == 503
    finally:
        await st.close()
