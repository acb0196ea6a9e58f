"""The edge's rules for what a client sends, as pure helpers and against an in-process router:
`X-Dynamo-Session-Final` is `true` or `false` and nothing else; an error quotes at most 64 characters of
a client's value; a body in a Content-Encoding the router does not decode is a 415, never read as identity."""

from __future__ import annotations

import gzip
import json
import zlib

import aiohttp
import pytest
from aiohttp.http_exceptions import ContentEncodingError
from multidict import CIMultiDict, CIMultiDictProxy

from services.router.errors import ECHO_MAX_CHARS, BadRequest, ModelNotFound, UnsupportedMediaType, quoted
from services.router.ingress import validation
from services.router.ingress.http_server import check_content_encoding, malformed
from services.router.turn import session
from tests.support.router_doubles import MODEL
from tests.support.router_inprocess import InProcessRouter, raw_exchange
from tests.support.router_stack import free_port

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
LONG = "x" * 8000  # a client's 8 KB value (a header line's limit is 8190 bytes)


# -- X-Dynamo-Session-Final ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, final",
    [
        (None, False),
        ("", False),
        ("   ", False),
        ("true", True),
        ("TRUE", True),
        (" True ", True),
        ("false", False),
        ("FALSE", False),
        ("\tfalse ", False),
    ],
)
def test_final_is_true_or_false_in_any_case(value, final):
    assert session.parse_final(value) is final


@pytest.mark.parametrize("value", ["1", "0", "yes", "no", "on", "off", "t", "truee", "true,true", "perhaps", "é"])
def test_any_other_final_value_is_refused_naming_the_header_and_the_values(value):
    with pytest.raises(BadRequest) as caught:
        session.parse_final(value)
    err = caught.value
    assert err.param == session.FINAL_HEADER
    assert session.FINAL_HEADER in err.message and "true or false" in err.message


def test_a_long_final_value_is_quoted_cut_short():
    with pytest.raises(BadRequest) as caught:
        session.parse_final(LONG)
    message = caught.value.message
    assert len(message) < 200 and message.endswith("'" + "x" * ECHO_MAX_CHARS + "'...")


# -- quoting a client's value ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, shown",
    [
        ("abc", "'abc'"),
        ("x" * ECHO_MAX_CHARS, repr("x" * ECHO_MAX_CHARS)),
        ("x" * (ECHO_MAX_CHARS + 1), repr("x" * ECHO_MAX_CHARS) + "..."),
        ("a\x00b", repr("a\x00b")),
        (12, "12"),
        (-0.5, "-0.5"),
        (10**100, str(10**100)[:ECHO_MAX_CHARS] + "..."),
    ],
)
def test_quoted_cuts_a_value_to_its_first_characters(value, shown):
    assert quoted(value) == shown


def test_every_error_that_quotes_a_client_value_cuts_it():
    assert len(ModelNotFound(LONG).message) < 200
    with pytest.raises(BadRequest) as caught:
        validation.number_in_range(10**100, "temperature", 0.0, 2.0)
    assert len(caught.value.message) < 200


# -- Content-Encoding ------------------------------------------------------------------------------------


def _headers(*encodings: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict([("Content-Encoding", e) for e in encodings]))


@pytest.mark.parametrize(
    "encodings", [(), ("",), ("identity",), ("IDENTITY",), (" identity ",), ("gzip",), ("GZIP",), ("deflate",)]
)
def test_the_encodings_the_router_decodes_pass(encodings):
    check_content_encoding(_headers(*encodings))


@pytest.mark.parametrize(
    "encodings",
    [
        ("br",),
        ("zstd",),
        ("compress",),
        ("x-gzip",),
        ("gzip, identity",),
        ("identity, gzip",),
        ("foo",),
        ("gzip", "gzip"),
    ],
)
def test_any_other_encoding_is_415(encodings):
    with pytest.raises(UnsupportedMediaType) as caught:
        check_content_encoding(_headers(*encodings))
    err = caught.value
    assert err.http_status == 415 and err.param == "Content-Encoding" and err.code == "unsupported_content_encoding"


