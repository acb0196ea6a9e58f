"""The block forwarder (`SseRelay`, `OpenTurn.sse`) against the line-by-line rules it replaced.

`reference()` is the former path, kept here as the specification: read line by line (as
`content.readline()` cuts them), classify every line, forward it, drop the usage-only chunk and the
blank line after it when the client did not ask for usage. Whatever the worker's bytes and however
they are split across reads, the relay must send the client the same bytes and keep the same books.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from orjson import dumps, loads

from services.router.errors import WorkerFailed
from services.router.turn.open_turn import Bookkeeping as _Bookkeeping
from services.router.turn.open_turn import OpenTurn
from services.router.turn.relay import LineKind, SseRelay, ensure_cached_details, split_lines
from services.router.turn.relay import stream_error as _stream_error
from services.router.turn.session import SessionIdentity
from services.router.turn.turn_types import Api, TurnSpec

HEAD = b'data: {"id":"c","object":"chat.completion.chunk","choices":'
CONTENT = HEAD + b'[{"index":0,"delta":{"content":"tok"},"finish_reason":null}],"usage":null}\n'
FINISH = HEAD + b'[{"index":0,"delta":{},"finish_reason":"length"}],"usage":null}\n'
USAGE = HEAD + b'[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}\n'
USAGE_CACHED = (
    HEAD + b'[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12,'
    b'"prompt_tokens_details":{"cached_tokens":4}}}\n'
)
CONTINUOUS = HEAD + b'[{"index":0,"delta":{"content":"x"},"finish_reason":null}],"usage":{"completion_tokens":1}}\n'
ERROR = b'data: {"error":{"message":"engine died"}}\n'
DONE = b"data: [DONE]\n"
TRICKY = HEAD + b'[{"index":0,"delta":{"content":"data: [DONE] \\"usage\\":{"},"finish_reason":null}]}\n'


def gen_chunk(n: int) -> bytes:
    return (
        b'data: {"text":"%d","meta_info":{"prompt_tokens":5,"completion_tokens":%d,"cached_tokens":2,'
        b'"finish_reason":{"type":"length"}}}\n' % (n, n)
    )


OPENAI_LINES = [
    CONTENT,
    FINISH,
    USAGE,
    USAGE_CACHED,
    CONTINUOUS,
    ERROR,
    DONE,
    TRICKY,
    b"\n",
    b"\r\n",
    b": keep-alive\n",
    b"event: message\n",
    CONTENT[:-1] + b"\r\n",
]
GENERATE_LINES = [gen_chunk(1), gen_chunk(2), gen_chunk(3), DONE, ERROR, b"\n", b": ping\n"]


def reference(api: Api, stream: bytes, include_usage: bool) -> tuple[bytes, list[dict], int, str | None, bytes | None]:
    """The former `OpenTurn.lines()` plus the HTTP loop's usage filter, over readline-cut lines."""
    out: list[bytes] = []
    absorbed: list[dict] = []
    chunks = 0
    last_data = None
    skip_blank = False
    for line in split_lines(stream):
        kind = None
        if line.startswith(b"data:"):
            if line.startswith(b"data: [DONE]"):
                kind = LineKind.DONE
            elif line.startswith(b'data: {"error"'):
                return b"".join(out), absorbed, chunks, _stream_error(line), last_data
            else:
                chunks += 1
                kind = LineKind.DATA
                if api is Api.GENERATE:
                    last_data = line
                elif b'"usage":{' in line:
                    chunk = loads(memoryview(line)[5:])
                    absorbed.append(chunk)
                    if not chunk.get("choices"):
                        if ensure_cached_details(chunk):
                            line = b"data: " + dumps(chunk) + b"\n"
                        kind = LineKind.USAGE
        elif line in (b"\n", b"\r\n"):
            kind = LineKind.BLANK
        if kind is None:
            continue
        if kind is LineKind.USAGE and not include_usage:
            skip_blank = True
            continue
        if kind is LineKind.BLANK and skip_blank:
            skip_blank = False
            continue
        out.append(line)
    return b"".join(out), absorbed, chunks, None, last_data


