"""The official openai client against an in-process simworker."""

from __future__ import annotations

import openai
import pytest

from tests.unit.simworker_http.conftest import MODEL

LONG_PROMPT = " ".join(f"line {i}: the agent reads file src/module_{i}.py and thinks" for i in range(40))


@pytest.fixture
def client(worker):
    return openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key="none", max_retries=0, timeout=30)


async def test_chat_non_stream(client):
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert reply.object == "chat.completion"
    assert reply.model == MODEL
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= reply.usage.completion_tokens <= 8
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


async def test_chat_stream_shapes_and_usage(client):
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish and finish[-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens >= 1
    assert content
    assert len({c.id for c in chunks}) == 1


async def test_completions_stream_and_non_stream(client):
    reply = await client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=5)
    assert reply.object == "text_completion"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens <= 5

    stream = await client.completions.create(
        model=MODEL, prompt="once upon a time", max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    text_chunks = [c for c in chunks if c.choices]
    # No separate finish chunk: finish_reason rides on the last text chunk.
    assert text_chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert chunks[-1].usage.completion_tokens == len(text_chunks) or chunks[-1].usage.completion_tokens >= 1


async def test_repeated_prompt_reports_cached_tokens(client):
    messages = [{"role": "user", "content": LONG_PROMPT}]
    first = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert first.usage.prompt_tokens > 100
    stream = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    usage = [c async for c in stream][-1].usage
    assert usage.prompt_tokens == first.usage.prompt_tokens
    assert usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    # Everything but the last partial page (and at least one token to prefill) is reused.
    assert usage.prompt_tokens - 16 <= cached < usage.prompt_tokens


async def test_cached_tokens_hidden_without_cache_report(make_worker):
    worker = await make_worker()
    client = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key="none", max_retries=0)
    for _ in range(2):
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=2
        )
    assert reply.usage.prompt_tokens_details is None


async def test_models(client, worker):
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    card = await client.models.retrieve(MODEL)
    assert card.id == MODEL


async def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


async def test_bad_max_tokens_is_400(client):
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=0)