def test_a_coding_the_parser_has_no_decoder_for_is_415_and_a_body_that_breaks_its_coding_400():
    missing = ContentEncodingError("Can not decode content-encoding: brotli (br). Please install `Brotli`")
    assert malformed(missing, 400).http_status == 415
    broken = malformed(ContentEncodingError("Can not decode content-encoding: gzip"), 400)
    assert broken.http_status == 400 and broken.code == "malformed_http"


# -- against a router --------------------------------------------------------------------------------------


@pytest.fixture
async def router():
    r = await InProcessRouter.start(["ok"])
    yield r
    await r.close()


def _split(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _error(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


async def _post(router, body: bytes, headers: dict[str, str], path: str = "/v1/chat/completions"):
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + path, data=body, headers={"Content-Type": "application/json", **headers}) as r:
            return r.status, await r.read()


@pytest.mark.parametrize("value", ["1", "yes", "on", "0", LONG])
async def test_a_final_header_other_than_true_or_false_is_400_and_echoes_at_most_64_characters(router, value):
    status, raw = await _post(
        router, json.dumps(CHAT).encode(), {"X-Dynamo-Session-ID": "p", session.FINAL_HEADER: value}
    )
    assert status == 400
    err = _error(raw)
    assert err["param"] == session.FINAL_HEADER and "true or false" in err["message"]
    assert len(raw) < 500 and b"x" * (ECHO_MAX_CHARS + 1) not in raw
    assert router.workers[0].requests == 0 and not router.sched.of("Admit")


@pytest.mark.parametrize("value", ["TRUE", " false "])
async def test_true_and_false_in_any_case_are_served(router, value):
    status, _ = await _post(
        router, json.dumps(CHAT).encode(), {"X-Dynamo-Session-ID": "p", session.FINAL_HEADER: value}
    )
    assert status == 200 and router.workers[0].requests == 1


async def test_an_unknown_path_or_model_is_quoted_cut_short(router):
    async with aiohttp.ClientSession() as s:
        async with s.get(router.url + "/" + "p" * 4000) as r:
            raw = await r.read()
            assert r.status == 404 and _error(raw)["code"] == "not_found"
            assert len(raw) < 500
        async with s.get(router.url + "/v1/files/" + "f" * 4000) as r:  # the Batch API, no batch service here
            raw = await r.read()
            assert r.status == 404 and _error(raw)["code"] == "batch_not_configured"
            assert b"f" * (ECHO_MAX_CHARS + 1) not in raw
    status, raw = await _post(router, json.dumps({**CHAT, "model": "m" * 8000}).encode(), {})
    assert status == 404 and _error(raw)["code"] == "model_not_found"
    assert len(raw) < 500


def _request(encoding: bytes, body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Content-Encoding: " + encoding + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


@pytest.mark.parametrize("encoding", [b"br", b"zstd", b"compress", b"x-gzip", b"gzip, identity", b"foo"])
async def test_a_body_in_an_encoding_the_router_does_not_decode_is_415(router, encoding):
    # A plain JSON body: read as identity, it would have been served.
    status, body = _split(await raw_exchange(router.port, _request(encoding, json.dumps(CHAT).encode())))
    assert status == 415, body
    err = _error(body)
    assert err["code"] == "unsupported_content_encoding" and err["param"] == "Content-Encoding"
    assert router.workers[0].requests == 0 and not router.sched.of("Admit")
    assert router.sample("bandmaster_router_requests_total", outcome="error_415") == 1


@pytest.mark.parametrize(
    "encoding, body",
    [
        (b"identity", json.dumps(CHAT).encode()),
        (b"GZIP", gzip.compress(json.dumps(CHAT).encode())),
        (b"deflate", zlib.compress(json.dumps(CHAT).encode())),
    ],
)
async def test_a_body_in_an_encoding_the_router_decodes_is_served(router, encoding, body):
    status, raw = _split(await raw_exchange(router.port, _request(encoding, body)))
    assert status == 200, raw


async def test_a_batch_api_body_in_an_unknown_encoding_is_415_before_the_batch_service_is_asked():
    router = await InProcessRouter.start(["ok"], batch_url=f"http://127.0.0.1:{free_port()}")
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(router.url + "/v1/batches", data=b"{}", headers={"Content-Encoding": "compress"}) as r:
                assert r.status == 415  # not the unreachable batch service's 502
                assert _error(await r.read())["code"] == "unsupported_content_encoding"
    finally:
        await router.close()
