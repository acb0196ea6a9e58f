"""The simulated worker answers unknown paths and wrong methods with OpenAI-style JSON, not plain text."""

import aiohttp


async def test_unknown_paths_and_wrong_methods_are_json(worker):
    async with aiohttp.ClientSession() as http:
        async with http.get(worker.url + "/v1/nope") as r:
            assert r.status == 404 and r.content_type == "application/json"
            assert (await r.json())["error"]["code"] == "not_found"
        async with http.delete(worker.url + "/health") as r:
            assert r.status == 405 and "GET" in r.headers["Allow"]
            assert set((await r.json())["error"]) == {"message", "type", "param", "code"}
