"""The batch service's Batch API against the official `openai` client, end to end through the dispatcher
(paced by a real planner's lease over gRPC), and every bad input as a clear 4xx with nothing stored."""

import io
import json

import aiohttp
import openai
import pytest

from tests.support.eventually import assert_eventually
from tests.unit.batch.fakes import batch_jsonl, start_stack


@pytest.fixture
async def batch(tmp_path, upstream):
    running = await start_stack(tmp_path, upstream.url, max_batch_requests=20)
    yield running
    await running.stop()


def client_for(running) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=running.http_url + "/v1", api_key="unused", max_retries=0)


async def test_openai_client_batch_round_trip(batch, upstream):
    client = client_for(batch)
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(5))), purpose="batch")
    assert f.purpose == "batch" and f.bytes > 0 and f.object == "file"
    assert (await client.files.retrieve(f.id)).id == f.id
    batch = await client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"who": "test"}
    )
    assert batch.status == "validating" and batch.request_counts.total == 5
    assert batch.expires_at == batch.created_at + 86400

    async def done():
        b = await client.batches.retrieve(batch.id)
        return b if b.status == "completed" else None

    b = await assert_eventually(done, timeout_s=15)
    assert b.request_counts.completed == 5 and b.request_counts.failed == 0
    assert b.in_progress_at and b.completed_at and b.finalizing_at and b.output_file_id and b.error_file_id is None
    out = await client.files.content(b.output_file_id)
    lines = [json.loads(ln) for ln in out.text.splitlines()]
    assert sorted(ln["custom_id"] for ln in lines) == [f"req-{i}" for i in range(5)]
    for ln in lines:
        assert ln["id"].startswith("batch_req_") and ln["error"] is None
        assert ln["response"]["status_code"] == 200 and ln["response"]["body"]["object"] == "chat.completion"
        assert ln["response"]["request_id"]
    # Batch traffic: no session header, marked as batch.
    assert all("X-Dynamo-Session-ID" not in h and h["X-Bandmaster-Traffic"] == "batch" for h in upstream.headers)
    assert len(upstream.requests) == 5
    # The input file content is served back unchanged.
    assert (await client.files.content(f.id)).content == batch_jsonl(5)


async def test_failed_requests_go_to_the_error_file(batch, upstream):
    client = client_for(batch)
    upstream.status_queue.extend([400])
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(2, url="/v1/completions"))), purpose="batch")
    batch = await client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="1h")

    async def done():
        b = await client.batches.retrieve(batch.id)
        return b if b.status == "completed" else None

    b = await assert_eventually(done, timeout_s=15)
    assert (b.request_counts.completed, b.request_counts.failed) == (1, 1)
    err = [json.loads(ln) for ln in (await client.files.content(b.error_file_id)).text.splitlines()]
    assert err[0]["response"]["status_code"] == 400 and err[0]["response"]["body"]["error"]["message"] == "nope"


async def test_retryable_upstream_errors_are_retried(batch, upstream):
    client = client_for(batch)
    upstream.status_queue.extend([503, 429])
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(1))), purpose="batch")
    batch = await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")

    async def done():
        b = await client.batches.retrieve(batch.id)
        return b if b.status == "completed" else None

    b = await assert_eventually(done, timeout_s=15)
    assert b.request_counts.completed == 1 and len(upstream.requests) == 3


async def test_list_paginates_newest_first(batch):
    client = client_for(batch)
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(1))), purpose="batch")
    ids = [
        (await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")).id
        for _ in range(3)
    ]
    page = await client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    seen = [b.id async for b in client.batches.list(limit=2)]
    assert seen == ids[::-1]


async def test_cancel_is_idempotent_and_unsent_requests_land_in_the_error_file(tmp_path, upstream):
    running = await start_stack(tmp_path, upstream.url, planner={"max_batch_admission_rps": 0.0})
    try:
        client = client_for(running)
        f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(3))), purpose="batch")
        batch = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        first = await client.batches.cancel(batch.id)
        assert first.status in ("cancelling", "cancelled") and first.cancelling_at
        second = await client.batches.cancel(batch.id)
        assert second.status in ("cancelling", "cancelled") and second.cancelling_at == first.cancelling_at

        async def cancelled():
            b = await client.batches.retrieve(batch.id)
            return b if b.status == "cancelled" else None

        b = await assert_eventually(cancelled, timeout_s=10)
        assert b.cancelled_at and b.output_file_id is None
        err = [json.loads(ln) for ln in (await client.files.content(b.error_file_id)).text.splitlines()]
        assert {e["error"]["code"] for e in err} == {"batch_cancelled"} and len(err) == 3
        assert upstream.requests == []  # the lease (cap 0) never admitted anything
        assert (await client.batches.cancel(batch.id)).status == "cancelled"
    finally:
        await running.stop()


