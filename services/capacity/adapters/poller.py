"""Outbound HTTP: one poll of one SGLang worker -> a `PollResult`.

A poll is `GET /server_info` (falling back to `/get_server_info` when the server answers 404,
as SGLang releases before the rename do) and `GET /health`, concurrently, under one deadline.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from services.capacity.core.cards import CardCache
from services.capacity.core.registry import PollFailed, PollOk, PollResult
from services.capacity.core.state import PollFailureReason

log = logging.getLogger(__name__)

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
# A real /server_info is a few KB (tens with many DP ranks); anything far larger is not one.
MAX_BODY_BYTES = 8 * 1024 * 1024


class _Failed(Exception):
    def __init__(self, reason: PollFailureReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class SglangPoller:
    def __init__(self, timeout_s: float, cache: CardCache, *, max_concurrency: int = 256) -> None:
        self._timeout_s = timeout_s
        self._cache = cache
        # Bounds sockets and file descriptors when thousands of workers are polled at once.
        self._gate = asyncio.Semaphore(max_concurrency)
        self._max_concurrency = max_concurrency
        self._session: aiohttp.ClientSession | None = None
        # Which info path each URL answers, so old servers cost one request per poll, not two.
        self._info_path: dict[str, str] = {}

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_concurrency, ttl_dns_cache=60)
        self._session = aiohttp.ClientSession(connector=connector, raise_for_status=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def forget(self, url: str) -> None:
        self._info_path.pop(url, None)

    async def poll(self, url: str) -> PollResult:
        if self._session is None:
            raise RuntimeError("poller not started")
        async with self._gate:
            try:
                async with asyncio.timeout(self._timeout_s):
                    body, health = await asyncio.gather(self._server_info(url), self._health(url),
                                                        return_exceptions=True)
            except TimeoutError:
                return PollFailed(PollFailureReason.TIMEOUT, f"no answer within {self._timeout_s:g}s")
        # /server_info problems win: without a card the health answer does not matter.
        for outcome in (body, health):
            if isinstance(outcome, _Failed):
                return PollFailed(outcome.reason, outcome.detail)
            if isinstance(outcome, BaseException):
                if isinstance(outcome, asyncio.CancelledError):
                    raise outcome
                return PollFailed(PollFailureReason.CONNECTION, f"{type(outcome).__name__}: {outcome}")
        assert isinstance(body, bytes)
        return PollOk(self._cache.parse(body))

    async def _get(self, url: str) -> tuple[int, bytes]:
        assert self._session is not None
        try:
            async with self._session.get(url, allow_redirects=False) as resp:
                data = await resp.content.read(MAX_BODY_BYTES + 1)
                return resp.status, data
        except aiohttp.ClientConnectionError as exc:
            raise _Failed(PollFailureReason.CONNECTION, f"{type(exc).__name__}: {exc}") from None
        except aiohttp.ClientError as exc:
            raise _Failed(PollFailureReason.CONNECTION, f"{type(exc).__name__}: {exc}") from None

    async def _server_info(self, url: str) -> bytes:
        known = self._info_path.get(url)
        paths = (known,) if known else SERVER_INFO_PATHS
        status = 0
        for path in paths:
            status, data = await self._get(url + path)
            if status == 404:
                continue
            if status != 200:
                raise _Failed(PollFailureReason.HTTP_STATUS, f"{path}: HTTP {status}")
            if len(data) > MAX_BODY_BYTES:
                raise _Failed(PollFailureReason.HTTP_STATUS, f"{path}: body larger than {MAX_BODY_BYTES} bytes")
            self._info_path[url] = path
            return data
        if known:
            # The server changed under us (e.g. an upgrade): rediscover on the next poll.
            self._info_path.pop(url, None)
        raise _Failed(PollFailureReason.HTTP_STATUS, f"/server_info and /get_server_info: HTTP {status}")

    async def _health(self, url: str) -> None:
        status, _ = await self._get(url + "/health")
        if status != 200:
            raise _Failed(PollFailureReason.HEALTH, f"/health: HTTP {status}")
