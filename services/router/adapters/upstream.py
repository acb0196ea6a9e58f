"""HTTP to the workers: one pooled aiohttp session, per-phase timeouts, and failures as domain errors.

Closing the response is how a request is aborted upstream (SGLang aborts a request whose client went
away). Timeouts (all configurable):

* connect: `connect_timeout_s`;
* streamed: the socket read timeout is the first-token timeout until the caller saw the first token
  (`streaming_started` then shortens it to the inter-token timeout); the caller also bounds the
  first token by wall time;
* non-streamed: the whole answer within `response_timeout_s`.

Those are the hard bounds. A turn that has sent nothing to its client is also bounded by its answer
deadline (core/deadline.py): past it the runner asks `alive` and fails the turn over when the worker
does not answer (turns.py).

Error messages name the worker by id, never by URL (a URL may carry credentials).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Mapping

import aiohttp
from orjson import dumps, loads

from services.router.errors import WorkerFailed, WorkerRejected, WorkerTimeout
from services.router.observe.redaction import redact


class Upstream:
    def __init__(
        self,
        *,
        connect_timeout_s: float,
        first_token_timeout_s: float,
        inter_token_timeout_s: float,
        response_timeout_s: float,
        headers: Mapping[str, str] | None = None,
        worker_ssl: ssl.SSLContext | bool = True,
    ) -> None:
        """`headers` go on every request to a worker (its API key: `Authorization: Bearer`, never logged);
        `worker_ssl` verifies https workers (True: the system roots; or a context with a CA / client cert)."""
        self.first_token_timeout_s = first_token_timeout_s
        self.inter_token_timeout_s = inter_token_timeout_s
        self.response_timeout_s = response_timeout_s
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s, sock_read=first_token_timeout_s
        )
        self._answer_timeout = aiohttp.ClientTimeout(
            total=response_timeout_s, connect=connect_timeout_s, sock_connect=connect_timeout_s
        )
        # The session's default serves the other calls (/server_info of the KV-event feeds).
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s, sock_read=first_token_timeout_s
            ),
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, ssl=worker_ssl),
            headers=dict(headers or {}),
            auto_decompress=False,
        )

    async def close(self) -> None:
        await self.session.close()

    async def post(
        self, worker_id: str, url: str, body: dict, headers: Mapping[str, str], *, stream: bool
    ) -> aiohttp.ClientResponse:
        """Send the request; return the open 2xx response. Raises WorkerFailed (connection refused,
        reset, 5xx), WorkerTimeout (connect or answer timeout) or WorkerRejected (4xx)."""
        try:
            response = await self.session.post(
                url,
                data=dumps(body),
                headers={"Content-Type": "application/json", **headers},
                timeout=self._stream_timeout if stream else self._answer_timeout,
            )
        except asyncio.TimeoutError:
            raise WorkerTimeout(f"worker {worker_id} did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise WorkerFailed(f"worker {worker_id} failed: {exc.__class__.__name__}") from None
        if response.status < 400:
            return response
        try:
            text = await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            text = ""
        finally:
            response.release()
        message = redact(_error_message(text) or f"worker answered HTTP {response.status}")
        if response.status >= 500:
            raise WorkerFailed(f"worker {worker_id} answered {response.status}: {message}")
        raise WorkerRejected(response.status, message)

    async def alive(self, url: str, timeout_s: float) -> bool:
        """Does the worker at `url` answer GET /health with a 2xx within `timeout_s`? (The capacity service's
        health check too: on SGLang it sees a frozen scheduler, not only a frozen HTTP server.)"""
        try:
            async with asyncio.timeout(timeout_s):
                async with self.session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                    return r.status < 300
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
            return False

    def streaming_started(self, response: aiohttp.ClientResponse) -> None:
        """The first token arrived: from now on every gap between chunks is bounded by the inter-token
        timeout (the read timer restarts now)."""
        connection = response.connection
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = self.inter_token_timeout_s
            connection.protocol.start_timeout()


def _error_message(text: str) -> str:
    """The worker's error message, at most 500 characters (it may quote the client's input)."""
    try:
        body = loads(text)
    except Exception:
        return text.strip()[:500]
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict):
            return str(body["error"].get("message", ""))[:500]
        if "message" in body:
            return str(body["message"])[:500]
    return text.strip()[:500]
