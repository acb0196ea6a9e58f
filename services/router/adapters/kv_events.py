"""Subscriptions to the workers' SGLang KV-event publishers (ZMQ PUB, reference/kvrouter_sglang.md §C.11).

For every routable worker the router reads `kv_events_config` from its `/server_info`, connects a SUB
socket per DP rank (the port offset by the rank; a bound wildcard host becomes the worker's host) and
feeds each decoded event to the selection core. Events published before the subscription are lost
(ZMQ's slow joiner); the index is soft, so that only costs some overlap until the blocks are seen again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Callable
from urllib.parse import urlsplit

import aiohttp
import zmq
import zmq.asyncio

from services.common.outbound.retry import Backoff, RetryPolicy
from services.common.sglang.kv_events import KvEvent, decode_event_batch
from services.router.core.events import EventOutcome
from services.router.core.types import Replica, WorkerView
from services.router.observe.metrics import RouterMetrics

log = logging.getLogger(__name__)

SERVER_INFO_RETRY = RetryPolicy(first_delay_s=0.2, max_delay_s=5.0)
"""A worker's /server_info that fails: asked again after 0.2 s, doubling to 5 s, while the worker is in the fleet
(its follow task is cancelled when it leaves; each request has its own 5 s timeout)."""

ApplyEvent = Callable[[Replica, KvEvent], EventOutcome | None]
_WILDCARD_HOSTS = ("*", "0.0.0.0", "[::]", "::", "")


def subscribe_endpoint(publisher_endpoint: str, worker_url: str, dp_rank: int) -> str | None:
    """Where a subscriber connects for `dp_rank`; None for transports we cannot reach (ipc/inproc)."""
    if not publisher_endpoint.startswith("tcp://"):
        return None
    hostport = publisher_endpoint[len("tcp://") :]
    host, _, port_text = hostport.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        return None
    if host in _WILDCARD_HOSTS:
        host = urlsplit(worker_url).hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
    return f"tcp://{host}:{port + dp_rank}"


def publisher_endpoint_from_info(info: dict) -> str | None:
    raw = info.get("kv_events_config")
    if not raw:
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict) or raw.get("publisher") != "zmq":
        return None
    endpoint = raw.get("endpoint") or "tcp://*:5557"
    return endpoint if isinstance(endpoint, str) else None


class KvEventFeeds:
    """One task per routable worker that subscribes to its publisher(s) and applies the events."""

    def __init__(self, apply: ApplyEvent, metrics: RouterMetrics, http: aiohttp.ClientSession) -> None:
        self._apply = apply
        self._metrics = metrics
        self._http = http
        self._ctx = zmq.asyncio.Context()
        self._tasks: dict[str, tuple[WorkerView, asyncio.Task]] = {}

    def update(self, workers: dict[str, WorkerView]) -> None:
        for worker_id in list(self._tasks):
            view, task = self._tasks[worker_id]
            if workers.get(worker_id) != view:
                task.cancel()
                del self._tasks[worker_id]
        for worker_id, view in workers.items():
            if worker_id not in self._tasks:
                self._tasks[worker_id] = (view, asyncio.create_task(self._follow(view), name=f"kv-events-{worker_id}"))

    async def stop(self) -> None:
        tasks = [t for _, t in self._tasks.values()]
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._ctx.term()

    async def _endpoint(self, view: WorkerView) -> str | None:
        backoff = Backoff(SERVER_INFO_RETRY)
        while True:
            try:
                async with self._http.get(f"{view.url}/server_info", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status == 404:
                        async with self._http.get(
                            f"{view.url}/get_server_info", timeout=aiohttp.ClientTimeout(total=5)
                        ) as r2:
                            r2.raise_for_status()
                            return publisher_endpoint_from_info(await r2.json())
                    r.raise_for_status()
                    return publisher_endpoint_from_info(await r.json())
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                log.debug("kv events: /server_info of %s failed (%s); retrying", view.worker_id, exc.__class__.__name__)
                await asyncio.sleep(backoff.failed())

    async def _follow(self, view: WorkerView) -> None:
        endpoint = await self._endpoint(view)
        if endpoint is None:
            log.warning("kv events: worker %s publishes no ZMQ KV events; its prefixes are not indexed", view.worker_id)
            return
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        ranks: dict[int, str] = {}
        for replica in view.replicas:
            target = subscribe_endpoint(endpoint, view.url, replica.dp_rank)
            if target is not None:
                sock.connect(target)
                ranks[replica.dp_rank] = target
        if not ranks:
            log.warning("kv events: cannot reach worker %s publisher %s", view.worker_id, endpoint)
            sock.close()
            return
        log.info("kv events: subscribed to %s at %s", view.worker_id, ", ".join(ranks.values()))
        try:
            while True:
                frames = await sock.recv_multipart()
                try:
                    batch = decode_event_batch(frames[-1])
                except Exception as exc:  # a malformed payload must not end the feed
                    self._metrics.kv_events.labels("undecodable").inc()
                    log.debug("kv events: undecodable batch from %s: %s", view.worker_id, exc)
                    continue
                replica = Replica(view.worker_id, batch.dp_rank or 0)
                for event in batch.events:
                    outcome = self._apply(replica, event)
                    if outcome is not None:
                        self._metrics.kv_events.labels(outcome.value).inc()
        finally:
            sock.close(linger=0)
