"""A worker that answers every turn with 5xx is taken out of rotation (its turns retried elsewhere meanwhile),
probed after the eject time, kept out while the probe fails, and back in rotation once it answers."""

from __future__ import annotations

import aiohttp
import pytest

from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL, FaultyWorker

pytestmark = pytest.mark.integration

EJECT_S = 3.0


async def _chat(url: str, i: int) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        async with s.post(
            url + "/v1/chat/completions",
            json={
                "model": MODEL,
                "max_tokens": 2,
                "stream": bool(i % 2),
                "messages": [{"role": "user", "content": f"q{i}"}],
            },
        ) as r:
            assert r.status == 200
            await r.read()


async def test_a_worker_failing_every_turn_leaves_rotation_and_is_probed_back(tmp_path):
    st = stack.Stack(tmp_path)
    faulty = FaultyWorker("refuse")
    await faulty.start()
    try:
        good = st.add(await stack.simworker(tmp_path, "good"))
        cap = st.add(await stack.capacity(tmp_path, [faulty.url, good.ready["url"]]))
        router = st.add(
            await stack.router(
                tmp_path,
                cap.ready["grpc"],
                "--router-temperature",
                "10",
                "--no-use-kv-events",
                "--worker-failure-threshold",
                "2",
                "--worker-eject-seconds",
                str(EJECT_S),
                "--worker-eject-max-seconds",
                "6",
            )
        )
        url = stack.router_url(router)

        async def two_workers():
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/health") as r:
                    return (await r.json())["workers"] == 2

        await assert_eventually(two_workers, timeout_s=20)

        i = 0
        while faulty.requests < 2:  # every turn succeeds: the 500s are retried on the good worker
            await _chat(url, i)
            i += 1
            assert i < 60, "the faulty worker was never picked"
        assert await stack.metric(url, "bandmaster_router_workers_out_of_rotation") == 1
        seen = faulty.requests
        for j in range(6):  # out of rotation: it gets nothing (before the fix: about half)
            await _chat(url, 100 + j)
        assert faulty.requests == seen

        faulty.mode = "ok"  # it recovers; after the eject time a probe finds out

        async def back_in_rotation():
            await _chat(url, 200)
            return await stack.metric(url, "bandmaster_router_workers_out_of_rotation") == 0

        await assert_eventually(back_in_rotation, timeout_s=15, interval_s=0.05)
        assert faulty.requests > seen
        assert await stack.metric(url, "bandmaster_router_worker_circuit_transitions_total", 'state="closed"') == 1
        log = router.log_text()
        assert "out of rotation after 2 consecutive failures" in log and "back in rotation" in log
    finally:
        await st.close()
        await faulty.stop()
