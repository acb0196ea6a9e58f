"""A session's next prompt reuses the digests of what it shares with the previous one, and the ids are
exactly those hashed from scratch."""

from __future__ import annotations

import hashlib
import random

import pytest

from services.router.core.hashing import TEXT_ROOT_DIGEST, digest_to_block_id, text_chunk_hashes, token_block_hashes
from services.router.core.session_chains import SessionChains


def reference_text_ids(text: str, chunk: int) -> list[int]:
    """The chain rule written out: SHA-256(previous digest || UTF-8 of each whole chunk)."""
    ids, previous = [], TEXT_ROOT_DIGEST
    for begin in range(0, len(text) - chunk + 1, chunk):
        previous = hashlib.sha256(previous + text[begin : begin + chunk].encode("utf-8", "surrogatepass")).digest()
        ids.append(digest_to_block_id(previous))
    return ids


@pytest.mark.parametrize("text", ["", "short", "x" * 64, "abc" * 500, "é" * 130 + "ascii tail" * 40, "\U0001f600" * 99])
def test_text_ids_follow_the_chain_rule_ascii_or_not(text):
    assert text_chunk_hashes(text, 64) == reference_text_ids(text, 64)


def conversation(seed: int, turns: int) -> list[str]:
    rng = random.Random(seed)
    words = ["def", "return", "self", "import", "é", "traceback", "\n", "  ", "ok", "pytest", "x" * 70]
    text, prompts = "system prompt " * 20, []
    for _ in range(turns):
        text += " ".join(rng.choice(words) for _ in range(rng.randint(5, 400)))
        prompts.append(text + "<|assistant|>")  # the generation prompt that the next turn replaces
        text += "<|assistant|>" + "answer " * rng.randint(1, 50)
    return prompts


@pytest.mark.parametrize("seed", range(5))
def test_a_growing_conversation_gets_the_scratch_ids_and_hashes_each_chunk_about_once(seed):
    chains = SessionChains(1 << 30)
    prompts = conversation(seed, 12)
    for prompt in prompts:
        assert list(chains.text_ids("s", prompt, 64)) == text_chunk_hashes(prompt, 64)
    total = len(prompts[-1]) // 64
    assert chains.reused_blocks > 0
    assert chains.hashed_blocks <= total + len(prompts)  # one boundary chunk again per turn at most


def test_a_prompt_that_diverges_early_is_hashed_from_where_it_diverges():
    chains = SessionChains(1 << 30)
    base = "a" * 6400
    chains.text_ids("s", base, 64)
    edited = base[:1000] + "B" + base[1001:]
    assert list(chains.text_ids("s", edited, 64)) == text_chunk_hashes(edited, 64)
    assert chains.reused_blocks == 1000 // 64


def test_the_session_header_is_never_trusted_an_unrelated_prompt_is_hashed_whole():
    chains = SessionChains(1 << 30)
    chains.text_ids("shared-id", "one program's prompt " * 100, 64)
    other = "another program entirely " * 100
    assert list(chains.text_ids("shared-id", other, 64)) == text_chunk_hashes(other, 64)
    assert chains.reused_blocks == 0


def test_token_prompts_reuse_pages_and_equal_the_scratch_ids():
    chains = SessionChains(1 << 30)
    rng = random.Random(7)
    tokens = [rng.randrange(150_000) for _ in range(1000)]
    for _ in range(5):
        assert list(chains.token_ids("s", tokens, 16)) == token_block_hashes(tokens, 16)
        tokens = tokens + [rng.randrange(150_000) for _ in range(rng.randint(1, 300))]
    assert chains.reused_blocks >= 4 * (1000 // 16)


def test_text_and_token_chains_of_one_session_are_apart():
    chains = SessionChains(1 << 30)
    chains.token_ids("s", list(range(64)), 16)
    text = "t" * 256
    assert list(chains.text_ids("s", text, 64)) == text_chunk_hashes(text, 64)
    assert len(chains) == 2


def test_memory_is_bounded_least_recent_session_first():
    one = len("p" * 6400)
    chains = SessionChains(3 * one)
    for i in range(10):
        chains.text_ids(f"s{i}", chr(ord("a") + i) * 6400, 64)
        assert chains.bytes <= chains.max_bytes
    assert 1 <= len(chains) <= 3
    chains.text_ids("s9", "j" * 6464, 64)  # the most recent session is still kept
    assert chains.reused_blocks == 100


def test_no_memory_keeps_nothing_and_still_answers_right():
    chains = SessionChains(0)
    text = "z" * 1000
    assert list(chains.text_ids("s", text, 64)) == text_chunk_hashes(text, 64)
    assert len(chains) == 0 and chains.bytes == 0


def test_forget_drops_a_sessions_chains():
    chains = SessionChains(1 << 30)
    chains.text_ids("s", "q" * 640, 64)
    chains.token_ids("s", list(range(64)), 16)
    chains.forget("s")
    assert len(chains) == 0 and chains.bytes == 0
