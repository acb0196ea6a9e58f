"""A final request (`X-Dynamo-Session-Final: true`) with content is a turn like any other: the worker
serves it, the client gets the completion, and the program is released after the turn's Complete. One
without content (no messages / prompt / text) only releases the program: an empty completion, no worker."""

import json

import aiohttp

from services.router.ingress.http_api import has_content
from services.router.turn.turn_types import Api
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL
from tests.support.router_inprocess import InProcessRouter

FINAL = {"X-Dynamo-Session-ID": "agent-7", "X-Dynamo-Session-Final": "true"}


async def _post(router, body: dict, headers: dict, path: str = "/v1/chat/completions"):
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + path, json=body, headers=headers) as r:
            return r.status, await r.read()


def _methods(router) -> list[str]:
    return [c.method for c in router.sched.calls if c.method in ("Admit", "AdmitStream", "Complete", "Release")]


async def test_a_final_request_with_content_is_served_then_its_program_released():
    r = await InProcessRouter.start(["ok"])
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "the last question"}], "max_tokens": 4}
        status, raw = await _post(r, body, FINAL)
        assert status == 200, raw
        answer = json.loads(raw)
        assert answer["choices"][0]["message"]["content"] and answer["usage"]["completion_tokens"] > 0
        assert r.workers[0].requests == 1  # the user's message reached the worker

        await assert_eventually(lambda: r.sched.of("Release"))
        methods = _methods(r)
        assert methods.index("Release") > methods.index("Complete")  # released after the turn's Complete
        assert [rel.session_id for rel in r.sched.of("Release")] == ["agent-7"]
        assert r.sample("bandmaster_router_requests_total", path="final", outcome="ok") == 1
    finally:
        await r.close()


async def test_a_streamed_final_request_is_served_then_released():
    r = await InProcessRouter.start(["ok"])
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "max_tokens": 4, "stream": True}
        status, raw = await _post(r, body, FINAL)
        assert status == 200 and raw.rstrip().endswith(b"data: [DONE]")
        assert b'"content":"' in raw.replace(b'"content":""', b"") and r.workers[0].requests == 1
        await assert_eventually(lambda: r.sched.of("Release"))
    finally:
        await r.close()


async def test_a_final_request_without_content_only_releases():
    r = await InProcessRouter.start(["ok"])
    try:
        status, raw = await _post(r, {"model": MODEL, "messages": []}, FINAL)
        assert status == 200
        assert json.loads(raw)["choices"][0]["message"]["content"] == ""
        assert r.workers[0].requests == 0 and [rel.session_id for rel in r.sched.of("Release")] == ["agent-7"]
        status, raw = await _post(r, {"model": MODEL, "messages": [], "stream": "yes"}, FINAL)
        assert status == 400  # still validated
    finally:
        await r.close()


def test_what_counts_as_content():
    assert has_content(Api.CHAT, {"messages": [{"role": "user", "content": ""}]})
    assert not has_content(Api.CHAT, {"messages": []}) and not has_content(Api.CHAT, {})
    assert has_content(Api.COMPLETIONS, {"prompt": [1, 2]}) and not has_content(Api.COMPLETIONS, {"prompt": ""})
    assert has_content(Api.GENERATE, {"input_ids": [3]}) and not has_content(Api.GENERATE, {"text": ""})
