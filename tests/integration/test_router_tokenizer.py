"""Token-exact routing with real processes: router and simworkers share a model tokenizer (built on the
spot), the workers publish KV events and the router indexes them. A chat conversation's second turn
must match the first turn's blocks in the router's event index, by exactly as many tokens as the
worker then finds in its cache; which can only hold if router and worker tokenize the same way."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from services.common.sglang.tokenizer import load_tokenizer
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.processes import run_module
from tests.support.router_doubles import MODEL
from tests.support.tokenizer_files import tokenizer_dir  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

PAGE = 4
APPLIED = 'outcome="applied"'


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory, tokenizer_dir):
    tmp = tmp_path_factory.mktemp("router-tokenizer")
    st = stack.Stack(tmp)
    try:
        workers = [
            st.add(
                await stack.simworker(
                    tmp, name, "--tokenizer-path", str(tokenizer_dir), "--page-size", str(PAGE), kv_events=True
                )
            )
            for name in ("w1", "w2")
        ]
        cap = st.add(await stack.capacity(tmp, [w.ready["url"] for w in workers]))
        router = st.add(
            await stack.router(
                tmp,
                cap.ready["grpc"],
                "--tokenizer",
                str(tokenizer_dir),
                "--use-kv-events",
                "--router-temperature",
                "0",
                "--seed",
                "0",
            )
        )
        url = stack.router_url(router)

        async def two_workers():
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/health") as r:
                    return r.status == 200 and (await r.json())["workers"] == 2

        await assert_eventually(two_workers, timeout_s=20)
        await _until_subscribed(url, workers)
        yield url, workers
    finally:
        await st.close()


async def _until_subscribed(url: str, workers) -> None:
    """ZMQ subscriptions join late (events before are lost): send each worker a fresh prompt directly until
    the router has applied an event of it."""
    for worker in workers:
        attempt = 0

        async def applied_one(worker=worker) -> bool:  # bound now: awaited within this iteration
            nonlocal attempt
            attempt += 1
            before = await stack.metric(url, "bandmaster_router_kv_events_total", APPLIED)
            async with aiohttp.ClientSession() as s:
                text = f"warm up {worker.name} attempt {attempt} " * 4
                async with s.post(
                    worker.ready["url"] + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}}
                ) as r:
                    assert r.status == 200
            # A short wait per attempt; a lost event means another attempt with another prompt.
            return await assert_eventually(lambda: _more_than(url, before), timeout_s=0.5, interval_s=0.05)

        await assert_eventually(applied_one, timeout_s=20, interval_s=0.05)


async def _more_than(url: str, before: float) -> bool:
    return await stack.metric(url, "bandmaster_router_kv_events_total", APPLIED) > before


async def _events_settled(url: str) -> float:
    """Poll until the applied-events count stops moving (the worker's events for a finished turn arrived)."""
    last = {"value": -1.0}

    async def stable() -> float:
        value = await stack.metric(url, "bandmaster_router_kv_events_total", APPLIED)
        settled = value == last["value"]
        last["value"] = value
        return settled and value

    return await assert_eventually(stable, timeout_s=10, interval_s=0.2)


async def test_second_turn_matches_first_turn_blocks_exactly(env, tokenizer_dir):
    url, _ = env
    tok = load_tokenizer(tokenizer_dir)
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    turn1 = [
        {"role": "system", "content": "You are a coding agent. Run the tests and fix what fails. " * 12},
        {"role": "user", "content": "run the tests"},
    ]
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=turn1,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    answer, usage1 = "", None
    async for chunk in stream:
        if chunk.choices:
            answer += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage1 = chunk.usage
    # The worker's token count is the shared tokenizer's (the router computed the same ids to route).
    prompt1 = len(tok.chat_token_ids({"messages": turn1}))
    assert usage1 is not None and usage1.prompt_tokens == prompt1 > 8 * PAGE
    await _events_settled(url)

    predicted_before = await stack.metric(url, "bandmaster_router_predicted_cached_tokens_total")
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "now fix what fails"}]
    second = await client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=4)
    predicted = await stack.metric(url, "bandmaster_router_predicted_cached_tokens_total") - predicted_before

    assert second.usage.prompt_tokens == len(tok.chat_token_ids({"messages": turn2}))
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Turn 1's prompt pages were indexed from the worker's events and matched by turn 2's token pages,
    # on the worker that holds them, by exactly the tokens the worker found in its cache.
    assert cached >= prompt1 - prompt1 % PAGE
    assert predicted == cached
    assert await stack.metric(url, "bandmaster_router_prompts_total", 'mode="tokens"') == 2
    assert await stack.metric(url, "bandmaster_router_prompts_total", 'mode="text"') == 0


async def test_completions_text_is_routed_on_the_same_pages(env, tokenizer_dir):
    url, _ = env
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    prompt = "call the tool with the arguments, then read its output carefully. " * 6
    first = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens == len(load_tokenizer(tokenizer_dir).encode(prompt))
    await _events_settled(url)
    before = await stack.metric(url, "bandmaster_router_predicted_cached_tokens_total")
    again = await client.completions.create(model=MODEL, prompt=prompt + "And again.", max_tokens=2)
    predicted = await stack.metric(url, "bandmaster_router_predicted_cached_tokens_total") - before
    assert again.usage.prompt_tokens_details.cached_tokens == predicted > 0


@pytest.mark.parametrize(
    "module, args",
    [
        ("services.router", ["--no-scheduler", "--tokenizer"]),
        ("services.simworker", ["--port", "0", "--tokenizer-path"]),
    ],
)
async def test_an_unloadable_tokenizer_is_a_configuration_error_exit_2(tmp_path, module, args):
    missing = tmp_path / "no-such-model"
    process = await asyncio.to_thread(run_module, module, *args, str(missing))
    assert process.returncode == 2
    assert "invalid configuration: tokenizer=" in process.stderr and str(missing) in process.stderr
