"""A worker HTTP server on raw sockets, for the capacity service's poller, fault and fuzz tests.

Unlike `tests.support.sglang_stub` (aiohttp, well behaved), every byte and pause is the
test's: a `/server_info` body written in pieces with delays, chunked or with a Content-Length
(true or false), a status, or a server that accepts connections and never answers (`frozen`).
`/health` answers 200 (or hangs too when frozen).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    """How `/server_info` (and `/get_server_info`) answers."""

    body: bytes
    pieces: int = 1  # the body is written in this many writes...
    delay_s: float = 0.0  # ...with this pause before each
    chunked: bool = False  # Transfer-Encoding: chunked (one chunk per piece), else Content-Length
    status: int = 200
    declared_length: int | None = None  # Content-Length to claim (default: the true length)

    @classmethod
    def json(cls, info: Any, **kwargs: Any) -> "Answer":
        return cls(json.dumps(info).encode(), **kwargs)


def split(body: bytes, pieces: int) -> list[bytes]:
    pieces = max(1, min(pieces, len(body) or 1))
    step, extra = divmod(len(body), pieces)
    out, start = [], 0
    for i in range(pieces):
        end = start + step + (1 if i < extra else 0)
        out.append(body[start:end])
        start = end
    return out


class RawWorker:
    def __init__(self, answer: Answer, *, host: str = "127.0.0.1") -> None:
        self.answer = answer
        self.host = host
        self.port = 0
        self.frozen = False
        self.requests: dict[str, int] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> "RawWorker":
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self.frozen:
                await asyncio.Event().wait()  # accepted, never read, never answered
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode("latin-1").split("?")[0]
            self.requests[path] = self.requests.get(path, 0) + 1
            if path == "/health":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            elif path in ("/server_info", "/get_server_info"):
                await self._answer(writer, self.answer)
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, a: Answer) -> None:
        head = f"HTTP/1.1 {a.status} X\r\nContent-Type: application/json\r\nConnection: close\r\n"
        if a.chunked:
            head += "Transfer-Encoding: chunked\r\n"
        else:
            head += f"Content-Length: {len(a.body) if a.declared_length is None else a.declared_length}\r\n"
        writer.write(head.encode() + b"\r\n")
        await writer.drain()
        for piece in split(a.body, a.pieces):
            if a.chunked and not piece:
                continue  # an empty chunk would end the body
            if a.delay_s:
                await asyncio.sleep(a.delay_s)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if a.chunked else piece)
            await writer.drain()
        if a.chunked:
            writer.write(b"0\r\n\r\n")
