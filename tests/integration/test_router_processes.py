"""`python -m services.router --processes 2` against a real simworker and capacity service, with a scheduler
that records every call: both processes serve the one HTTP port and admit through the scheduler, the parent's
/metrics carries both, a child's death stops the router, SIGTERM leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from services.router import processes
from services.router.config import load_config
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.processes import pid_alive
from tests.support.router_doubles import MODEL, RecordingScheduler

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def _turn(url: str, session: str) -> bytes:
    # A new connection per turn: the kernel spreads connections, not requests, over the processes.
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"turn of {session}"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        async with s.post(url + "/v1/chat/completions", json=body, headers={"X-Dynamo-Session-ID": session}) as r:
            assert r.status == 200
            return await r.read()


async def test_two_router_processes_share_the_ports_admit_every_turn_and_stop_together(tmp_path):
    st = stack.Stack(tmp_path)
    sched = RecordingScheduler()
    try:
        worker = st.add(await stack.simworker(tmp_path, "w1"))
        cap = st.add(await stack.capacity(tmp_path, [worker.ready["url"]]))
        address = await sched.start()
        router = st.add(
            await stack.router(tmp_path, cap.ready["grpc"], "--processes", "2", scheduler_addr=address, timeout_s=60)
        )
        children = router.ready["processes"]
        assert len(children) == 2 and all(pid_alive(pid) for pid in children)
        url = stack.router_url(router)

        async def both_know_the_worker():
            return await stack.metric(url, "bandmaster_router_workers") == 2  # 1 worker seen by each process

        # Each process has its own capacity watch.
        await assert_eventually(both_know_the_worker, timeout_s=20)

        answers = await asyncio.gather(*(_turn(url, f"p{i}") for i in range(24)))
        assert all(b'"usage"' in a and a.rstrip().endswith(b"data: [DONE]") for a in answers)
        assert len(sched.of("Admit")) == 24
        await assert_eventually(lambda: len(sched.of("Complete")) == 24, timeout_s=10)  # sent off the stream
        for process in ("0", "1"):
            assert await stack.metric(url, "bandmaster_router_process_up", f'router_process="{process}"') == 1
            served = await stack.metric(url, "bandmaster_router_requests_total", f'router_process="{process}"')
            assert served > 0, f"process {process} served nothing of 24 connections"
        assert await stack.metric(url, "bandmaster_router_scheduler_fail_open_total") == 0

        # A child that dies takes the router down (its supervisor restarts the whole of it).
        os.kill(children[0], signal.SIGKILL)
        assert await router.wait_exit_async(20) == 1
        await assert_eventually(lambda: not pid_alive(children[1]), timeout_s=10)
    finally:
        await st.close()
        await sched.stop()


async def test_sigterm_stops_every_router_process(tmp_path):
    router = await stack.router(tmp_path, "127.0.0.1:9", "--processes", "2", timeout_s=60)
    children = router.ready["processes"]
    try:
        assert all(pid_alive(pid) for pid in children)
    finally:
        assert await router.stop_async() == 0
    await assert_eventually(lambda: not any(pid_alive(pid) for pid in children), timeout_s=10)


async def test_a_wedged_router_process_stops_the_router(tmp_path, monkeypatch):
    """A child whose event loop no longer answers (here: SIGSTOP) counts as exited, like one that died."""
    monkeypatch.setattr(processes, "LIVENESS_PERIOD_S", 0.4)
    argv = ["--no-scheduler", "--capacity-addr", "127.0.0.1:9", "--listen", "127.0.0.1:0", "--http-port", "0"]
    argv += ["--metrics-port", "0", "--shutdown-grace-seconds", "1"]
    parent = processes.RouterProcesses(load_config([*argv, "--processes", "2"], {}), argv)
    await parent.start()
    try:
        children = [child.pid for child in parent.children]
        os.kill(children[1], signal.SIGSTOP)
        assert await asyncio.wait_for(parent.wait(asyncio.Event()), timeout=20) == 1
    finally:
        await parent.stop()
    assert not any(pid_alive(pid) for pid in children)
