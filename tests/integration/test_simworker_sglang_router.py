"""SGLang's own router (sglang-router 0.3.x) in front of two simworker processes.

The router discovers each worker over HTTP (after probing it for gRPC), health-checks
`/health`, and forwards OpenAI requests. This test fails, never skips, when it cannot route.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.support.eventually import wait_until
from tests.support.processes import Process, base_env, free_port, python_module, start

pytestmark = pytest.mark.integration
MODEL = "router-test-model"


def start_simworker(tmp_path: Path, name: str, *extra: str) -> tuple[Process, str]:
    ready = tmp_path / f"{name}.ready.json"
    proc = start(
        name,
        python_module(
            "services.simworker",
            "--port",
            "0",
            "--model-name",
            MODEL,
            "--speedup",
            "50",
            "--ready-file",
            str(ready),
            "--log-level",
            "WARNING",
            *extra,
        ),
        tmp_path,
        ready_file=ready,
    ).wait_ready()
    return proc, f"http://127.0.0.1:{proc.ready['port']}"


def requests_total(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(r'^sglang:num_requests_total\{model_name="' + re.escape(MODEL) + r'"\} (\S+)$', text, re.M)
    assert match, "sglang:num_requests_total missing from /metrics"
    return float(match.group(1))


async def test_sglang_router_routes_to_both_simworkers(tmp_path):
    procs: list[Process] = []
    urls: list[str] = []
    try:
        for name in ("a", "b"):
            proc, url = start_simworker(tmp_path, name)
            procs.append(proc)
            urls.append(url)
        router_port = free_port()
        router = start(
            "router",
            python_module(
                "sglang_router.launch_router",
                "--worker-urls",
                *urls,
                "--host",
                "127.0.0.1",
                "--port",
                str(router_port),
                "--policy",
                "round_robin",
                # Its Prometheus exporter defaults to a fixed port (29000): take a free one so that
                # parallel runs on one machine do not collide.
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                str(free_port()),
                "--log-level",
                "warn",
            ),
            tmp_path,
            env=base_env(RUST_LOG="warn"),
        )
        procs.append(router)
        base = f"http://127.0.0.1:{router_port}"
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=20)

        async def one(i: int) -> tuple[str, int]:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"request {i}: list the files"}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return content, chunks[-1].usage.completion_tokens

        # The router registers workers in the background: the first request may need a retry.
        def router_ready() -> bool:
            assert router.running, router.log_text()[-2000:]
            body = json.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
            ).encode()
            request = urllib.request.Request(
                base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        wait_until(
            router_ready,
            timeout_s=60,
            interval_s=0.25,
            message="sglang-router never routed a request to the simworkers",
        )
        for i in range(8):
            content, completion_tokens = await one(i)
            assert content and 1 <= completion_tokens <= 8
        counts = [requests_total(url) for url in urls]
        assert all(count >= 2 for count in counts), counts
        assert sum(counts) >= 9
    finally:
        for proc in procs:
            proc.stop(grace_s=10)
