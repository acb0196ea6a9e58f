"""/generate (raw SSE), errors, abort, health, flush, metadata and /metrics over real HTTP."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.support.eventually import assert_eventually
from tests.unit.simworker_http.conftest import MODEL


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def sse_events(response: aiohttp.ClientResponse) -> list:
    """Parse an SSE body into JSON objects, with the literal '[DONE]' kept as a string."""
    events = []
    body = (await response.read()).decode()
    assert body.endswith("\n\n")
    for block in body.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def test_generate_stream_is_cumulative(worker, http):
    async with http.post(
        worker.url + "/generate",
        json={
            "text": "the quick brown fox",
            "sampling_params": {"max_new_tokens": 5, "ignore_eos": True},
            "stream": True,
            "rid": "r-stream",
        },
    ) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        events = await sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 5
    for earlier, later in zip(chunks, chunks[1:]):
        assert later["text"].startswith(earlier["text"])
        assert later["output_ids"][: len(earlier["output_ids"])] == earlier["output_ids"]
    for chunk in chunks[:-1]:
        assert chunk["meta_info"]["finish_reason"] is None
        assert "e2e_latency" not in chunk["meta_info"]
    final = chunks[-1]["meta_info"]
    assert final["id"] == "r-stream"
    assert final["finish_reason"] == {"type": "length", "length": 5}
    assert final["completion_tokens"] == 5 and len(chunks[-1]["output_ids"]) == 5
    assert final["prompt_tokens"] > 0 and final["cached_tokens"] >= 0
    assert final["e2e_latency"] > 0 and final["num_retractions"] == 0


async def test_generate_non_stream_with_input_ids(worker, http):
    async with http.post(
        worker.url + "/generate",
        json={"input_ids": list(range(300, 340)), "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}},
    ) as r:
        assert r.status == 200
        body = await r.json()
    assert body["meta_info"]["prompt_tokens"] == 40
    assert len(body["output_ids"]) == 3 and body["meta_info"]["finish_reason"]["type"] == "length"
    assert isinstance(body["text"], str)


async def test_stream_interval_groups_tokens(make_worker, http):
    worker = await make_worker("--stream-interval", "4")
    async with http.post(
        worker.url + "/generate",
        json={"text": "x", "sampling_params": {"max_new_tokens": 9, "ignore_eos": True}, "stream": True},
    ) as r:
        chunks = (await sse_events(r))[:-1]
    # first token immediately, then every 4 tokens, and the final chunk
    assert [len(c["output_ids"]) for c in chunks] == [1, 5, 9] or [len(c["output_ids"]) for c in chunks][-1] == 9
    assert len(chunks) <= 4


@pytest.mark.parametrize(
    "path, kwargs, status, fragment",
    [
        ("/generate", {"data": b"{not json"}, 400, "malformed JSON"),
        ("/generate", {"json": {"sampling_params": {}}}, 400, "text or input_ids"),
        ("/generate", {"json": {"text": "a", "sampling_params": {"max_new_tokens": 0}}}, 400, "positive"),
        ("/v1/chat/completions", {"json": {"model": MODEL}}, 400, "messages"),
        ("/v1/chat/completions", {"data": b"{}", "headers": {"Content-Type": "text/plain"}}, 400, "Content-Type"),
        (
            "/v1/chat/completions",
            {"json": {"model": "other", "messages": [{"role": "user", "content": "x"}]}},
            404,
            "does not exist",
        ),
        (
            "/v1/chat/completions",
            {"json": {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}},
            400,
            "positive",
        ),
        (
            "/v1/chat/completions",
            {
                "json": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                }
            },
            400,
            "text parts",
        ),
        ("/v1/completions", {"json": {"model": MODEL}}, 400, "prompt"),
        ("/v1/completions", {"data": b"[1,", "headers": {"Content-Type": "application/json"}}, 400, "malformed"),
    ],
)
async def test_errors_are_openai_shaped(worker, http, path, kwargs, status, fragment):
    async with http.post(worker.url + path, **kwargs) as r:
        assert r.status == status
        body = await r.json()
    assert body["object"] == "error" and body["code"] == status
    assert fragment in body["message"]
    assert body["type"]


async def test_prompt_longer_than_context_is_400(make_worker, http):
    worker = await make_worker("--context-length", "64", "--max-total-tokens", "4096")
    async with http.post(worker.url + "/v1/completions", json={"model": MODEL, "prompt": list(range(300, 400))}) as r:
        assert r.status == 400
        assert "context length" in (await r.json())["message"]
    async with http.post(worker.url + "/generate", json={"input_ids": list(range(300, 400))}) as r:
        assert r.status == 400


async def test_client_disconnect_aborts_the_request(worker, http):
    async with http.post(
        worker.url + "/generate",
        json={
            "text": "long job",
            "sampling_params": {"max_new_tokens": 100_000, "ignore_eos": True},
            "stream": True,
            "rid": "gone",
        },
    ) as r:
        first = await r.content.readuntil(b"\n\n")
        assert first.startswith(b"data: ")
        assert worker.driver.in_flight() == ["gone"]
    # The connection is closed here, mid-stream.
    await assert_eventually(lambda: worker.driver.in_flight() == [] and not worker.engine.has_work())
    stats = worker.engine.stats()
    assert stats.num_running_reqs == 0 and stats.num_queue_reqs == 0


async def test_abort_request_ends_stream_with_abort(worker, http):
    async def consume():
        async with http.post(
            worker.url + "/generate",
            json={
                "text": "abort me",
                "sampling_params": {"max_new_tokens": 100_000, "ignore_eos": True},
                "stream": True,
                "rid": "victim",
            },
        ) as r:
            return await sse_events(r)

    task = asyncio.create_task(consume())
    await assert_eventually(lambda: "victim" in worker.driver.in_flight())
    async with http.post(worker.url + "/abort_request", json={"rid": "victim"}) as r:
        assert r.status == 200
    events = await asyncio.wait_for(task, 10)
    assert events[-1] == "[DONE]"
    assert events[-2]["meta_info"]["finish_reason"]["type"] == "abort"


async def test_abort_all(worker, http):
    async def consume(rid):
        async with http.post(
            worker.url + "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": rid}],
                "max_tokens": 100_000,
                "ignore_eos": True,
                "rid": rid,
            },
        ) as r:
            return await r.json()

    tasks = [asyncio.create_task(consume(f"all-{i}")) for i in range(3)]
    await assert_eventually(lambda: len(worker.driver.in_flight()) == 3)
    async with http.post(worker.url + "/abort_request", json={"abort_all": True}) as r:
        assert r.status == 200
    replies = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert [reply["choices"][0]["finish_reason"] for reply in replies] == ["abort"] * 3


async def test_server_info_fields(make_worker, http):
    worker = await make_worker(
        "--page-size",
        "64",
        "--max-total-tokens",
        "131072",
        "--enable-hierarchical-cache",
        "--hicache-size",
        "10",
        "--enable-priority-scheduling",
        "--hicache-storage-backend",
        "mooncake",
    )
    for path in ("/server_info", "/get_server_info"):
        async with http.get(worker.url + path) as r:
            assert r.status == 200
            info = await r.json()
        assert info["status"] == "ready"
        assert info["served_model_name"] == MODEL and info["model_path"]
        assert (info["tp_size"], info["dp_size"], info["page_size"]) == (1, 1, 64)
        assert info["max_total_num_tokens"] == 131072 == info["max_total_tokens"]
        assert info["max_req_input_len"] == min(info["context_length"], 131072) - 1
        assert info["enable_hierarchical_cache"] is True and info["hicache_size"] == 10.0
        assert info["hicache_storage_backend"] == "mooncake"
        assert info["kv_bytes_per_token"] > 0
        assert info["hicache_host_total_tokens"] == int(10e9 // info["kv_bytes_per_token"])
        assert info["enable_priority_scheduling"] is True
        for key in (
            "max_running_requests",
            "chunked_prefill_size",
            "hicache_ratio",
            "hicache_write_policy",
            "schedule_low_priority_values_first",
            "disable_priority_preemption",
            "priority_scheduling_preemption_threshold",
            "enable_metrics",
            "enable_cache_report",
            "kv_events_config",
            "version",
        ):
            assert key in info
        state = info["internal_states"][0]
        assert {"memory_usage", "last_gen_throughput", "waiting_queue_size", "running_batch_size"} <= set(state)
        assert state["memory_usage"]["token_capacity"] == 131072
    async with http.get(worker.url + "/model_info") as r:
        assert (await r.json())["is_generation"] is True


async def test_health_and_health_generate(worker, http):
    async with http.get(worker.url + "/health") as r:
        assert r.status == 200
    async with http.get(worker.url + "/health_generate") as r:
        assert r.status == 200
    worker.api.state = "shutting_down"
    async with http.get(worker.url + "/health") as r:
        assert r.status == 503
    async with http.get(worker.url + "/health_generate") as r:
        assert r.status == 503


async def test_flush_cache_refused_while_busy(worker, http):
    async with http.post(
        worker.url + "/generate",
        json={"text": "busy", "sampling_params": {"max_new_tokens": 100_000, "ignore_eos": True}, "stream": True},
    ) as r:
        await r.content.readuntil(b"\n\n")
        async with http.post(worker.url + "/flush_cache") as flush:
            assert flush.status == 400
    await assert_eventually(lambda: not worker.engine.has_work())
    async with http.get(worker.url + "/flush_cache") as flush:
        assert flush.status == 200
        assert (await flush.text()).startswith("Cache flushed")


async def test_metrics_names_and_request_counter(worker, http):
    async with http.post(
        worker.url + "/generate",
        json={"text": "count me", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}},
    ) as r:
        assert r.status == 200
    async with http.get(worker.url + "/metrics") as r:
        text = await r.text()
    label = f'{{model_name="{MODEL}"}}'
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:gen_throughput",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:cached_tokens_total",
        "sglang:num_requests_total",
        "sglang:hicache_host_used_tokens",
        "sglang:hicache_host_total_tokens",
        "simworker:recomputed_tokens_total",
        "simworker:retractions_total",
        "simworker:host_loadbacks_total",
        "simworker:host_loadback_tokens_total",
    ):
        assert name + label in text, name
    assert "sglang:time_to_first_token_seconds_bucket" in text
    assert "sglang:inter_token_latency_seconds_count" in text
    assert "sglang:e2e_request_latency_seconds_count" + label + " 1.0" in text
    assert f"sglang:num_requests_total{label} 1.0" in text


async def test_loads(worker, http):
    async with http.get(worker.url + "/get_load") as r:
        assert (await r.json())[0]["dp_rank"] == 0
    async with http.get(worker.url + "/v1/loads") as r:
        assert "num_running_reqs" in (await r.json())["loads"][0]


async def test_priority_preemption_over_http(make_worker, http):
    """Batch traffic at -10 on a one-slot worker yields to a resumed online turn at +1 (a difference
    of 11, above SGLang's default threshold of 10); the batch stream is not dropped but finishes
    after it, whole, and /metrics counts the preemption."""
    worker = await make_worker("--enable-priority-scheduling", "--max-running-requests", "1")

    async def generate(rid, priority, max_new):
        async with http.post(
            worker.url + "/generate",
            json={
                "text": rid,
                "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True},
                "stream": True,
                "rid": rid,
                "priority": priority,
            },
        ) as r:
            assert r.status == 200
            events = await sse_events(r)
        return asyncio.get_running_loop().time(), events[-2]

    batch = asyncio.create_task(generate("batch", -10, 2_000))
    await assert_eventually(lambda: worker.engine.stats().num_running_reqs == 1)
    online_done, online = await asyncio.wait_for(generate("online", 1, 5), 30)
    batch_done, final = await asyncio.wait_for(batch, 60)
    assert online["meta_info"]["completion_tokens"] == 5
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 2_000}
    assert len(final["output_ids"]) == 2_000
    assert online_done < batch_done
    async with http.get(worker.url + "/metrics") as r:
        text = await r.text()
    assert f'simworker:priority_preemptions_total{{model_name="{MODEL}"}} 1.0' in text
