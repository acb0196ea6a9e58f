"""Two router processes against one scheduler give one program; KV events reach the index; bad config exits 2."""

from __future__ import annotations

import aiohttp
import pytest
from openai import AsyncOpenAI

from clients import session_headers
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.processes import run_module
from tests.support.router_doubles import MODEL, RecordingScheduler

pytestmark = pytest.mark.integration


async def _healthy(url: str) -> None:
    async def check():
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                return r.status == 200

    await assert_eventually(check, timeout_s=20)


async def test_two_routers_serve_one_program(tmp_path):
    st = stack.Stack(tmp_path)
    sched = RecordingScheduler()
    try:
        address = await sched.start()
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        routers = [
            st.add(await stack.router(tmp_path, cap.ready["grpc"], scheduler_addr=address, name=f"r{i}"))
            for i in range(2)
        ]
        urls = [stack.router_url(r) for r in routers]
        for url in urls:
            await _healthy(url)
        messages = [{"role": "user", "content": "start"}]
        for turn in range(4):
            client = AsyncOpenAI(
                base_url=urls[turn % 2] + "/v1",
                api_key="none",
                default_headers=session_headers("shared-prog"),
                max_retries=0,
            )
            answer = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
            messages += [
                {"role": "assistant", "content": answer.choices[0].message.content},
                {"role": "user", "content": f"turn {turn}"},
            ]
        final = AsyncOpenAI(
            base_url=urls[1] + "/v1",
            api_key="none",
            max_retries=0,
            default_headers=session_headers("shared-prog", final=True),
        )
        await final.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
        assert {a.session_id for a in sched.of("Admit")} == {"shared-prog"}
        assert len(sched.of("Admit")) == 5  # the final request is a turn too, then the release
        await assert_eventually(lambda: len(sched.of("Complete")) == 5)
        await assert_eventually(lambda: [r.session_id for r in sched.of("Release")] == ["shared-prog"])
        for url in urls:
            assert await stack.metric(url, "bandmaster_router_requests_total", 'path="program"') == 2
    finally:
        await st.close()
        await sched.stop()


async def test_kv_events_feed_the_index_and_keep_a_prefix_on_its_worker(tmp_path):
    st = stack.Stack(tmp_path)
    try:
        workers = [st.add(await stack.simworker(tmp_path, f"w{i}", kv_events=True)) for i in range(2)]
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"] for w in workers]))
        router = st.add(await stack.router(tmp_path, cap.ready["grpc"], "--use-kv-events"))
        url = stack.router_url(router)
        await _healthy(url)
        await assert_eventually(lambda: router.log_text().count("kv events: subscribed") == 2, timeout_s=15)
        prefix = list(range(1000, 1000 + 256))
        used = []
        async with aiohttp.ClientSession() as s:
            for i in range(4):
                body = {"input_ids": prefix + [7, i], "sampling_params": {"max_new_tokens": 2}}
                async with s.post(url + "/generate", json=body) as r:
                    assert r.status == 200
                    used.append((await r.json())["meta_info"])
                if i == 0:
                    await assert_eventually(
                        lambda: stack.metric(url, "bandmaster_router_kv_events_total", 'outcome="applied"')
                    )
        assert all(m["cached_tokens"] >= 256 for m in used[1:])
    finally:
        await st.close()


def test_invalid_config_exits_2_naming_the_rule():
    proc = run_module("services.router", "--kv-overlap-score-weight", "-1")
    assert proc.returncode == 2 and "kv_overlap_score_weight >= 0" in proc.stderr
    proc = run_module("services.router", "--http-port", "70000")
    assert proc.returncode == 2 and "0 <= http_port <= 65535" in proc.stderr


async def test_a_program_ended_through_another_router_stops_counting_against_its_client(tmp_path):
    """Router A counts the programs it saw against their client (cap 3 here); their final requests go to router
    B. The scheduler's release events reach A, so A's slots free up: a fourth program is served, not refused
    429 until the 900 s idle expiry (the chaos soak hit the cap this way: every program's turns on both
    routers, its final on one)."""
    st = stack.Stack(tmp_path)
    try:
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        sched = st.add(await stack.scheduler(tmp_path, cap.ready["grpc"]))
        a = st.add(
            await stack.router(
                tmp_path, cap.ready["grpc"], "--client-max-programs", "3", scheduler_addr=sched.ready["grpc"], name="a"
            )
        )
        b = st.add(await stack.router(tmp_path, cap.ready["grpc"], scheduler_addr=sched.ready["grpc"], name="b"))
        url_a, url_b = stack.router_url(a), stack.router_url(b)
        await stack.healthy_workers(url_a, 1)
        await stack.healthy_workers(url_b, 1)

        def client(url: str, sid: str, final: bool = False) -> AsyncOpenAI:
            return AsyncOpenAI(
                base_url=url + "/v1", api_key="none", max_retries=0, default_headers=session_headers(sid, final=final)
            )

        messages = [{"role": "user", "content": "start"}]
        for i in range(3):
            await client(url_a, f"p{i}").chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
            await client(url_b, f"p{i}", final=True).chat.completions.create(
                model=MODEL, messages=messages, max_tokens=2
            )

        async def fourth_served() -> bool:
            try:
                await client(url_a, "p3").chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
            except Exception as exc:  # 429 while A still counts the ended programs
                assert "429" in str(exc) or "too many open programs" in str(exc), exc
                return False
            return True

        await assert_eventually(fourth_served, timeout_s=10, interval_s=0.2)
    finally:
        await st.close()
