"""`--tokenizer-path`: the simworker tokenizes prompts with the model's tokenizer and chat template
(the same module as the router), so prompt token counts and cache hits follow the model's tokens."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from services.common.settings.errors import ConfigError
from services.common.sglang.tokenizer import load_tokenizer
from services.simworker.config import load_config
from services.simworker.server import start_simworker
from tests.support.tokenizer_files import tokenizer_dir  # noqa: F401
from tests.unit.simworker_http.conftest import MODEL

SYSTEM = {"role": "system", "content": "You are a coding agent. Run the tests and fix what fails. " * 8}


@pytest.mark.parametrize(
    "argv, env, expected",
    [
        ([], {}, ""),
        (["--tokenizer-path", "/m"], {}, "/m"),
        (["--tokenizer", "/m"], {}, "/m"),
        (["--tokenizer", "/m", "--tokenizer-path", "/m"], {}, "/m"),
        ([], {"SIMWORKER_TOKENIZER_PATH": "/env"}, "/env"),
    ],
)
def test_tokenizer_path_flag_alias_and_environment(argv, env, expected):
    assert load_config(argv, env).tokenizer_path == expected


def test_alias_that_disagrees_is_refused():
    with pytest.raises(ConfigError) as err:
        load_config(["--tokenizer", "/a", "--tokenizer-path", "/b"], {})
    assert err.value.field == "tokenizer"


async def test_a_tokenizer_that_cannot_be_loaded_stops_the_worker(tmp_path):
    with pytest.raises(ConfigError, match="missing"):
        await start_simworker(load_config(["--port", "0", "--tokenizer-path", str(tmp_path / "missing")], {}))


@pytest.fixture
async def model_worker(make_worker, tokenizer_dir):
    return await make_worker("--enable-cache-report", "--page-size", "4", "--tokenizer-path", str(tokenizer_dir))


async def test_prompt_token_counts_are_the_models(model_worker, tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    client = openai.AsyncOpenAI(base_url=model_worker.url + "/v1", api_key="none", max_retries=0, timeout=30)
    messages = [SYSTEM, {"role": "user", "content": "run the tests"}]
    chat = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert chat.usage.prompt_tokens == len(tok.chat_token_ids({"messages": messages}))
    assert chat.choices[0].message.content  # output is the engine's stand-in words
    text = "call the tool with the arguments"
    completion = await client.completions.create(model=MODEL, prompt=text, max_tokens=2)
    assert completion.usage.prompt_tokens == len(tok.encode(text))
    async with aiohttp.ClientSession() as s:
        async with s.post(
            model_worker.url + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 2}}
        ) as r:
            assert (await r.json())["meta_info"]["prompt_tokens"] == len(tok.encode(text))
        async with s.get(model_worker.url + "/server_info") as r:
            assert (await r.json())["tokenizer_path"] == str(tokenizer_dir)


async def test_next_turn_hits_the_cache_of_the_previous_prompt(model_worker, tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    client = openai.AsyncOpenAI(base_url=model_worker.url + "/v1", api_key="none", max_retries=0, timeout=30)
    turn1 = [SYSTEM, {"role": "user", "content": "run the tests"}]
    first = await client.chat.completions.create(model=MODEL, messages=turn1, max_tokens=4)
    turn2 = turn1 + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "now fix what fails"},
    ]
    second = await client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=4)
    prompt1 = len(tok.chat_token_ids({"messages": turn1}))
    assert second.usage.prompt_tokens_details.cached_tokens >= prompt1 - prompt1 % 4 > 0


async def test_messages_the_template_refuses_are_400(model_worker):
    client = openai.AsyncOpenAI(base_url=model_worker.url + "/v1", api_key="none", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError, match="unknown role"):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "developer", "content": "x"}], max_tokens=2
        )
