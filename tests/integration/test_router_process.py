"""`python -m services.router` against real simworkers and the capacity service, with a scheduler that
records every call: program turns, passthrough, final requests, validation, disconnects, gRPC + SDK.
"""

from __future__ import annotations

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from bandmaster.scheduler.v1 import scheduler_pb2 as spb
from clients import BandmasterClient, session_headers
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL, RecordingScheduler

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


class Env:
    def __init__(self, st, workers, sched, router):
        self.st, self.workers, self.sched, self.router = st, workers, sched, router
        self.url = stack.router_url(router)

    def openai(self, **headers) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.url + "/v1", api_key="none", default_headers=headers, max_retries=0)

    async def worker_requests(self) -> float:
        total = 0.0
        for w in self.workers:
            total += await stack.metric(w.ready["url"], "sglang:prompt_tokens_total")
        return total


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("router")
    st = stack.Stack(tmp)
    sched = RecordingScheduler()
    try:
        w1 = st.add(await stack.simworker(tmp, "w1"))
        w2 = st.add(await stack.simworker(tmp, "w2"))
        cap = st.add(await stack.capacity(tmp, [w1.ready["url"], w2.ready["url"]]))
        address = await sched.start()
        router = st.add(await stack.router(tmp, cap.ready["grpc"], "--max-body-bytes", "65536", scheduler_addr=address))
        e = Env(st, [w1, w2], sched, router)

        async def two_workers():
            async with aiohttp.ClientSession() as s:
                async with s.get(e.url + "/health") as r:
                    return r.status == 200 and (await r.json())["workers"] == 2

        await assert_eventually(two_workers, timeout_s=20)
        yield e
    finally:
        await st.close()
        await sched.stop()


