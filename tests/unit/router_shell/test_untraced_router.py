"""A router whose spans go nowhere (no exporter): its scheduler channel has no tracing interceptor (a CLIENT
span per Bind and Complete cost CPU on every turn for nothing), yet every scheduler call still carries the
caller's trace context."""

from __future__ import annotations

import aiohttp

from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL
from tests.support.router_inprocess import InProcessRouter

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


async def test_scheduler_calls_carry_the_callers_trace_context_without_client_spans():
    r = await InProcessRouter.start(["ok"])
    try:
        assert not r.running.host_.telemetry.exporting
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        headers = {"X-Dynamo-Session-ID": "traced", "traceparent": TRACEPARENT}
        async with aiohttp.ClientSession() as s:
            async with s.post(r.url + "/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 200
        for method in ("Admit", "Bind", "Complete"):
            calls = await assert_eventually(lambda m=method: [c for c in r.sched.calls if c.method == m])
            assert calls[0].metadata["traceparent"].split("-")[1] == TRACE_ID, method
    finally:
        await r.close()
