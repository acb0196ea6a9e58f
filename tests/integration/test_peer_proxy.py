"""The peer proxy (bench/peer_proxy.py) in front of a real simworker, played by the live runner.

Two programs whose contexts do not fit the worker's pool together: ThunderAgent must hold one of them
(queued at its first turn, or paused at a tool boundary) and still finish both; Continuum pins and
admits FCFS. The official `openai` client's non-streamed call goes through too.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import openai
import pytest

from bench.peers import chat_ok
from clients.player import Runner
from clients.workloads import Program, Turn
from tests.support.eventually import wait_until
from tests.support.processes import Process, free_port, python_module, start

pytestmark = pytest.mark.integration
MODEL = "peer-proxy-test-model"
SPEEDUP = 50.0


def start_simworker(tmp_path: Path) -> tuple[Process, str]:
    ready = tmp_path / "worker.ready.json"
    proc = start(
        "worker",
        python_module(
            "services.simworker",
            "--port",
            "0",
            "--model-name",
            MODEL,
            "--speedup",
            str(SPEEDUP),
            "--max-total-tokens",
            "4096",
            "--ready-file",
            str(ready),
            "--log-level",
            "WARNING",
        ),
        tmp_path,
        ready_file=ready,
    ).wait_ready()
    return proc, f"http://127.0.0.1:{proc.ready['port']}"


def programs() -> list[Program]:
    def turns(base: int) -> tuple[Turn, ...]:
        return (Turn(base, 16, 2.0), Turn(base + 400, 16, 2.0), Turn(base + 800, 16, 0.0))

    return [Program("p-big", turns(2400)), Program("p-small", turns(1600))]


@pytest.mark.parametrize("policy", ["thunderagent", "continuum"])
async def test_peer_proxy_plays_two_programs_through_a_simworker(tmp_path, policy):
    worker, worker_url = start_simworker(tmp_path)
    port = free_port()
    proxy = start(
        "proxy",
        python_module(
            "bench.peer_proxy",
            "--policy",
            policy,
            "--worker-urls",
            worker_url,
            "--port",
            str(port),
            "--speedup",
            str(SPEEDUP),
            "--request-timeout-seconds",
            "60",
        ),
        tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: chat_ok(url, MODEL), timeout_s=30, message=f"the proxy never routed: {proxy.log_tail()}")
        result = await Runner(url + "/v1", MODEL, time_scale=SPEEDUP, request_timeout_s=60).run(programs(), 2)
        summary = result.summary()
        assert summary["turns_ok"] == 6, (summary, proxy.log_tail())
        assert summary["programs_done"] == 2
        with urllib.request.urlopen(url + "/peer/stats", timeout=5) as response:
            stats = json.loads(response.read())
        assert stats["turns"] == 6
        # The core saw every turn's usage (the player closes its stream at [DONE], before the proxy's end).
        assert stats["turns_without_usage"] == 0, stats
        if policy == "thunderagent":
            # 2 x ~3,000 tokens on a 4,096-token pool: one program waited for the other.
            assert stats["held_turns"] >= 1 and stats["resumes"] >= 1, stats
            assert stats["paused_now"] == 0
        else:
            assert stats["pins"] >= 2 and stats["queued_now"] == 0, stats

        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
        answer = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
            extra_headers={"X-Dynamo-Session-ID": "p-openai"},
        )
        assert answer.usage is not None and answer.usage.completion_tokens >= 1
        await client.close()
    finally:
        proxy.stop()
        worker.stop()
