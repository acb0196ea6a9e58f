"""HTTP to the workers: one pooled aiohttp session, connect and idle timeouts, and failures as domain errors.

Closing the response is how a request is aborted upstream (SGLang aborts a request whose client went
away). `sock_read` is the idle timeout: it bounds the wait for the first byte and every gap between chunks.
"""

from __future__ import annotations

import asyncio
from typing import Mapping

import aiohttp

from services.router.errors import WorkerFailed, WorkerRejected, WorkerTimeout

try:
    import orjson

    def dumps(obj) -> bytes:
        return orjson.dumps(obj)

    loads = orjson.loads
except ImportError:  # pragma: no cover
    import json

    def dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(data):
        return json.loads(bytes(data))


class Upstream:
    def __init__(self, *, connect_timeout_s: float, idle_timeout_s: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, connect=connect_timeout_s,
                                              sock_read=idle_timeout_s)
        self.session = aiohttp.ClientSession(timeout=self._timeout,
                                             connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                                             auto_decompress=False)

    async def close(self) -> None:
        await self.session.close()

    async def post(self, url: str, body: dict, headers: Mapping[str, str]) -> aiohttp.ClientResponse:
        """Send the request; return the open 2xx response. Raises WorkerFailed (connection refused,
        reset, 5xx), WorkerTimeout (connect or first-byte timeout) or WorkerRejected (4xx)."""
        try:
            response = await self.session.post(url, data=dumps(body),
                                               headers={"Content-Type": "application/json", **headers})
        except asyncio.TimeoutError:
            raise WorkerTimeout(f"worker {url} did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise WorkerFailed(f"worker {url} failed: {exc.__class__.__name__}: {exc}") from None
        if response.status < 400:
            return response
        try:
            text = await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            text = ""
        finally:
            response.release()
        message = _error_message(text) or f"worker answered HTTP {response.status}"
        if response.status >= 500:
            raise WorkerFailed(f"worker {url} answered {response.status}: {message}")
        raise WorkerRejected(response.status, message)


def _error_message(text: str) -> str:
    try:
        body = loads(text)
    except Exception:
        return text.strip()[:500]
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            return str(body["error"].get("message", ""))
        if "message" in body:
            return str(body["message"])
    return text.strip()[:500]
