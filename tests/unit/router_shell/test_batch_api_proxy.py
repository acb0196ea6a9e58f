"""The router's Batch API routes against an in-process router: forwarded to a fake batch service with bodies
streamed unchanged (a multipart upload, a JSONL download), statuses and error bodies passed through,
`Authorization` forwarded; no `--batch-url` is a 404 naming the batch service; an unreachable one a 502.
Batch traffic (`X-Bandmaster-Traffic: batch`) gets the low priority and its own metric label."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from services.common.settings.errors import ConfigError
from services.router.config import RouterConfig
from tests.support.router_doubles import MODEL
from tests.support.router_inprocess import InProcessRouter
from tests.support.router_stack import free_port

JSONL = b'{"id": "batch_req_1", "custom_id": "a"}\n{"id": "batch_req_2", "custom_id": "b"}\n'


class FakePlanner:
    def __init__(self) -> None:
        self.seen: list[dict] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        data = form["file"].file.read()
        self.seen.append(
            {
                "auth": request.headers.get("Authorization"),
                "bytes": len(data),
                "purpose": form["purpose"],
                "head": data[:20].decode(),
            }
        )
        return web.json_response({"id": "file-1", "object": "file", "bytes": len(data), "purpose": "batch"})

    async def _content(self, request: web.Request) -> web.Response:
        return web.Response(body=JSONL, content_type="application/jsonl")

    async def _batch(self, request: web.Request) -> web.Response:
        self.seen.append({"query": request.query_string, "auth": request.headers.get("Authorization")})
        return web.json_response(
            {
                "error": {
                    "message": "no batch 'b-x'",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "not_found",
                }
            },
            status=404,
        )

    async def _list(self, request: web.Request) -> web.Response:
        self.seen.append({"query": request.query_string})
        return web.json_response({"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False})

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files/{id}/content", self._content)
        app.router.add_get("/v1/batches", self._list)
        app.router.add_get("/v1/batches/{id}", self._batch)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self._runner.cleanup()


@pytest.fixture
async def planner():
    p = FakePlanner()
    url = await p.start()
    yield p, url
    await p.stop()


async def test_upload_download_and_errors_pass_through(planner):
    fake, url = planner
    # max_body_bytes is the router's own limit for inference bodies: a forwarded upload is streamed past it.
    router = await InProcessRouter.start(["ok"], batch_url=url, max_body_bytes=1024 * 1024)
    try:
        payload = b'{"custom_id": "x"}\n' * 200_000  # ~4 MB, multipart
        async with aiohttp.ClientSession() as http:
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", payload, filename="in.jsonl", content_type="application/jsonl")
            async with http.post(router.url + "/v1/files", data=form, headers={"Authorization": "Bearer tok"}) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["bytes"] == len(payload)
            async with http.get(router.url + "/v1/files/file-1/content") as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("application/jsonl")
                assert await r.read() == JSONL
            async with http.get(router.url + "/v1/batches/b-x", headers={"Authorization": "Bearer tok"}) as r:
                assert r.status == 404
                assert (await r.json())["error"]["code"] == "not_found"
            async with http.get(router.url + "/v1/batches?limit=2&after=b-1") as r:
                assert r.status == 200 and (await r.json())["object"] == "list"
        assert fake.seen[0] == {
            "auth": "Bearer tok",
            "bytes": len(payload),
            "purpose": "batch",
            "head": '{"custom_id": "x"}\n{',
        }
        assert fake.seen[1] == {"query": "", "auth": "Bearer tok"}
        assert fake.seen[2] == {"query": "limit=2&after=b-1"}
        assert router.sample("bandmaster_router_batch_api_requests_total", status="404") == 1
        # Batch API calls are not inference: the online-traffic counter does not see them.
        assert router.sample("bandmaster_router_requests_total") == 0
    finally:
        await router.close()


async def test_without_batch_url_the_batch_api_is_a_404_naming_the_batch_service():
    """Was a 501: a 5xx for a client pointed at the wrong router, counted as a router failure."""
    router = await InProcessRouter.start(["ok"])
    try:
        async with aiohttp.ClientSession() as http:
            for method, path in (("POST", "/v1/files"), ("GET", "/v1/batches"), ("POST", "/v1/batches/b/cancel")):
                async with http.request(method, router.url + path) as r:
                    assert r.status == 404
                    err = (await r.json())["error"]
                    assert err["code"] == "batch_not_configured" and "--batch-url" in err["message"]
            async with http.get(router.url + "/v1/batchesX") as r:  # not a Batch API path
                assert r.status == 404
    finally:
        await router.close()


async def test_an_unreachable_batch_service_is_a_502():
    router = await InProcessRouter.start(["ok"], batch_url=f"http://127.0.0.1:{free_port()}")
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(router.url + "/v1/batches") as r:
                assert r.status == 502
                assert (await r.json())["error"]["code"] == "batch_unreachable"
    finally:
        await router.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_batch_traffic_gets_the_batch_priority_and_its_own_label(stream):
    router = await InProcessRouter.start(["ok"], batch_priority=-7)
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": stream}
        async with aiohttp.ClientSession() as http:
            async with http.post(
                router.url + "/v1/chat/completions", json=body, headers={"X-Bandmaster-Traffic": "batch"}
            ) as r:
                assert r.status == 200
                await r.read()
            assert router.workers[0].last_body["priority"] == -7
            async with http.post(router.url + "/v1/chat/completions", json=body) as r:
                await r.read()
            assert router.workers[0].last_body["priority"] != -7  # the scheduler's
        assert router.sample("bandmaster_router_requests_total", traffic="batch", outcome="ok") == 1
        assert router.sample("bandmaster_router_requests_total", traffic="online", outcome="ok") == 1
        assert router.sample("bandmaster_router_requests_in_flight", traffic="batch") == 0
        if stream:
            assert router.sample("bandmaster_router_ttft_seconds_count", traffic="batch") == 1
    finally:
        await router.close()


@pytest.mark.parametrize("url", ["127.0.0.1:8090", "ftp://h:1", "http://h", "http://h:1/v1", "http://u:p@h:1"])
def test_batch_url_is_validated(url):
    with pytest.raises(ConfigError, match="batch_url"):
        RouterConfig(use_scheduler=False, batch_url=url)


async def test_a_gzip_body_is_forwarded_decoded_and_a_405_keeps_its_allow_header(planner):
    import gzip

    fake, url = planner
    router = await InProcessRouter.start(["ok"], batch_url=url)
    try:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", b'{"custom_id": "z"}\n', filename="in.jsonl", content_type="application/jsonl")
        payload = form()
        body = b"".join([chunk async for chunk in _chunks(payload)])
        async with aiohttp.ClientSession() as http:
            async with http.post(
                router.url + "/v1/files",
                data=gzip.compress(body),
                headers={"Content-Type": payload.content_type, "Content-Encoding": "gzip"},
            ) as r:
                assert r.status == 200, await r.text()
            async with http.delete(router.url + "/v1/batches") as r:
                assert r.status == 405 and "GET" in r.headers["Allow"]
        assert fake.seen[0]["bytes"] == len(b'{"custom_id": "z"}\n')
    finally:
        await router.close()


async def _chunks(payload):
    class Sink:
        def __init__(self):
            self.parts = []

        async def write(self, data):
            self.parts.append(bytes(data))

    sink = Sink()
    await payload.write(sink)
    for part in sink.parts:
        yield part
