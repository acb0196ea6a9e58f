"""Issue 24, with real processes: a router process admits and completes its turns on one AdmitMux stream to
a real scheduler process; turns of the official `openai` client (streamed and not) are admitted, routed to
a simworker and completed, and the scheduler sees one stream, open while the router runs."""

from __future__ import annotations

import grpc
import pytest
from openai import AsyncOpenAI

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from clients import session_headers
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL

pytestmark = pytest.mark.integration


async def test_openai_turns_go_over_one_admitmux_stream_to_a_real_scheduler(tmp_path):
    st = stack.Stack(tmp_path)
    try:
        w = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [w.ready["url"]]))
        sched = st.add(await stack.scheduler(tmp_path, cap.ready["grpc"], "--metrics-port", "0"))
        router = st.add(await stack.router(tmp_path, cap.ready["grpc"], scheduler_addr=sched.ready["grpc"]))
        url = stack.router_url(router)
        await stack.healthy_workers(url, 1)
        sched_metrics = f"http://127.0.0.1:{sched.ready['metrics_port']}"
        client = AsyncOpenAI(
            base_url=url + "/v1", api_key="none", max_retries=0, default_headers=session_headers("mux-prog")
        )
        messages = [{"role": "user", "content": "start"}]
        for turn in range(3):
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=4, stream=True, extra_body={"ignore_eos": True}
            )
            text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
            assert text
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"turn {turn}"}]
        answer = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
        assert answer.choices[0].message.content

        async with grpc.aio.insecure_channel(sched.ready["grpc"]) as channel:
            scheduler = pb_grpc.SchedulerStub(channel)

            async def four_turns_done():
                program = await scheduler.GetProgram(pb.GetProgramRequest(session_id="mux-prog"), timeout=5)
                return program.turns == 4 and program.status == pb.PROGRAM_STATUS_ACTING

            await assert_eventually(four_turns_done, timeout_s=10)
            stats = await scheduler.GetStats(pb.GetStatsRequest(), timeout=5)
            assert stats.admissions_total == 4 and stats.tickets_in_flight == 0
        assert await stack.metric(sched_metrics, "bandmaster_scheduler_admit_mux_streams") == 1
        assert await stack.metric(url, "bandmaster_router_scheduler_fail_open_total") == 0
    finally:
        await st.close()
