"""The simulator builds the same prompts as the live path: worker token ids and router prompts."""

import random

import pytest

from clients.player import SYSTEM_PROMPT_TOKENS
from harness.simlib.conversation import Conversation
from services.router.core.kv_router import KvRouterCore
from services.router.core.params import KvRouterParams
from services.router.core.prompt_text import chat_routing_text
from services.router.turn.session import SessionIdentity
from services.router.turn.turn_types import Api, TurnSpec
from services.router.turn.turns import TurnRunner
from services.simworker.chat import render_chat
from services.simworker.core.radix import digest_to_int64, page_hashes
from services.simworker.core.tokenizer import decode, encode, ids_of_n_tokens, text_of_n_tokens


def _grow(conversation: Conversation, turns: int, rng: random.Random, words: bool = False):
    """Yield after each user message, then add an answer decoded from generated-word ids
    (`words`: both through `append_words`, as the simulator does)."""
    for k in range(turns):
        if words:
            conversation.append_words("user", ids_of_n_tokens(rng.randint(1, 300), rng.randrange(1 << 30)))
        else:
            conversation.append("user", text_of_n_tokens(rng.randint(1, 300), rng.randrange(1 << 30)))
        yield k
        answer = ids_of_n_tokens(rng.randint(1, 80), rng.randrange(1 << 30))
        if words:
            conversation.append_words("assistant", answer)
        else:
            conversation.append("assistant", decode(answer))


