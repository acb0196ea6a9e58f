"""A prompt that cannot fit the model's context is refused by the router at once (issue 21), before Admit:
400 with an OpenAI-style body, code `context_length_exceeded`, the message naming the prompt's tokens and
the limit. Before, a new program's over-long prompt was held by the scheduler until its forced resume
(300 s at 1x) before the worker's own 400 came back.

The limit is the workers' `context_length` (SGLang's /server_info, via the capacity service's cards). Token
ids are counted exactly; text without a tokenizer only when certain (at least chars / 16 tokens). A
`max_tokens` that pushes prompt + output past the context is the worker's decision, passed through.
"""

from __future__ import annotations

import time

import aiohttp
import openai
import pytest

from tests.faults.support import Client
from tests.support import router_stack as stack
from tests.support.router_doubles import MODEL

pytestmark = pytest.mark.integration

CONTEXT = 2048


@pytest.fixture
async def cluster(tmp_path):
    st = stack.Stack(tmp_path)
    try:
        worker = st.add(await stack.simworker(tmp_path, "w", "--context-length", str(CONTEXT)))
        cap = st.add(await stack.capacity(tmp_path, [worker.ready["url"]]))
        sched = st.add(await stack.scheduler(tmp_path, cap.ready["grpc"]))
        router = st.add(
            await stack.router(tmp_path, cap.ready["grpc"], "--no-use-kv-events", scheduler_addr=sched.ready["grpc"])
        )
        url = stack.router_url(router)
        await stack.healthy_workers(url, 1)
        client = Client.connect(sched.ready["grpc"])
        try:
            yield url, client
        finally:
            await client.close()
    finally:
        await st.close()


def _openai(url: str, session_id: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=url + "/v1",
        api_key="none",
        timeout=10,
        max_retries=0,
        default_headers={"X-Dynamo-Session-ID": session_id},
    )


async def test_prompts_longer_than_the_context_are_refused_before_admit(cluster):
    url, scheduler = cluster

    # Text without a tokenizer: certain only past CONTEXT * 16 characters.
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as refused:
        await _openai(url, "long-chat").chat.completions.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "abcd " * (CONTEXT * 16 // 5 + 1)}]
        )
    assert time.monotonic() - started < 8.0  # at once (a held turn waits minutes; slack for a loaded CI box)
    error = refused.value.body
    assert refused.value.status_code == 400 and error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"
    assert f"has at least {CONTEXT + 1} tokens" in error["message"]  # 5 * 6554 characters / 16, rounded up
    assert f"maximum context length is {CONTEXT} tokens" in error["message"]

    # Longer than the worker's whole KV pool (the stack's simworker: 32768 tokens): a new program the scheduler
    # would hold until its forced resume before the worker's 400 (5 minutes at 1x), refused at once.
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as refused:
        await _openai(url, "longer-than-kv").completions.create(model=MODEL, max_tokens=4, prompt=[7] * 40_000)
    assert time.monotonic() - started < 8.0
    assert (
        refused.value.body["code"] == "context_length_exceeded" and "has 40000 tokens" in refused.value.body["message"]
    )

    # Token ids are counted exactly (SGLang's rule: refused at n >= context_length), streamed or not.
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            await _openai(url, f"long-ids-{stream}").completions.create(
                model=MODEL, max_tokens=4, prompt=[7] * CONTEXT, stream=stream
            )
        assert refused.value.body["code"] == "context_length_exceeded" and refused.value.body["param"] == "prompt"
        assert f"has {CONTEXT} tokens" in refused.value.body["message"]

    async with aiohttp.ClientSession() as s:
        async with s.post(
            url + "/generate",
            json={"input_ids": [7] * (CONTEXT + 10), "sampling_params": {"max_new_tokens": 4}},
            headers={"X-Dynamo-Session-ID": "long-generate"},
        ) as r:
            assert r.status == 400
            body = await r.json()
    assert body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "input_ids"
    assert f"has {CONTEXT + 10} tokens" in body["error"]["message"]

    # One token shorter fits the context: the router forwards it, and the worker answers it.
    fits = await _openai(url, "fits").completions.create(model=MODEL, max_tokens=1, prompt=[7] * (CONTEXT - 1))
    assert fits.usage.prompt_tokens == CONTEXT - 1

    # max_tokens past the context is the worker's call (SGLang's message), not the router's.
    with pytest.raises(openai.BadRequestError) as worker_refused:
        await _openai(url, "long-output").completions.create(model=MODEL, max_tokens=1000, prompt=[7] * (CONTEXT - 100))
    assert worker_refused.value.body.get("code") != "context_length_exceeded"
    assert "Requested token count exceeds the model's maximum context length" in str(worker_refused.value.body)

    # The refused programs never reached the scheduler; the forwarded ones did.
    programs = await scheduler.programs()
    assert not {"long-chat", "longer-than-kv", "long-ids-False", "long-ids-True", "long-generate"} & programs.keys()
    assert {"fits", "long-output"} <= programs.keys()
    assert await stack.metric(url, "bandmaster_router_requests_total", 'outcome="error_400"') == 6
