"""Issue 21: the HTTP port's connection cap is shared between clients. With real sockets: one client (its own
loopback address, 127.0.0.2) holds many idle connections; another client is still served at once. Under data
tokens, a connection counts against its token once a request proved it."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from services.common.auth.security import SecurityConfig, Tokens
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL
from tests.support.router_inprocess import InProcessRouter

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
HOG = "127.0.0.2"  # the whole of 127/8 is loopback: a second client address on one machine


def shares(r: InProcessRouter):
    return r.running.http_runner.server.shares  # type: ignore[union-attr]


async def chat_status(r: InProcessRouter, *, token: str | None = None, local: str | None = None) -> int:
    """One chat request on a fresh connection (bounded: a refused or starved client fails the test)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(force_close=True, local_addr=(local, 0) if local else None)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with asyncio.timeout(5):
            async with session.post(r.url + "/v1/chat/completions", json=CHAT, headers=headers) as resp:
                await resp.read()
                return resp.status


async def open_idle(r: InProcessRouter, count: int, local: str = HOG) -> list[tuple]:
    conns = []
    for _ in range(count):
        conns.append(await asyncio.open_connection("127.0.0.1", r.port, local_addr=(local, 0)))
    return conns


async def status_or_eof(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(5):
        return await reader.read()


async def test_a_client_at_its_share_is_refused_while_another_is_served():
    r = await InProcessRouter.start(["ok"], http_max_connections=16, http_max_connections_per_client=4)
    conns = []
    try:
        conns = await open_idle(r, 6)
        # the two beyond its share get a 503 and are closed; the first four stay open
        refused = [await status_or_eof(reader) for reader, _ in conns[4:]]
        assert all(raw.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in raw for raw in refused)
        await assert_eventually(lambda: shares(r).held("addr:" + HOG) == 4)
        assert await chat_status(r) == 200
        assert r.sample("bandmaster_router_http_connection_shares_total", action="refused_client_cap") == 2
        assert r.sample("bandmaster_router_http_connections_refused_total") == 2
    finally:
        for _, writer in conns:
            writer.close()
        await r.close()


async def test_at_the_port_cap_the_hogs_longest_idle_connection_makes_room():
    r = await InProcessRouter.start(["ok"], http_max_connections=4, http_max_connections_per_client=0)
    conns = []
    try:
        conns = await open_idle(r, 4)  # the whole port, idle
        await assert_eventually(lambda: shares(r).total == 4)
        # the hog's own fifth is refused (it never evicts itself) ...
        fifth = await open_idle(r, 1)
        conns += fifth
        assert (await status_or_eof(fifth[0][0])).startswith(b"HTTP/1.1 503")
        # ... another client is served, in place of the hog's longest idle connection
        assert await chat_status(r) == 200
        assert await status_or_eof(conns[0][0]) == b""  # closed without a word: it had asked nothing
        assert r.sample("bandmaster_router_http_connection_shares_total", action="evicted_idle") == 1
        await assert_eventually(lambda: shares(r).held("addr:" + HOG) == 3)
    finally:
        for _, writer in conns:
            writer.close()
        await r.close()


async def test_a_connection_in_a_request_is_never_evicted():
    r = await InProcessRouter.start(["ok"], http_max_connections=2, http_max_connections_per_client=0)
    conns = []
    try:
        conns = await open_idle(r, 2)
        for _, writer in conns:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # a head on its way
        await assert_eventually(lambda: shares(r).total == 2 and shares(r).idle_connections == 0)
        reader, writer = (await open_idle(r, 1, local="127.0.0.1"))[0]
        conns.append((reader, writer))
        assert (await status_or_eof(reader)).startswith(b"HTTP/1.1 503")
        assert r.sample("bandmaster_router_http_connection_shares_total", action="evicted_idle") == 0
    finally:
        for _, writer in conns:
            writer.close()
        await r.close()


async def test_under_data_tokens_connections_count_against_their_token():
    security = SecurityConfig(data_tokens=Tokens(["tok-hog", "tok-other"]))
    r = await InProcessRouter.start(
        ["ok"], http_max_connections=16, http_max_connections_per_client=2, security=security
    )
    conns = []
    try:
        body = json.dumps(CHAT).encode()
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-hog\r\n"
            b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        answers = []
        for _ in range(3):  # one address, one token: kept-alive connections, one request each
            reader, writer = (await open_idle(r, 1, local="127.0.0.1"))[0]
            conns.append((reader, writer))
            writer.write(head + body)
            async with asyncio.timeout(5):
                answers.append(await reader.readuntil(b"\r\n\r\n"))
        assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"200", b"503"]
        assert shares(r).held("addr:127.0.0.1") == 0  # filed under the token once a request proved it
        # the same address with another token is served
        assert await chat_status(r, token="tok-other") == 200
        assert r.sample("bandmaster_router_http_connection_shares_total", action="refused_client_cap") == 1
    finally:
        for _, writer in conns:
            writer.close()
        await r.close()


def test_token_identity_names_only_valid_data_tokens_as_the_program_limits_do():
    from services.router.ingress.http_server import token_identity
    from services.router.turn.session import client_identity

    assert token_identity(Tokens(["ctl"]), None) is None  # an open data plane: addresses count
    identify = token_identity(Tokens(["ctl"]), Tokens(["tok-a"]))
    assert identify is not None
    assert identify("Bearer tok-a") == client_identity("Bearer tok-a", "10.0.0.1")
    assert identify("Bearer ctl") == client_identity("Bearer ctl", "10.0.0.1")  # control tokens pass the guard too
    assert identify("Bearer forged") is None and identify(None) is None and identify("Basic tok-a") is None