def _turn_messages(turn: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a coding agent. " * 40}]
    for i in range(turn):
        messages += [
            {"role": "user", "content": f"step {i}: run the tests"},
            {"role": "assistant", "content": f"ran step {i}"},
        ]
    return messages + [{"role": "user", "content": f"step {turn}: continue"}]


async def test_program_turns_are_admitted_routed_and_completed(env):
    client = env.openai(**session_headers("prog-1"))
    for turn in range(3):
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=_turn_messages(turn),
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        assert text and usage is not None and usage.completion_tokens == 12
        assert usage.prompt_tokens_details is not None
    answer = await client.chat.completions.create(
        model=MODEL, messages=_turn_messages(3), max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert answer.usage.completion_tokens == 5 and answer.usage.prompt_tokens_details.cached_tokens > 0

    admits = [a for a in env.sched.of("Admit") if a.session_id == "prog-1"]
    assert len(admits) == 4 and all(a.estimated_prompt_tokens > 0 for a in admits)

    def completed():
        done = [c for c in env.sched.of("Complete") if c.session_id == "prog-1"]
        assert len(done) == 4
        return done

    done = await assert_eventually(completed)
    assert {c.request_id for c in done} == {a.request_id for a in admits}
    assert all(c.outcome == spb.TURN_OUTCOME_OK and c.prompt_tokens > 0 and c.worker_id for c in done)
    assert [c.completion_tokens for c in done] == [12, 12, 12, 5]
    assert done[-1].cached_tokens > 0
    # Streaming turns report dispatch-to-first-token; the non-streaming one cannot (0 = unknown).
    assert all(c.ttft_seconds > 0 for c in done[:3]) and done[-1].ttft_seconds == 0
    # The history is re-sent each turn: approximate KV routing keeps the program on one worker.
    assert len({c.worker_id for c in done}) == 1


async def test_passthrough_is_admitted_with_empty_session_bound_and_completed(env):
    answer = await env.openai().completions.create(model=MODEL, prompt="plain request " * 20, max_tokens=4)
    assert answer.choices[0].text
    admit = next(a for a in reversed(env.sched.of("Admit")) if a.session_id == "")
    bind = await assert_eventually(lambda: [b for b in env.sched.of("Bind") if b.request_id == admit.request_id])
    done = await assert_eventually(lambda: [c for c in env.sched.of("Complete") if c.request_id == admit.request_id])
    assert bind[0].worker_id == done[0].worker_id and done[0].completion_tokens == 4


async def test_a_final_request_is_served_then_released_and_one_without_content_touches_no_worker(env):
    client = env.openai(**session_headers("prog-final"))
    await client.chat.completions.create(model=MODEL, messages=_turn_messages(0), max_tokens=3)
    final = env.openai(**session_headers("prog-final", final=True))
    before = await env.worker_requests()
    answer = await final.chat.completions.create(model=MODEL, messages=_turn_messages(1), max_tokens=3)
    assert answer.choices[0].message.content and answer.usage.completion_tokens == 3  # the message was served
    assert await env.worker_requests() > before

    def released_after_complete():
        calls = [(c.method, c.request.session_id) for c in env.sched.calls if c.method in ("Complete", "Release")]
        mine = [method for method, session_id in calls if session_id == "prog-final"]
        assert mine[-2:] == ["Complete", "Release"], mine
        return True

    await assert_eventually(released_after_complete)
    # Without content: only the release (an empty completion), no worker.
    before = await env.worker_requests()
    stream = await final.completions.create(model=MODEL, prompt="", max_tokens=3, stream=True)
    assert [c.choices[0].text async for c in stream if c.choices] == [""]
    assert [r.session_id for r in env.sched.of("Release")].count("prog-final") == 2
    assert await env.worker_requests() == before


@pytest.mark.parametrize(
    "headers, body, status",
    [
        ({"X-Dynamo-Session-ID": "x" * 257}, None, 400),
        ({"X-Dynamo-Session-ID": "bad\tid"}, None, 400),
        ({"X-Dynamo-Parent-Session-ID": "p" * 300}, None, 400),
        ({"X-Dynamo-Session-ID": "ok", "X-Dynamo-Session-Final": "maybe"}, None, 400),
        ({}, b"{not json", 400),
        ({}, b'["a list"]', 400),
        ({}, b'{"messages": "hi"}', 400),
        ({}, b'{"messages": []}', 400),
        ({}, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', 400),
        ({}, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}', 400),
        ({}, b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', 400),
        ({}, b'{"messages": [{"role": "user", "content": "hi"}], "model": "no-such-model"}', 404),
        ({}, b'{"messages": [{"role": "user", "content": "' + b"a" * 70000 + b'"}]}', 413),
    ],
)
async def test_invalid_requests_get_4xx_and_nothing_is_forwarded(env, headers, body, status):
    body = body or b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    picks_before = await stack.metric(env.url, "bandmaster_router_picks_total")
    worker_before = await env.worker_requests()
    admits_before = len(env.sched.of("Admit"))
    async with aiohttp.ClientSession() as s:
        async with s.post(
            env.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json", **headers}
        ) as r:
            assert r.status == status
            error = (await r.json())["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert await stack.metric(env.url, "bandmaster_router_picks_total") == picks_before
    assert await env.worker_requests() == worker_before
    assert len(env.sched.of("Admit")) == admits_before


async def test_client_disconnect_aborts_upstream_and_completes_cancelled(env):
    client = env.openai(**session_headers("prog-cancel"))
    stream = await client.chat.completions.create(
        model=MODEL, messages=_turn_messages(0), max_tokens=50000, stream=True, extra_body={"ignore_eos": True}
    )
    received = 0
    async for _chunk in stream:
        received += 1
        if received == 5:
            break
    running = 0
    for w in env.workers:
        running += (await stack.worker_load(w.ready["url"]))["num_running_reqs"]
    assert running == 1, "the turn should still be generating"
    await stream.close()

    async def drained():
        loads = [await stack.worker_load(w.ready["url"]) for w in env.workers]
        return all(load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0 for load in loads)

    await assert_eventually(drained, timeout_s=10)
    done = await assert_eventually(lambda: [c for c in env.sched.of("Complete") if c.session_id == "prog-cancel"])
    assert done[0].outcome == spb.TURN_OUTCOME_CANCELLED
    aborted = sum([await stack.metric(w.ready["url"], "sglang:num_aborted_requests_total") for w in env.workers])
    assert aborted >= 1


async def test_grpc_generate_and_sdk_program(env):
    address = env.router.ready["grpc"]
    async with BandmasterClient(address) as client:
        async with client.program("prog-grpc") as program:
            chunks = [c async for c in program.chat([{"role": "user", "content": "hello " * 30}], max_tokens=6)]
            text = "".join(c.text for c in chunks)
            last = chunks[-1]
            assert text and last.finish_reason == "length" and last.usage.completion_tokens == 6
            assert sum(c.tokens for c in chunks) == 6 and last.worker_id
            chunks = [c async for c in program.complete("a prompt " * 10, max_tokens=3)]
            assert chunks[-1].usage.completion_tokens == 3
    assert "prog-grpc" in [r.session_id for r in env.sched.of("Release")]
    done = [c for c in env.sched.of("Complete") if c.session_id == "prog-grpc"]
    assert len(done) == 2