def relay_over(api: Api, stream: bytes, cuts: list[int], include_usage: bool):
    absorbed: list[dict] = []
    relay = SseRelay(api, include_usage, absorbed.append)
    out = []
    points = sorted({c for c in cuts if 0 < c < len(stream)})
    for start, stop in zip([0, *points], [*points, len(stream)]):
        out.append(relay.feed(stream[start:stop]))
        if relay.error is not None:
            break
    else:
        out.append(relay.end())
    return b"".join(out), absorbed, relay.chunks, relay.error, relay.last_data_line()


def streams(lines: list[bytes]):
    events = st.lists(st.sampled_from(lines), max_size=30)
    return st.tuples(events, st.booleans()).map(
        lambda t: b"".join(t[0]) + (b"" if t[1] else b'data: {"tail":1}')
    )  # maybe a last line without newline


@settings(max_examples=400, deadline=None)
@given(
    streams(OPENAI_LINES),
    st.lists(st.integers(0, 4000), max_size=12),
    st.booleans(),
    st.sampled_from([Api.CHAT, Api.COMPLETIONS]),
)
def test_openai_stream_forwarded_exactly_as_line_by_line(stream, cuts, include_usage, api):
    assert relay_over(api, stream, cuts, include_usage) == reference(api, stream, include_usage)


@settings(max_examples=300, deadline=None)
@given(streams(GENERATE_LINES), st.lists(st.integers(0, 4000), max_size=12))
def test_generate_stream_forwarded_exactly_and_keeps_the_last_chunk(stream, cuts):
    assert relay_over(Api.GENERATE, stream, cuts, True) == reference(Api.GENERATE, stream, True)


SGLANG_STREAM = b"".join(line + b"\n" for line in [CONTENT, CONTENT, FINISH, USAGE, DONE])


@pytest.mark.parametrize("include_usage", [True, False])
def test_plain_blocks_pass_through_untouched_and_usage_rules_hold(include_usage):
    relay = SseRelay(Api.CHAT, include_usage, lambda chunk: None)
    first = relay.feed(CONTENT + b"\n" + CONTENT + b"\n")
    assert first == CONTENT + b"\n" + CONTENT + b"\n" and relay.chunks == 2
    rest = relay.feed(FINISH + b"\n" + USAGE + b"\n" + DONE + b"\n") + relay.end()
    usage_line = next((line for line in split_lines(rest) if b'"usage":{' in line), None)
    if include_usage:
        assert b'"prompt_tokens_details":{"cached_tokens":0}' in usage_line
        assert rest.endswith(b"}\n\n" + DONE + b"\n")
    else:
        assert usage_line is None and rest == FINISH + b"\n" + DONE + b"\n"
    assert relay.chunks == 4 and relay.error is None


def test_a_line_split_across_reads_waits_for_its_end():
    relay = SseRelay(Api.CHAT, True, lambda chunk: None)
    assert relay.feed(CONTENT[:10]) == b""
    assert relay.feed(CONTENT[10:] + b"\n" + CONTENT[:7]) == CONTENT + b"\n"
    assert relay.feed(CONTENT[7:]) == CONTENT
    assert relay.end() == b"" and relay.chunks == 2


def test_error_event_stops_after_what_came_before_it_in_the_block():
    relay = SseRelay(Api.CHAT, True, lambda chunk: None)
    assert relay.feed(CONTENT + b"\n" + ERROR + b"\n" + CONTENT) == CONTENT + b"\n"
    assert relay.error == "engine died" and relay.chunks == 1


# -- OpenTurn.sse over a real socket ------------------------------------------------------------------