def _lines(*items) -> bytes:
    return ("\n".join(json.dumps(i) if not isinstance(i, str) else i for i in items) + "\n").encode()


GOOD = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}
BAD_FILES = [
    ("malformed line", _lines(GOOD, "{not json"), 400, "invalid_json_line"),
    ("duplicate custom_id", _lines(GOOD, GOOD), 400, "duplicate_custom_id"),
    ("unsupported endpoint", _lines({**GOOD, "url": "/v1/embeddings"}), 400, "unsupported_url"),
    ("missing custom_id", _lines({k: v for k, v in GOOD.items() if k != "custom_id"}), 400, "invalid_custom_id"),
    ("not an object", _lines([1, 2]), 400, "invalid_json_line"),
    ("body not an object", _lines({**GOOD, "body": "x"}), 400, "invalid_body"),
    ("GET method", _lines({**GOOD, "method": "GET"}), 400, "invalid_method"),
    ("streaming", _lines({**GOOD, "body": {"stream": True}}), 400, "invalid_body"),
    ("empty", b"\n\n", 400, "empty_file"),
    ("too many lines", batch_jsonl(21), 413, "too_many_requests"),
]


@pytest.mark.parametrize("name, data, status, code", BAD_FILES, ids=[b[0] for b in BAD_FILES])
async def test_bad_input_files_are_refused_whole(batch, name, data, status, code):
    client = client_for(batch)
    with pytest.raises(openai.APIStatusError) as info:
        await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert info.value.status_code == status
    assert info.value.body["code"] == code and info.value.body["message"]
    assert batch.registry.db.execute("SELECT COUNT(*) FROM files").fetchone()[0] == 0


async def test_hundred_thousand_lines_are_refused_with_413(tmp_path):
    running = await start_stack(tmp_path, "http://127.0.0.1:9")  # default limit 50,000
    try:
        client = client_for(running)
        with pytest.raises(openai.APIStatusError) as info:
            await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(100_000))), purpose="batch")
        assert info.value.status_code == 413
    finally:
        await running.stop()


async def test_wrong_purpose_is_refused(batch):
    with pytest.raises(openai.BadRequestError, match="purpose"):
        await client_for(batch).files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(1))), purpose="fine-tune")


@pytest.mark.parametrize("window", ["0s", "-1h", "1000d", "8d", "30s", "soon", "24 h", "", 24])
async def test_completion_windows_outside_the_documented_range_are_refused(batch, window):
    client = client_for(batch)
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(1))), purpose="batch")
    with pytest.raises(openai.BadRequestError) as info:
        await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window=window)
    assert info.value.body["param"] == "completion_window"
    assert batch.registry.db.execute("SELECT COUNT(*) FROM batches").fetchone()[0] == 0


@pytest.mark.parametrize("window, seconds", [("24h", 86400), ("1m", 60), ("7d", 604800), ("90m", 5400)])
async def test_documented_completion_windows_are_accepted(batch, window, seconds):
    client = client_for(batch)
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(1))), purpose="batch")
    b = await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window=window)
    assert b.expires_at - b.created_at == seconds


async def test_endpoint_must_match_the_lines(batch):
    client = client_for(batch)
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(1))), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="not only"):
        await client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="not supported"):
        await client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")


async def test_unknown_ids_are_404(batch):
    client = client_for(batch)
    with pytest.raises(openai.NotFoundError):
        await client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        await client.batches.cancel("batch_nope")
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve("file_nope")
    with pytest.raises(openai.NotFoundError):
        await client.files.content("file_nope")
    with pytest.raises(openai.NotFoundError):
        await client.batches.create(input_file_id="file_nope", endpoint="/v1/chat/completions", completion_window="24h")


