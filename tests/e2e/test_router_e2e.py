"""End to end with the real scheduler service: capacity, scheduler, router and two simworkers as processes,
driven by the official openai client. Skipped until `python -m services.scheduler` exists."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
from openai import AsyncOpenAI

from clients import session_headers
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL

pytestmark = pytest.mark.integration


async def _cluster(tmp, *worker_args: str, scheduler_args: tuple[str, ...] = ()):
    st = stack.Stack(tmp)
    workers = [st.add(await stack.simworker(tmp, f"w{i}", *worker_args)) for i in range(2)]
    cap = st.add(await stack.capacity(tmp, [w.ready["url"] for w in workers]))
    sched = st.add(await stack.scheduler(tmp, cap.ready["grpc"], *scheduler_args))
    router = st.add(
        await stack.router(
            tmp, cap.ready["grpc"], "--no-use-kv-events", "--block-size", "16", scheduler_addr=sched.ready["grpc"]
        )
    )
    url = stack.router_url(router)

    async def healthy():
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                return (await r.json())["workers"] == 2

    await assert_eventually(healthy, timeout_s=20)
    return st, workers, sched, router, url


async def _program(url: str, sid: str, turns: int, max_tokens: int, context_chars: int) -> int:
    client = AsyncOpenAI(
        base_url=url + "/v1", api_key="none", max_retries=0, timeout=120, default_headers=session_headers(sid)
    )
    messages = [{"role": "system", "content": f"{sid} " * context_chars}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"tool output {turn} " * 20})
        answer = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    final = AsyncOpenAI(
        base_url=url + "/v1", api_key="none", max_retries=0, default_headers=session_headers(sid, final=True)
    )
    await final.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    return turns


async def test_multi_turn_programs_and_passthrough_complete(tmp_path):
    st, workers, sched, router, url = await _cluster(tmp_path)
    try:
        done = await asyncio.gather(*(_program(url, f"agent-{i}", 3, 8, 50) for i in range(4)))
        assert done == [3] * 4
        plain = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        answer = await plain.completions.create(model=MODEL, prompt="no session " * 10, max_tokens=4)
        assert answer.usage.completion_tokens == 4
        assert await stack.metric(url, "bandmaster_router_scheduler_fail_open_total") == 0
        assert await stack.metric(url, "bandmaster_router_requests_total", 'path="final"') == 4
    finally:
        await st.close()


@pytest.mark.parametrize(
    "policy_args",
    [
        ("--pause-policy", "threshold"),
        # The cost-aware policy holds a context only when recomputing it would outlast the tool call;
        # a slow prefill prior makes these small contexts worth holding, so it pauses them too.
        ("--pause-policy", "cost_aware", "--cost-aware-prefill-tokens-per-s", "50"),
    ],
    ids=["threshold", "cost_aware"],
)
async def test_memory_pressure_pauses_and_resumes_and_every_program_completes(tmp_path, policy_args):
    st, workers, sched, router, url = await _cluster(
        tmp_path,
        "--max-total-tokens",
        "6000",
        scheduler_args=(
            "--scheduler-interval-seconds",
            "0.1",
            "--pause-threshold",
            "0.6",
            "--pause-target",
            "0.4",
            "--soft-demote-threshold",
            "0.4",
            "--acting-decay-tau-seconds",
            "0.2",
            "--resume-timeout-seconds",
            "20",
            *policy_args,
        ),
    )
    try:
        done = await asyncio.gather(*(_program(url, f"long-{i}", 4, 24, 1500) for i in range(6)))
        assert done == [4] * 6
        log = sched.log_text()
        assert "reason=pressure" in log or "reason=admission_full" in log
        assert re.search(r"thunderagent.program resumed|scheduler.tick resumed=[1-9]", log)
    finally:
        await st.close()
