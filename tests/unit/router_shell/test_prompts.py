"""The router's exact-prompt path: the --tokenizer flag, which text of a request is encoded, the
text fallback, and a tokenizer that cannot be loaded stopping the router before it starts."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.common.sglang.tokenizer import load_tokenizer
from services.router.config import RouterConfig, load_config
from services.router.core.hashing import token_block_hashes
from services.router.core.kv_router import KvRouterCore
from services.router.core.params import KvRouterParams
from services.router.ingress.http_api import build_spec
from services.router.observe.metrics import RouterMetrics
from services.router.server import start_router
from services.router.turn import session
from services.router.turn.prompts import INLINE_MAX_CHARS, PromptMode, PromptTokenizer
from services.router.turn.turn_types import Api
from services.router.turn.turns import TurnRunner
from tests.support.tokenizer_files import build_tokenizer_dir, tokenizer_dir  # noqa: F401

CHAT = {
    "messages": [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Run the tests"}]
}


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def _runner(prompts: PromptTokenizer | None) -> TurnRunner:
    return TurnRunner(None, None, None, RouterMetrics(), None, circuits=None, prompts=prompts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv, env, expected",
    [
        ([], {}, ""),
        (["--tokenizer", "/models/glm"], {}, "/models/glm"),
        ([], {"BANDMASTER_ROUTER_TOKENIZER": "/from/env"}, "/from/env"),
        (["--tokenizer", "/flag"], {"BANDMASTER_ROUTER_TOKENIZER": "/from/env"}, "/flag"),
    ],
)
def test_tokenizer_flag_and_environment(argv, env, expected):
    assert load_config(argv, env).tokenizer == expected


async def test_chat_and_text_prompts_are_encoded_as_the_worker_does(tok):
    prompts = PromptTokenizer(tok)
    assert await prompts.token_ids("", chat_request=dict(CHAT)) == tok.chat_token_ids(CHAT)
    assert await prompts.token_ids("Run the tests") == tok.encode("Run the tests")
    long_text = "call the tool with the arguments " * (INLINE_MAX_CHARS // 16)
    assert len(long_text) > INLINE_MAX_CHARS
    assert await prompts.token_ids(long_text) == tok.encode(long_text)  # on a worker thread
    long_chat = {"messages": [{"role": "user", "content": long_text}]}
    assert await prompts.token_ids("", chat_request=long_chat) == tok.chat_token_ids(long_chat)


@pytest.mark.parametrize(
    "api, body",
    [
        (Api.CHAT, CHAT),
        (Api.COMPLETIONS, {"prompt": "Run the tests"}),
        (Api.GENERATE, {"text": "Run the tests"}),
    ],
)
async def test_text_turns_get_token_ids(tok, api, body):
    spec = build_spec(api, dict(body), session.SessionIdentity())
    assert spec.prompt_token_ids is None
    assert await _runner(PromptTokenizer(tok)).tokenize(spec) is PromptMode.TOKENS
    expected = tok.chat_token_ids(body) if api is Api.CHAT else tok.encode("Run the tests")
    assert spec.prompt_token_ids == expected


async def test_fallbacks_and_client_token_ids(tok):
    runner = _runner(PromptTokenizer(tok))
    bad = build_spec(Api.CHAT, {"messages": [{"role": "alien", "content": "x"}]}, session.SessionIdentity())
    assert await runner.tokenize(bad) is PromptMode.TEXT_FALLBACK and bad.prompt_token_ids is None
    given = build_spec(Api.COMPLETIONS, {"prompt": [5, 6, 7]}, session.SessionIdentity())
    assert await runner.tokenize(given) is PromptMode.TOKENS and given.prompt_token_ids == [5, 6, 7]
    plain = build_spec(Api.CHAT, dict(CHAT), session.SessionIdentity())
    assert await _runner(None).tokenize(plain) is PromptMode.TEXT and plain.prompt_token_ids is None


async def test_tokenized_chat_hashes_to_token_pages(tok):
    """Exact mode: the prompt's entries are the KV-event block hashes of its complete pages."""
    spec = build_spec(Api.CHAT, dict(CHAT), session.SessionIdentity())
    await _runner(PromptTokenizer(tok)).tokenize(spec)
    core = KvRouterCore(KvRouterParams(block_size=4), rng=None)  # type: ignore[arg-type]
    prompt = core.prompt_from_tokens(spec.prompt_token_ids)
    assert prompt.block_hashes == tuple(token_block_hashes(spec.prompt_token_ids, 4))
    assert prompt.isl_tokens == len(spec.prompt_token_ids) and len(prompt.block_hashes) == prompt.isl_tokens // 4


async def test_a_tokenizer_that_cannot_be_loaded_stops_the_router_before_it_starts(tmp_path):
    with pytest.raises(ConfigError, match="tokenizer"):
        await start_router(RouterConfig(use_scheduler=False, tokenizer=str(tmp_path / "missing")))
    directory = build_tokenizer_dir(tmp_path / "bad", chat_template="{% if %}")
    with pytest.raises(ConfigError, match="syntax error"):
        await start_router(RouterConfig(use_scheduler=False, tokenizer=str(directory)))