async def test_batches_survive_a_batch_service_restart(tmp_path, upstream):
    """Files and batches live in the batch service's registry: a batch created before a restart runs after it,
    once the planner's lease allows (paused before the restart, open after)."""
    stack = await start_stack(tmp_path, upstream.url, planner={"max_batch_admission_rps": 0.0})
    client = client_for(stack)
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(4))), purpose="batch")
    batch = await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    await stack.stop()
    stack = await start_stack(tmp_path, upstream.url)
    try:
        client = client_for(stack)
        assert (await client.files.retrieve(f.id)).bytes == len(batch_jsonl(4))

        async def done():
            b = await client.batches.retrieve(batch.id)
            return b if b.status == "completed" else None

        b = await assert_eventually(done, timeout_s=15)
        assert b.request_counts.completed == 4 and len(upstream.requests) == 4
    finally:
        await stack.stop()


async def test_batch_api_needs_the_data_token_and_the_dispatcher_sends_it(tmp_path, upstream):
    from services.common.auth.security import SecurityConfig, Tokens

    token = "d" * 32
    running = await start_stack(tmp_path, upstream.url, security=SecurityConfig(data_tokens=Tokens([token])))
    try:
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(
                base_url=running.http_url + "/v1", api_key="wrong-" + "x" * 20, max_retries=0
            ).batches.list()
        client = openai.AsyncOpenAI(base_url=running.http_url + "/v1", api_key=token, max_retries=0)
        f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(1))), purpose="batch")
        b = await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")

        async def done():
            got = await client.batches.retrieve(b.id)
            return got if got.status == "completed" else None

        await assert_eventually(done, timeout_s=15)
        assert upstream.headers[0]["Authorization"] == f"Bearer {token}"
    finally:
        await running.stop()


@pytest.mark.parametrize("bad, raw", [("x" * 65, "x" * 65), ("a%0Ab", "a\nb"), ("a%20b", "a b"), ("%C3%A9", "\u00e9")])
async def test_ids_in_paths_bodies_and_queries_are_checked(batch, bad, raw):
    """Regression: any id reached the registry and came back in the error message."""
    import aiohttp

    body = {"input_file_id": raw, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    async with aiohttp.ClientSession() as http:
        for method, path, payload in [
            ("GET", f"/v1/files/{bad}", None),
            ("GET", f"/v1/files/{bad}/content", None),
            ("GET", f"/v1/batches/{bad}", None),
            ("POST", f"/v1/batches/{bad}/cancel", None),
            ("GET", f"/v1/batches?after={bad}", None),
            ("POST", "/v1/batches", body),
        ]:
            async with http.request(method, batch.http_url + path, json=payload) as r:
                assert r.status == 400, (path, await r.text())
                assert "letters, digits" in (await r.json())["error"]["message"]


def _deep_line(depth: int) -> bytes:
    nested = b"[" * depth + b"]" * depth
    return b'{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": {"x": ' + nested + b"}}\n"


@pytest.mark.parametrize("depth", [300, 1_500, 100_000])
async def test_a_deeply_nested_line_is_a_400_not_a_500(batch, depth):
    """A line nested past what the router would forward (254 levels), or past what the parser can recurse
    into (a RecursionError and a 500 before), is refused like any bad line, with nothing stored."""
    client = client_for(batch)
    data = batch_jsonl(2) + _deep_line(depth)
    with pytest.raises(openai.APIStatusError) as info:
        await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert info.value.status_code == 400
    assert info.value.body["code"] == "invalid_json_line" and info.value.body["line"] == 3
    assert "nested deeper than 254 levels" in info.value.body["message"]
    assert batch.registry.db.execute("SELECT COUNT(*) FROM files").fetchone()[0] == 0


async def test_a_line_at_the_depth_bound_is_accepted(batch):
    client = client_for(batch)
    f = await client.files.create(file=("in.jsonl", io.BytesIO(_deep_line(251))), purpose="batch")
    assert f.id


@pytest.mark.parametrize("depth", [300, 1_500, 100_000])
async def test_a_deeply_nested_batches_body_is_a_400_not_a_500(batch, depth):
    client = client_for(batch)
    f = await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(1))), purpose="batch")
    body = (
        b'{"input_file_id": "' + f.id.encode() + b'", "endpoint": "/v1/chat/completions", '
        b'"completion_window": "24h", "metadata": {"x": ' + b"[" * depth + b"]" * depth + b"}}"
    )
    async with aiohttp.ClientSession() as session:
        async with session.post(
            batch.http_url + "/v1/batches", data=body, headers={"Content-Type": "application/json"}
        ) as response:
            assert response.status == 400
            error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error" and "nested deeper than 254 levels" in error["message"]
    assert batch.registry.db.execute("SELECT COUNT(*) FROM batches").fetchone()[0] == 0
