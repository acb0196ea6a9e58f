"""ChunkCache: the simworker's chat prompts tokenised piece by piece give exactly `encode` of the whole."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.simworker.chat import render_chat
from services.simworker.core.tokenizer import ChunkCache, encode, text_of_n_tokens

# Message texts that stress the cut rule: empty, whitespace at either end, markers inside, unicode spaces.
_pieces = st.sampled_from(["", " ", "\n", "\t", "\u3000", "\u00a0", "<|user|>", "\n<|x", "ab", "hello world", "é"])
_text = st.lists(st.one_of(_pieces, st.text(max_size=12)), max_size=6).map("".join)
_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _text})


@settings(max_examples=300, deadline=None)
@given(st.lists(_message, min_size=1, max_size=8))
def test_a_growing_conversation_tokenises_exactly_as_the_whole_prompt(messages):
    cache = ChunkCache(max_tokens=64)  # small: evictions happen too
    for end in range(1, len(messages) + 1):
        prompt = render_chat(messages[:end])
        assert cache.encode(prompt) == encode(prompt)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_any_text_tokenises_exactly(text):
    assert ChunkCache().encode(text) == encode(text)


def test_an_agent_turn_tokenises_only_its_new_messages():
    cache = ChunkCache()
    messages = [{"role": "system", "content": text_of_n_tokens(400, 0)}]
    for turn in range(5):
        messages.append({"role": "user", "content": text_of_n_tokens(2_000, turn)})
        prompt = render_chat(messages)
        misses = cache.misses
        assert cache.encode(prompt) == encode(prompt)
        # Only what is new: the previous answer and this message (the first turn: the system prompt,
        # the message and the generation prompt); everything before comes from the cache.
        assert cache.misses - misses == (3 if turn == 0 else 2)
        messages.append({"role": "assistant", "content": text_of_n_tokens(100, 100 + turn)})
    assert cache.hits > 0


def test_the_cache_holds_at_most_its_budget():
    cache = ChunkCache(max_tokens=1_000)
    for seed in range(20):
        prompt = render_chat([{"role": "user", "content": text_of_n_tokens(300, seed)}] * 2)
        assert cache.encode(prompt) == encode(prompt)
        assert cache.tokens <= 1_000
    with pytest.raises(ValueError):
        ChunkCache(max_tokens=0)
