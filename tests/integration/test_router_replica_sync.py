"""Router replica sync with real processes: turns routed through router A raise the load router B counts."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually

pytestmark = pytest.mark.integration

PEER_REQUESTS = "bandmaster_router_replica_sync_peer_requests"


async def _long_generation(url: str, i: int) -> None:
    body = {"input_ids": [11, 12, 13, i], "sampling_params": {"max_new_tokens": 150, "ignore_eos": True}}
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/generate", json=body) as r:
            assert r.status == 200
            await r.read()


async def test_turns_through_one_router_count_in_the_other_routers_load(tmp_path):
    st = stack.Stack(tmp_path)
    try:
        # Real time (speedup 1): 150 tokens take a few seconds, long enough to read the peer's view.
        w = st.add(await stack.simworker(tmp_path, "w", "--speedup", "1"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        a, b = [
            st.add(await stack.router(tmp_path, cap.ready["grpc"], "--router-replica-sync", name=name))
            for name in ("a", "b")
        ]
        url_a, url_b = stack.router_url(a), stack.router_url(b)
        await stack.healthy_workers(url_a, 1)
        await stack.healthy_workers(url_b, 1)
        await assert_eventually(lambda: _equals(url_b, "bandmaster_router_replica_sync_peers", 1), timeout_s=10)

        turns = [asyncio.create_task(_long_generation(url_a, i)) for i in range(3)]
        # B routed nothing, yet counts A's three in-flight requests on the worker.
        await assert_eventually(lambda: _equals(url_b, PEER_REQUESTS, 3), timeout_s=10)
        assert await stack.metric(url_a, PEER_REQUESTS) == 0  # A's own are not echoed back to it
        assert await stack.metric(url_b, "bandmaster_router_requests_in_flight") == 0
        await asyncio.gather(*turns)
        await assert_eventually(lambda: _equals(url_b, PEER_REQUESTS, 0), timeout_s=10)

        a.kill()  # a router that stops reporting leaves its peers' view within its TTL (1 s)
        await assert_eventually(lambda: _equals(url_b, "bandmaster_router_replica_sync_peers", 0), timeout_s=10)
    finally:
        await st.close()


async def _equals(url: str, name: str, value: float) -> bool:
    return await stack.metric(url, name) == value


async def test_the_processes_of_one_router_each_sync_under_their_own_id(tmp_path):
    st = stack.Stack(tmp_path)
    try:
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        router = st.add(
            await stack.router(tmp_path, cap.ready["grpc"], "--processes", "2", "--router-replica-sync", timeout_s=60)
        )
        url = stack.router_url(router)
        # The parent's /metrics carries both children: each counts the other as its one peer.
        await assert_eventually(lambda: _equals(url, "bandmaster_router_replica_sync_peers", 2), timeout_s=20)
        for child in ("0", "1"):
            assert await stack.metric(url, "bandmaster_router_replica_sync_peers", f'router_process="{child}"') == 1
        assert "router replica sync: id" in router.log_text()
    finally:
        await st.close()