async def _serve(pieces: list[bytes], cut: bool):
    async def handler(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
            await asyncio.sleep(0.01)  # separate reads on the router's side
        if cut:
            request.transport.close()
        return response

    app = web.Application()
    app.router.add_post("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/"


async def _turn(session: aiohttp.ClientSession, url: str, api: Api) -> OpenTurn:
    response = await session.post(url, data=b"{}")
    first = await response.content.readline()  # as TurnRunner._send takes the first data line
    runner = SimpleNamespace(fleet=SimpleNamespace(core=None))
    spec = TurnSpec(api, {}, SessionIdentity(), None, True)
    return OpenTurn(runner, spec, None, response, SimpleNamespace(worker_id="w"), None, first, _Bookkeeping())


@pytest.mark.parametrize("include_usage", [True, False])
async def test_sse_streams_blocks_split_mid_line_and_absorbs_usage(include_usage):
    stream = SGLANG_STREAM.replace(USAGE, USAGE_CACHED)
    pieces = [
        stream[: len(CONTENT) + 1],
        stream[len(CONTENT) + 1 : len(CONTENT) + 30],
        stream[len(CONTENT) + 30 : -9],
        stream[-9:],
    ]
    runner, url = await _serve(pieces, cut=False)
    try:
        async with aiohttp.ClientSession() as session:
            turn = await _turn(session, url, Api.CHAT)
            blocks = [block async for block in turn.sse(include_usage)]
            turn.response.close()
    finally:
        await runner.cleanup()
    assert b"".join(blocks) == reference(Api.CHAT, stream, include_usage)[0]
    assert all(block.endswith(b"\n") for block in blocks)
    assert (turn.usage.prompt_tokens, turn.usage.completion_tokens, turn.usage.cached_tokens) == (9, 3, 4)


async def test_sse_generate_takes_usage_from_the_last_chunk():
    stream = b"".join(gen_chunk(n) + b"\n" for n in (1, 2, 3)) + DONE + b"\n"
    runner, url = await _serve([stream[:20], stream[20:]], cut=False)
    try:
        async with aiohttp.ClientSession() as session:
            turn = await _turn(session, url, Api.GENERATE)
            out = b"".join([block async for block in turn.sse(True)])
            turn.response.close()
    finally:
        await runner.cleanup()
    assert out == stream
    assert (turn.usage.prompt_tokens, turn.usage.completion_tokens, turn.usage.cached_tokens) == (5, 3, 2)
    assert turn.finish_reason == "length"


@pytest.mark.parametrize("ending", ["error_event", "cut"])
async def test_sse_failure_after_first_token_forwards_what_came_before_then_raises(ending):
    stream = CONTENT + b"\n" + CONTENT + b"\n"
    pieces = [stream, ERROR + b"\n"] if ending == "error_event" else [stream]
    runner, url = await _serve(pieces, cut=ending == "cut")
    got: list[bytes] = []
    try:
        async with aiohttp.ClientSession() as session:
            turn = await _turn(session, url, Api.CHAT)
            with pytest.raises(WorkerFailed) as failure:
                async for block in turn.sse(True):
                    got.append(block)
            turn.response.close()
    finally:
        await runner.cleanup()
    assert b"".join(got) == stream
    if ending == "error_event":
        assert failure.value.message == "engine died"


class CountingRelay(SseRelay):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.classified = 0

    def classify(self, line: bytes):
        self.classified += 1
        return super().classify(line)


@pytest.mark.parametrize("include_usage", [True, False])
def test_a_read_holding_a_whole_answer_takes_apart_only_the_lines_from_the_usage_chunk_on(include_usage):
    """Regression (issue 20): a loaded router reads a short answer in one go, and the usage chunk in it sent
    every line of the read through `classify`; the content lines before it now go out as one block."""
    stream = (CONTENT + b"\n") * 64 + FINISH + b"\n" + USAGE + b"\n" + DONE + b"\n"
    relay = CountingRelay(Api.CHAT, include_usage, lambda chunk: None)
    out = relay.feed(stream) + relay.end()
    expected_out, _, expected_chunks, _, _ = reference(Api.CHAT, stream, include_usage)
    assert (out, relay.chunks) == (expected_out, expected_chunks)
    assert relay.classified == 4  # the usage chunk, its blank line, [DONE] and the blank after it
