"""The Files and Batches calls OpenAI documents that the batch service added for issue 23, against the
official `openai` client over HTTP: files list (purpose, limit, order, after), delete, `expires_at` and
`expires_after`, batch list pagination, and every bad input as a 4xx in OpenAI's error shape."""

import io

import aiohttp
import openai
import pytest

from tests.support.eventually import assert_eventually
from tests.unit.batch.fakes import batch_jsonl, start_stack


@pytest.fixture
async def stack(tmp_path, upstream):
    running = await start_stack(tmp_path, upstream.url, file_retention_seconds=7200)
    yield running
    await running.stop()


@pytest.fixture
async def paused(tmp_path, upstream):
    """A stack whose lease admits nothing: a batch stays in progress."""
    running = await start_stack(tmp_path, upstream.url, planner={"max_batch_admission_rps": 0.0})
    yield running
    await running.stop()


def client_for(running) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=running.http_url + "/v1", api_key="unused", max_retries=0)


async def _upload(client, n=1, **kw):
    return await client.files.create(file=("in.jsonl", io.BytesIO(batch_jsonl(n))), purpose="batch", **kw)


def _openai_error(body: dict) -> dict:
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


async def test_files_list_pages_in_either_order_and_filters_by_purpose(stack):
    client = client_for(stack)
    ids = [(await _upload(client)).id for _ in range(5)]
    newest_first = await client.files.list()
    assert [f.id for f in newest_first.data] == ids[::-1] and newest_first.has_more is False
    first = await client.files.list(limit=2, order="asc")
    assert [f.id for f in first.data] == ids[:2] and first.has_more
    assert first.first_id == ids[0] and first.last_id == ids[1]
    # The client's auto-pagination follows `after` to the end.
    assert [f.id async for f in client.files.list(limit=2, order="asc")] == ids
    assert [f.id async for f in client.files.list(limit=2)] == ids[::-1]
    assert (await client.files.list(purpose="batch_output")).data == []
    assert len((await client.files.list(purpose="batch")).data) == 5


async def test_files_expire_after_the_retention_or_their_own_expires_after(stack):
    client = client_for(stack)
    default = await _upload(client)
    assert default.expires_at == default.created_at + 7200  # --file-retention-seconds
    own = await _upload(client, expires_after={"anchor": "created_at", "seconds": 3600})
    assert own.expires_at == own.created_at + 3600
    assert (await client.files.retrieve(own.id)).expires_at == own.expires_at
    with pytest.raises(openai.BadRequestError) as err:
        await _upload(client, expires_after={"anchor": "created_at", "seconds": 60})
    assert err.value.body["param"] == "expires_after.seconds"


async def test_delete_a_file_and_its_batch_outputs(stack):
    client = client_for(stack)
    f = await _upload(client, 2)
    batch = await client.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 3600},
    )

    async def done():
        b = await client.batches.retrieve(batch.id)
        return b if b.status == "completed" else None

    b = await assert_eventually(done, timeout_s=15)
    out = await client.files.retrieve(b.output_file_id)
    assert out.purpose == "batch_output" and out.expires_at == out.created_at + 3600
    deleted = await client.files.delete(b.output_file_id)
    assert (deleted.id, deleted.object, deleted.deleted) == (b.output_file_id, "file", True)
    with pytest.raises(openai.NotFoundError):
        await client.files.content(b.output_file_id)
    with pytest.raises(openai.NotFoundError):
        await client.files.delete(b.output_file_id)
    assert (await client.files.delete(f.id)).deleted  # its batch has ended
    assert [x.id for x in (await client.files.list()).data] == []
    assert (await client.batches.retrieve(batch.id)).status == "completed"  # the batch object stays


async def test_deleting_the_input_of_a_running_batch_is_a_409(paused):
    client = client_for(paused)
    f = await _upload(client, 2)
    batch = await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.ConflictError) as err:
        await client.files.delete(f.id)
    assert err.value.status_code == 409 and err.value.body["code"] == "file_in_use" and batch.id in err.value.message
    await client.batches.cancel(batch.id)

    async def deletable():
        try:
            return (await client.files.delete(f.id)).deleted
        except openai.ConflictError:
            return None

    assert await assert_eventually(deletable, timeout_s=10)


async def test_batches_list_pagination_fields(stack):
    client = client_for(stack)
    f = await _upload(client)
    ids = [
        (await client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")).id
        for _ in range(3)
    ]
    p = await client.batches.list(limit=2)
    assert [b.id for b in p.data] == ids[::-1][:2] and p.has_more
    assert p.first_id == ids[2] and p.last_id == ids[1]
    rest = await client.batches.list(limit=2, after=p.last_id)
    assert [b.id for b in rest.data] == [ids[0]] and rest.has_more is False


@pytest.mark.parametrize(
    "path, param",
    [
        ("/v1/files?limit=0", "limit"),
        ("/v1/files?limit=10001", "limit"),
        ("/v1/files?limit=many", "limit"),
        ("/v1/files?order=sideways", "order"),
        ("/v1/files?after=file_nope", "after"),
        ("/v1/batches?limit=0", "limit"),
        ("/v1/batches?limit=101", "limit"),
        ("/v1/batches?limit=x", "limit"),
        ("/v1/batches?after=batch_nope", "after"),
        ("/v1/batches?after=%00", "after"),
    ],
)
async def test_bad_list_queries_are_400_in_openais_shape(stack, path, param):
    async with aiohttp.ClientSession() as s:
        async with s.get(stack.http_url + path) as r:
            assert r.status == 400
            err = _openai_error(await r.json())
            assert err["param"] == param and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/v1/files/file_nope"),
        ("DELETE", "/v1/files/file_nope"),
        ("GET", "/v1/files/file_nope/content"),
        ("GET", "/v1/batches/batch_nope"),
        ("POST", "/v1/batches/batch_nope/cancel"),
    ],
)
async def test_unknown_ids_are_404_in_openais_shape(stack, method, path):
    async with aiohttp.ClientSession() as s:
        async with s.request(method, stack.http_url + path) as r:
            assert r.status == 404 and _openai_error(await r.json())["code"] == "not_found"


async def test_deletes_are_counted_by_kind_and_reason(stack):
    client = client_for(stack)
    f = await _upload(client, 3)
    await client.files.delete(f.id)
    metrics = stack.batch.host.registry
    assert metrics.get_sample_value("bandmaster_batch_files_deleted_total", {"kind": "input", "reason": "client"}) == 1
    assert metrics.get_sample_value("bandmaster_batch_file_bytes_deleted_total", {"reason": "client"}) == f.bytes
