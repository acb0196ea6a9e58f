"""Outbound HTTP: one poll of one SGLang worker -> a `PollResult`.

A poll is `GET /server_info` (falling back to `/get_server_info` when the server answers 404,
as SGLang releases before the rename do) and `GET /health`, concurrently, under one deadline
that covers connecting, the headers and the whole body.

The body is read to its end however it arrives (Content-Length or chunked, in any number of
pieces), up to `max_body_bytes`: a larger body is a card rejection (`body_too_large`), refused
from its Content-Length before reading when the server declares one. Nothing that a worker
sends makes `poll` raise: the outcome is a `PollOk` (a card or a typed rejection) or a
`PollFailed` with a reason; error details never carry URL credentials.

Every request carries the workers' API key when one is configured (`WorkerClientConfig`: SGLang's
`--api-key` guards /server_info, not /health), and https workers are verified (system roots, or
`--worker-ca-file`). A 401/403 is a poll failure that says the key is missing or wrong, never the key.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from services.capacity.config import DEFAULT_MAX_SERVER_INFO_BYTES
from services.capacity.core.cards import CardCache
from services.capacity.core.registry import PollFailed, PollOk, PollResult
from services.capacity.core.state import CardRejection, CardRejectReason, PollFailureReason
from services.common.auth.redact import redact_url
from services.common.sglang.worker_client import WorkerClientConfig

log = logging.getLogger(__name__)

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
READ_CHUNK_BYTES = 64 * 1024
# Plain bodies only: a compressed one could inflate far past the cap inside the decompressor.
_HEADERS = {"Accept-Encoding": "identity"}


class _Failed(Exception):
    def __init__(self, reason: PollFailureReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = redact_url(detail)


def _describe(exc: BaseException) -> str:
    return redact_url(f"{type(exc).__name__}: {exc}")


class SglangPoller:
    def __init__(
        self,
        timeout_s: float,
        cache: CardCache,
        *,
        max_body_bytes: int = DEFAULT_MAX_SERVER_INFO_BYTES,
        max_concurrency: int = 256,
        worker_client: WorkerClientConfig | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._worker_client = worker_client or WorkerClientConfig()
        self._cache = cache
        self._max_body_bytes = max_body_bytes
        # Bounds sockets and file descriptors when thousands of workers are polled at once.
        self._gate = asyncio.Semaphore(max_concurrency)
        self._max_concurrency = max_concurrency
        self._session: aiohttp.ClientSession | None = None
        # Which info path each URL answers, so old servers cost one request per poll, not two.
        self._info_path: dict[str, str] = {}

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._max_concurrency, ttl_dns_cache=60, ssl=self._worker_client.ssl_context()
        )
        # The session timeout backs up the per-poll deadline below; neither lets a worker hold a poll.
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._worker_client.headers,
            raise_for_status=False,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=self._timeout_s * 2),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def forget(self, url: str) -> None:
        self._info_path.pop(url, None)
        self._cache.forget(url)

    async def poll(self, url: str) -> PollResult:
        if self._session is None:
            raise RuntimeError("poller not started")
        async with self._gate:
            try:
                async with asyncio.timeout(self._timeout_s):
                    body, health = await asyncio.gather(
                        self._server_info(url), self._health(url), return_exceptions=True
                    )
            except TimeoutError:
                return PollFailed(PollFailureReason.TIMEOUT, f"no complete answer within {self._timeout_s:g}s")
        # /server_info problems win: without a card the health answer does not matter.
        for outcome in (body, health):
            if isinstance(outcome, _Failed):
                return PollFailed(outcome.reason, outcome.detail)
            if isinstance(outcome, BaseException):
                if isinstance(outcome, asyncio.CancelledError):
                    raise outcome
                if not isinstance(outcome, Exception):
                    raise outcome
                return PollFailed(PollFailureReason.CONNECTION, _describe(outcome))
        if isinstance(body, CardRejection):
            return PollOk(body)
        assert isinstance(body, bytes)
        return PollOk(self._card(url, body))

    def _card(self, url: str, body: bytes):
        try:
            return self._cache.parse(url, body)
        except Exception as exc:
            # A bug in the derivation must not leave the worker's previous card standing.
            log.exception("card derivation failed for %s (%d bytes)", redact_url(url), len(body))
            return CardRejection(CardRejectReason.DERIVATION_ERROR, f"card derivation failed ({type(exc).__name__})")

    async def _read_body(self, resp: aiohttp.ClientResponse) -> bytes | CardRejection:
        too_large = CardRejection(CardRejectReason.BODY_TOO_LARGE, f"body exceeds {self._max_body_bytes} bytes")
        if resp.content_length is not None and resp.content_length > self._max_body_bytes:
            return too_large
        body = bytearray()
        while True:
            piece = await resp.content.read(READ_CHUNK_BYTES)
            if not piece:
                return bytes(body)
            body += piece
            if len(body) > self._max_body_bytes:
                return too_large

    async def _get(self, url: str, *, read_body: bool) -> tuple[int, bytes | CardRejection]:
        assert self._session is not None
        try:
            async with self._session.get(url, allow_redirects=False, headers=_HEADERS) as resp:
                if resp.status != 200 or not read_body:
                    return resp.status, b""
                return resp.status, await self._read_body(resp)
        except aiohttp.ClientError as exc:
            raise _Failed(PollFailureReason.CONNECTION, _describe(exc)) from None
        except (OSError, ValueError) as exc:
            raise _Failed(PollFailureReason.CONNECTION, _describe(exc)) from None

    async def _server_info(self, url: str) -> bytes | CardRejection:
        known = self._info_path.get(url)
        paths = (known,) if known else SERVER_INFO_PATHS
        status = 0
        for path in paths:
            status, data = await self._get(url + path, read_body=True)
            if status == 404:
                continue
            if status in (401, 403):
                key = "wrong worker API key" if self._worker_client.api_key is not None else "no worker API key given"
                raise _Failed(PollFailureReason.HTTP_STATUS, f"{path}: HTTP {status} ({key}: --worker-api-key-file)")
            if status != 200:
                raise _Failed(PollFailureReason.HTTP_STATUS, f"{path}: HTTP {status}")
            self._info_path[url] = path
            return data
        if known:
            # The server changed under us (e.g. an upgrade): rediscover on the next poll.
            self._info_path.pop(url, None)
        raise _Failed(PollFailureReason.HTTP_STATUS, f"/server_info and /get_server_info: HTTP {status}")

    async def _health(self, url: str) -> None:
        status, _ = await self._get(url + "/health", read_body=False)
        if status != 200:
            raise _Failed(PollFailureReason.HEALTH, f"/health: HTTP {status}")
