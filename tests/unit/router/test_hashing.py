import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.router.core import hashing
from services.router.core.hashing import digest_to_block_id, page_digests, text_chunk_hashes, token_block_hashes


def sglang_rule(token_ids, page_size):
    """SGLang's published rule, written the way its utils.py states it (hex strings)."""
    out, prior = [], None
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        hasher = hashlib.sha256()
        if prior:
            hasher.update(bytes.fromhex(prior))
        for t in token_ids[start : start + page_size]:
            hasher.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = hasher.hexdigest()
        value = int(prior[:16], 16)
        out.append(value - 2**64 if value >= 2**63 else value)
    return out


@pytest.mark.parametrize(
    "tokens, page_size, expected_blocks",
    [
        ([], 4, 0),
        ([1, 2, 3], 4, 0),  # partial page only: nothing hashed
        ([1, 2, 3, 4], 4, 1),
        ([1, 2, 3, 4, 5, 6, 7], 4, 1),  # tail not hashed
        (list(range(64)), 16, 4),
        ([2**32 - 1, 0, 7, 2**31], 2, 2),  # full u32 range
    ],
)
def test_matches_sglang_rule(tokens, page_size, expected_blocks):
    ours = token_block_hashes(tokens, page_size)
    assert len(ours) == expected_blocks
    assert ours == sglang_rule(tokens, page_size)


@given(st.lists(st.integers(0, 2**32 - 1), max_size=80), st.integers(2, 9))
def test_matches_sglang_rule_property(tokens, page_size):
    assert token_block_hashes(tokens, page_size) == sglang_rule(tokens, page_size)


def test_ids_are_signed_int64():
    digest = bytes([0xFF] * 32)
    assert digest_to_block_id(digest) == -1
    assert digest_to_block_id(bytes([0x7F] + [0xFF] * 31)) == 2**63 - 1


def test_chain_continues_from_parent_digest():
    tokens = list(range(12))
    whole = page_digests(tokens, 4)
    tail = page_digests(tokens[8:], 4, parent_digest=whole[1])
    assert tail == whole[2:]


def test_chained_ids_name_whole_prefixes():
    a = token_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = token_block_hashes([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert a[1] != b[1]  # same page content, different prefix


def test_token_ids_out_of_u32_range_are_refused():
    with pytest.raises(OverflowError):
        token_block_hashes([-1, 0], 2)


def test_text_chunks_share_prefixes_and_skip_the_partial_tail():
    system = "You are a coding agent. " * 10
    first = text_chunk_hashes(system + "Fix the bug in foo.py", 16)
    second = text_chunk_hashes(system + "Fix the bug in foo.py" + " tool output: ok", 16)
    assert len(first) == len(system + "Fix the bug in foo.py") // 16
    assert second[: len(first)] == first
    assert text_chunk_hashes("abc", 16) == []


def test_text_and_token_ids_live_in_distinct_domains():
    # The same bytes hashed as text and as token ids never give the same id.
    text = "\x01\x00\x00\x00\x02\x00\x00\x00"
    assert text_chunk_hashes(text, 8) != token_block_hashes([1, 2], 2)


def test_text_chunks_count_characters_not_bytes():
    assert len(text_chunk_hashes("é" * 32, 16)) == 2


@given(st.lists(st.integers(0, 2**32 - 1), max_size=60), st.integers(2, 8))
def test_same_ids_as_the_simworker(tokens, page_size):
    from services.simworker.core.radix import page_hashes

    assert token_block_hashes(tokens, page_size) == page_hashes(tokens, page_size)


def _letters_chain(letters):
    return hashing.token_block_hashes([ord(c) for c in letters for _ in range(2)], 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from("XYZ"), max_size=6), max_size=8), st.lists(st.sampled_from("XYZ"), max_size=6))
def test_sorted_chains_give_the_longest_common_prefix_and_the_union(chains, probe):
    """chains_prefix against a walk over every chain; the union's size built from it against the set."""
    from bisect import insort

    def walk(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    ids = [tuple(_letters_chain(c)) for c in chains]
    query = tuple(_letters_chain(probe))
    for a in ids:
        assert hashing.common_prefix(a, query) == walk(a, query)
    ordered, union = [], 0
    for chain in ids:
        union += len(chain) - hashing.chains_prefix(ordered, chain, exclude_self=False)
        insort(ordered, chain)
    assert union == len({block for chain in ids for block in chain})
    assert hashing.chains_prefix(ordered, query, exclude_self=False) == max((walk(a, query) for a in ids), default=0)
    for i, chain in enumerate(ids):
        others = ids[:i] + ids[i + 1 :]
        assert hashing.chains_prefix(ordered, chain, exclude_self=True) == max(
            (walk(a, chain) for a in others), default=0
        )