@pytest.mark.parametrize("words", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prompt_ids_equal_the_simworker_chat_path(seed, words):
    conversation = Conversation(text_of_n_tokens(SYSTEM_PROMPT_TOKENS, 0), page_size=16)
    for _ in _grow(conversation, 6, random.Random(seed), words):
        assert list(conversation.prompt_ids()) == encode(render_chat(conversation.messages))


def test_append_words_falls_back_for_ids_that_are_not_words():
    conversation = Conversation("sys", page_size=4)
    conversation.append_words("user", [])
    conversation.append_words("assistant", [5, 300, 20_000])  # special and hashed ids
    assert list(conversation.prompt_ids()) == encode(render_chat(conversation.messages))


def test_odd_contents_still_split_exactly():
    # Contents ending in spaces or without a leading space, and empty ones; the page chain of each
    # prompt too (a last message ending in a space is encoded again with what follows it).
    conversation = Conversation("sys  ", page_size=2)
    for role, content in [
        ("user", "x"),
        ("assistant", ""),
        ("user", "  a  b   "),
        ("assistant", "<|tool|>\n"),
        ("user", "yy zz "),
        ("assistant", "w"),
    ]:
        conversation.append(role, content)
        ids = conversation.prompt_ids()
        assert list(ids) == encode(render_chat(conversation.messages))
        assert conversation.page_chain(ids).hashes == page_hashes(list(ids), 2)


@pytest.mark.parametrize("words", [False, True])
@pytest.mark.parametrize("seed", [0, 5])
def test_text_prompt_equals_the_live_routers(seed, words):
    core = KvRouterCore(KvRouterParams(use_kv_events=False), random.Random(0))
    conversation = Conversation(text_of_n_tokens(SYSTEM_PROMPT_TOKENS, 0), page_size=16)
    for _ in _grow(conversation, 5, random.Random(seed), words):
        text = chat_routing_text(conversation.messages)
        spec = TurnSpec(Api.CHAT, {}, SessionIdentity("p"), None, True, prompt_text=text)
        expected = core.prompt_from_text(text, TurnRunner.estimated_tokens(spec))
        assert conversation.estimated_prompt_tokens() == TurnRunner.estimated_tokens(spec)
        assert conversation.text_prompt(core.params.text_chunk_chars) == expected


@pytest.mark.parametrize("page", [2, 16])
def test_token_prompt_equals_prompt_from_tokens(page):
    core = KvRouterCore(KvRouterParams(use_kv_events=False, block_size=page), random.Random(0))
    conversation = Conversation(text_of_n_tokens(37, 0), page_size=page)
    for _ in _grow(conversation, 6, random.Random(3)):
        ids = conversation.prompt_ids()
        assert conversation.token_prompt(ids) == core.prompt_from_tokens(ids)


@pytest.mark.parametrize("words", [False, True])
@pytest.mark.parametrize("page", [2, 16])
def test_page_chain_is_the_engines_chain_and_keeps_the_history_digests(page, words):
    conversation = Conversation(text_of_n_tokens(37, 0), page_size=page)
    previous = None
    for _ in _grow(conversation, 6, random.Random(4), words):
        ids = conversation.prompt_ids()
        chain = conversation.page_chain(ids)
        assert chain.hashes == page_hashes(list(ids), page)
        assert [digest_to_int64(d) for d in chain.digests] == chain.hashes
        assert conversation.page_chain(ids) is chain  # the same prompt again: nothing to do
        if previous is not None:
            # The history's pages keep their digests (the same objects: not hashed again); at most
            # the previous prompt's last page (the generation prompt's newline) differs.
            kept = sum(a is b for a, b in zip(previous.digests, chain.digests))
            assert kept >= len(previous.digests) - 1
        previous = chain


def test_routing_text_of_word_messages_is_the_live_routers():
    # Word messages build their JSON line directly; other messages (and roles) go through orjson.
    conversation = Conversation("sys", page_size=4)
    conversation.append_words("user", ids_of_n_tokens(50, 1))
    conversation.append_words("assistant", ids_of_n_tokens(9, 2))
    conversation.append("user", 'quote " and \\ and \n')
    conversation.append_words("tool-call", ids_of_n_tokens(3, 3))
    text = chat_routing_text(conversation.messages)
    core = KvRouterCore(KvRouterParams(use_kv_events=False, text_chunk_chars=8), random.Random(0))
    assert conversation.routing_text_chars == len(text)
    assert conversation.text_prompt(8) == core.prompt_from_text(text, len(text) // 4)


def test_page_chain_of_unrelated_prompts_starts_over():
    conversation = Conversation(text_of_n_tokens(37, 0), page_size=2)
    first = conversation.page_chain([1, 2, 3, 4, 5])
    assert first.hashes == page_hashes([1, 2, 3, 4, 5], 2)
    assert conversation.page_chain([1, 2, 9, 9, 5, 6]).hashes == page_hashes([1, 2, 9, 9, 5, 6], 2)
    assert conversation.page_chain([7]).hashes == []


def test_text_prompt_follows_a_change_of_chunk_size():
    """Only the text after the last complete chunk is kept between calls; a new chunk size
    starts over from the messages."""
    conversation = Conversation(text_of_n_tokens(SYSTEM_PROMPT_TOKENS, 0), page_size=16)
    for k in _grow(conversation, 6, random.Random(7), words=True):
        chunk = (64, 64, 17, 17, 64, 5)[k]
        core = KvRouterCore(KvRouterParams(use_kv_events=False, text_chunk_chars=chunk), random.Random(0))
        text = chat_routing_text(conversation.messages)
        assert conversation.text_prompt(chunk) == core.prompt_from_text(text, len(text) // 4)


def test_conversations_share_their_system_chunk_ids_as_objects():
    """The router compares chains element by element: the system message's chunk ids, which every
    program's chain starts with, are one object per value across conversations (the values are those
    of `KvRouterCore.prompt_from_text`, tested above)."""
    system = text_of_n_tokens(400, 0)
    a, b = Conversation(system, 16), Conversation(system, 16)
    a.append_words("user", ids_of_n_tokens(50, 1))
    b.append_words("user", ids_of_n_tokens(60, 2))
    pa, pb = a.text_prompt(64), b.text_prompt(64)
    shared = len(chat_routing_text([{"role": "system", "content": system}])) // 64
    assert shared > 10 and pa.block_hashes[:shared] == pb.block_hashes[:shared]
    assert all(x is y for x, y in zip(pa.block_hashes[:shared], pb.block_hashes[:shared]))
    assert pa.block_hashes[-1] != pb.block_hashes[-1]
