"""The public HTTP port against an in-process router: malformed HTTP, inputs that used to crash or slip
through, slow clients, the connection cap, per-client limits, what the port reveals (/metrics, Server)."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time

import aiohttp
import pytest

from tests.support.router_doubles import MODEL
from tests.support.router_inprocess import InProcessRouter, raw_exchange

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
SECRET = "sk-SECRETTOKEN1234567890"


@pytest.fixture
async def router():
    r = await InProcessRouter.start(["ok"])
    yield r
    await r.close()


def _split(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers, body


def _openai_error(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def _request(extra_headers: bytes = b"", body: bytes = b"{}", path: bytes = b"/v1/chat/completions") -> bytes:
    return (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        + extra_headers
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


# -- malformed HTTP: OpenAI JSON, nothing echoed, nothing logged at ERROR -------------------------------


@pytest.mark.parametrize(
    "name, raw",
    [
        ("bad byte in Authorization", _request(b"Authorization: Bearer " + SECRET.encode() + b"\x01x\r\n")),
        ("10 KB session id", _request(b"X-Dynamo-Session-ID: " + b"s" * 10_000 + b"\r\n")),
        ("oversized Authorization", _request(b"Authorization: Bearer " + SECRET.encode() * 400 + b"\r\n")),
        ("NUL in a header", _request(b"X-Dynamo-Session-ID: a\x00b\r\n")),
        ("bare CR in a header", _request(b"X-Dynamo-Session-ID: a\rb\r\n")),
        ("bare LF in a header", _request(b"X-Dynamo-Session-ID: a\nb\r\n")),
        (
            "Content-Length and Transfer-Encoding",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
    ],
)
async def test_malformed_http_is_an_openai_error_that_echoes_nothing(router, caplog, name, raw):
    caplog.set_level(logging.DEBUG)
    status, headers, body = _split(await raw_exchange(router.port, raw))
    assert status == 400, name
    assert headers["content-type"].startswith("application/json")
    assert headers["server"] == "bandmaster"
    err = _openai_error(body)
    assert err["type"] == "invalid_request_error" and err["code"] == "malformed_http"
    assert b"SECRET" not in body and b"sssss" not in body
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "SECRET" not in caplog.text
    assert router.sample("bandmaster_router_requests_total", route="http", outcome="error_400") == 1
    assert router.workers[0].requests == 0


# -- inputs that used to be 500s or slip through -----------------------------------------------------------


@pytest.mark.parametrize("byte", [b"\xe9", b"\xff"])
async def test_session_id_with_a_non_ascii_byte_is_400_and_counted_as_program(router, byte):
    status, _, body = _split(
        await raw_exchange(
            router.port, _request(b"X-Dynamo-Session-ID: prog" + byte + b"\r\n", json.dumps(CHAT).encode())
        )
    )
    assert status == 400 and _openai_error(body)["param"] == "X-Dynamo-Session-ID"
    assert router.sample("bandmaster_router_requests_total", route="chat", path="program", outcome="error_400") == 1
    assert router.workers[0].requests == 0 and not router.sched.of("Admit")


async def _post(router, body: bytes | dict, headers: dict | None = None, path: str = "/v1/chat/completions"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as s:
        async with s.post(
            router.url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
        ) as r:
            return r.status, r.headers, await r.read()


def _deep(levels: int) -> bytes:
    return (
        b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], "metadata": ' % MODEL.encode()
        + b"[" * levels
        + b"]" * levels
        + b"}"
    )


@pytest.mark.parametrize(
    "path, body, headers, param",
    [
        ("/v1/chat/completions", _deep(1000), {}, None),
        ("/generate", {"input_ids": [2**40]}, {}, "input_ids"),
        ("/generate", {"input_ids": [1, 2**31]}, {"X-Dynamo-Session-ID": "p"}, "input_ids"),
        ("/v1/completions", {"prompt": [2**40]}, {}, "prompt"),
        ("/v1/chat/completions", {**CHAT, "temperature": -1}, {}, "temperature"),
        ("/v1/chat/completions", {**CHAT, "top_p": 5}, {}, "top_p"),
        ("/v1/chat/completions", {**CHAT, "presence_penalty": 3}, {}, "presence_penalty"),
        ("/generate", {"text": "x", "sampling_params": {"temperature": -0.5}}, {}, "sampling_params.temperature"),
        ("/generate", {"text": "x", "sampling_params": {"top_p": 1.5}}, {}, "sampling_params.top_p"),
    ],
)
async def test_invalid_bodies_are_400_before_anything_is_forwarded(router, path, body, headers, param):
    status, _, raw = await _post(router, body, headers, path)
    assert status == 400
    assert _openai_error(raw)["param"] == param
    assert router.workers[0].requests == 0 and not router.sched.of("Admit")
    assert router.sample("bandmaster_router_requests_total", outcome="error_400") == 1


async def test_gzip_garbage_body_is_400(router):
    status, _, raw = await _post(router, b"\x1f\x8b this is not gzip at all", {"Content-Encoding": "gzip"})
    assert status == 400 and _openai_error(raw)["code"] in ("malformed_body", "malformed_http")
    assert router.workers[0].requests == 0
    assert router.sample("bandmaster_router_requests_total", outcome="error_400") == 1
    status, _, raw = await _post(router, gzip.compress(json.dumps(CHAT).encode()), {"Content-Encoding": "gzip"})
    assert status == 200  # a real gzip body is fine


async def test_a_session_header_given_twice_is_400(router):
    status, _, body = _split(
        await raw_exchange(
            router.port, _request(b"X-Dynamo-Session-ID: a\r\nX-Dynamo-Session-ID: b\r\n", json.dumps(CHAT).encode())
        )
    )
    assert status == 400 and _openai_error(body)["param"] == "X-Dynamo-Session-ID"
    assert not router.sched.of("Admit")


async def test_an_unexpected_exception_is_a_counted_json_500(router, monkeypatch, caplog):
    async def broken(spec):
        raise RuntimeError("a bug")

    monkeypatch.setattr(router.running.runner, "open", broken)
    status, headers, raw = await _post(router, CHAT, {"X-Dynamo-Session-ID": "p"})
    assert status == 500 and headers["Content-Type"].startswith("application/json")
    assert _openai_error(raw)["message"] == "internal error"
    assert router.sample("bandmaster_router_requests_total", route="chat", path="program", outcome="error_500") == 1
    assert "a bug" in caplog.text  # the traceback is logged, not sent


async def test_unknown_route_and_method_are_openai_errors(router):
    async with aiohttp.ClientSession() as s:
        async with s.get(router.url + "/nope") as r:
            assert r.status == 404 and _openai_error(await r.read())
        async with s.get(router.url + "/v1/chat/completions") as r:
            assert r.status == 405 and r.headers["Allow"] == "POST" and _openai_error(await r.read())


async def test_models_list_and_retrieve_answer_as_openai_with_the_official_client(router):
    import openai

    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    listed = await client.models.list()
    assert [m.id for m in listed.data] == [MODEL]
    model = await client.models.retrieve(MODEL)
    assert (model.id, model.object, model.owned_by) == (MODEL, "model", "bandmaster")
    assert model.created == listed.data[0].created > 0
    with pytest.raises(openai.NotFoundError) as err:
        await client.models.retrieve("no-such-model")
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    async with aiohttp.ClientSession() as s:
        async with s.get(router.url + "/v1/models/org/no-such-model") as r:
            assert r.status == 404 and _openai_error(await r.read())["code"] == "model_not_found"
        async with s.delete(router.url + "/v1/models/" + MODEL) as r:
            assert r.status == 405 and r.headers["Allow"] == "GET" and _openai_error(await r.read())


# -- what the public port reveals ----------------------------------------------------------------------


async def test_metrics_and_framework_version_are_off_on_the_public_port_by_default(router):
    async with aiohttp.ClientSession() as s:
        async with s.get(router.url + "/metrics") as r:
            assert r.status == 404
        async with s.get(router.url + "/health") as r:
            assert r.status == 200 and r.headers["Server"] == "bandmaster"
    status, headers, _ = await _post(router, CHAT)
    assert status == 200 and headers["Server"] == "bandmaster"


async def test_metrics_and_server_version_are_explicit_options():
    r = await InProcessRouter.start(["ok"], http_metrics=True, http_server_version=True)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(r.url + "/metrics") as resp:
                assert resp.status == 200 and b"bandmaster_router_requests_total" in await resp.read()
                assert "aiohttp" in resp.headers["Server"]
    finally:
        await r.close()


# -- slow clients and the connection cap ---------------------------------------------------------------


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    async with asyncio.timeout(seconds):
        return await reader.read()  # until EOF


async def test_slow_clients_are_cut_off_and_the_connection_cap_holds():
    r = await InProcessRouter.start(
        ["ok"],
        http_header_timeout_seconds=0.3,
        http_body_timeout_seconds=0.3,
        http_keepalive_timeout_seconds=0.6,
        http_max_connections=4,
    )
    try:
        started = time.monotonic()
        # incomplete headers
        h_reader, h_writer = await asyncio.open_connection("127.0.0.1", r.port)
        h_writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Dynamo-Sess")
        # incomplete body
        b_reader, b_writer = await asyncio.open_connection("127.0.0.1", r.port)
        b_writer.write(_request(body=json.dumps(CHAT).encode())[:-10])
        # idle kept-alive after one request
        k_reader, k_writer = await asyncio.open_connection("127.0.0.1", r.port)
        k_writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await k_reader.readuntil(b"\r\n\r\n")
        # a connection that never sends anything
        n_reader, n_writer = await asyncio.open_connection("127.0.0.1", r.port)

        # at the cap (4 open): one more is refused with a JSON 503
        status, headers, body = _split(await raw_exchange(r.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
        assert status == 503 and headers["retry-after"] == "1" and _openai_error(body)["type"] == "service_unavailable"
        assert r.sample("bandmaster_router_http_connections_refused_total") == 1

        assert await _closed_within(h_reader, 2) == b""
        body_answer = await _closed_within(b_reader, 2)
        status, _, raw = _split(body_answer)
        assert status == 408 and _openai_error(raw)["code"] == "body_timeout"
        await _closed_within(k_reader, 2)
        assert await _closed_within(n_reader, 2) == b""
        assert time.monotonic() - started < 2.5
        assert r.sample("bandmaster_router_http_timeouts_total", phase="header") == 2
        assert r.sample("bandmaster_router_http_timeouts_total", phase="body") == 1
        assert r.workers[0].requests == 0
        for w in (h_writer, b_writer, k_writer, n_writer):
            w.close()
        # the slots are free again
        async with aiohttp.ClientSession() as s:
            async with s.get(r.url + "/health") as resp:
                assert resp.status == 200
    finally:
        await r.close()


async def test_a_slow_header_on_a_kept_alive_connection_is_cut_off():
    r = await InProcessRouter.start(["ok"], http_header_timeout_seconds=0.3, http_keepalive_timeout_seconds=30)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(0.5)  # idle is fine (keep-alive 30 s) ...
        writer.write(b"GET /health HTTP/1.1\r\n")  # ... but a started head must complete
        rest = await _closed_within(reader, 2)
        assert b"HTTP/1.1" not in rest.split(b"\r\n\r\n", 1)[-1]
        writer.close()
    finally:
        await r.close()


# -- per-client limits ---------------------------------------------------------------------------------


async def test_a_client_over_its_program_cap_gets_429_with_retry_after_and_others_do_not():
    r = await InProcessRouter.start(
        ["ok"], client_max_programs=2, client_new_programs_per_second=0, client_program_idle_seconds=100
    )
    try:
        a = {"Authorization": "Bearer token-a"}
        for sid in ("p1", "p2"):
            assert (await _post(r, CHAT, {**a, "X-Dynamo-Session-ID": sid}))[0] == 200
        status, headers, raw = await _post(r, CHAT, {**a, "X-Dynamo-Session-ID": "p3"})
        assert status == 429 and 90 <= int(headers["Retry-After"]) <= 100
        err = _openai_error(raw)
        assert err["type"] == "rate_limit_error" and err["code"] == "too_many_programs"
        assert len(r.sched.of("Admit")) == 2 and r.workers[0].requests == 2  # nothing went further
        assert (await _post(r, CHAT, {**a, "X-Dynamo-Session-ID": "p1"}))[0] == 200  # known program
        assert (await _post(r, CHAT, {"Authorization": "Bearer token-b", "X-Dynamo-Session-ID": "p3"}))[0] == 200
        assert (await _post(r, CHAT, a))[0] == 200  # passthrough is not a program
        final = {**a, "X-Dynamo-Session-ID": "p2", "X-Dynamo-Session-Final": "true"}
        assert (await _post(r, CHAT, final))[0] == 200
        assert (await _post(r, CHAT, {**a, "X-Dynamo-Session-ID": "p3"}))[0] == 200
        assert r.sample("bandmaster_router_client_limited_total", reason="too_many_programs") == 1
    finally:
        await r.close()


async def test_a_flood_of_new_programs_is_rate_limited_per_client():
    r = await InProcessRouter.start(["ok"], client_new_programs_per_second=0.5, client_new_programs_burst=2)
    try:
        flood = [
            await _post(r, CHAT, {"Authorization": "Bearer flood", "X-Dynamo-Session-ID": f"f{i}"}) for i in range(5)
        ]
        assert [s for s, _, _ in flood] == [200, 200, 429, 429, 429]
        assert flood[2][1]["Retry-After"] == "2" and _openai_error(flood[2][2])["code"] == "new_program_rate"
        started = time.monotonic()
        status, _, _ = await _post(r, CHAT, {"Authorization": "Bearer legit", "X-Dynamo-Session-ID": "new"})
        assert status == 200 and time.monotonic() - started < 1
    finally:
        await r.close()
