"""Block hashing: the ids the prefix index is keyed by.

Token pages (event-driven mode and tokenized prompts) use SGLang's KV-event rule, so that our
ids equal the `block_hashes` a current SGLang (and the simworker) publishes:

    digest_0 = SHA-256(tokens of page 0 as 4-byte little-endian u32)
    digest_i = SHA-256(digest_{i-1} || tokens of page i as 4-byte little-endian u32)
    id_i     = first 8 bytes of digest_i, big-endian, as a signed int64

Only complete pages are hashed (a partial tail page is never cached as a page by the engine).
The chain runs on the full 32-byte digest, never on the truncated id.

Text chunks (approximate mode without a tokenizer) use the same chain over fixed-size chunks
of the rendered prompt text (UTF-8 of `chunk_chars` characters each), from a distinct root so
that a text id can never equal a token id by construction. The approximation: a chunk of N
characters stands in for a page. Agent conversations re-send the previous turn's text verbatim
as the prefix of the next one, so equal text prefixes (system prompt, tool schemas, history)
map to equal chunk chains, which is what the index needs. What it gets wrong: chunk boundaries
are not page boundaries, so overlap is measured in characters and converted to tokens by the
prompt's own characters-per-token ratio; two prompts whose texts agree but whose chat template
or tokenizer differs are (wrongly) treated as sharing KV; and a one-character edit early in the
text invalidates every later chunk, as it would for tokens.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from bisect import bisect_left
from typing import Container, Sequence

# Root of every text chain: keeps text ids and token ids in disjoint hash domains.
TEXT_ROOT_DIGEST = hashlib.sha256(b"bandmaster.router.text-chunks.v1").digest()


_INT64_BE = struct.Struct(">q").unpack_from


def digest_to_block_id(digest: bytes) -> int:
    """First 8 bytes of a SHA-256 digest as a signed int64 (SGLang's `hash_str_to_int64`)."""
    return _INT64_BE(digest)[0]


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as 4-byte little-endian u32s: what a page's digest is taken over."""
    # One conversion for the whole prompt, then slices per page: the hot path stays O(tokens).
    packed = array("I", token_ids)  # OverflowError for ids outside [0, 2**32)
    if packed.itemsize != 4:  # pragma: no cover - every mainstream ABI has a 4-byte unsigned int
        packed = array("L", token_ids)
    if sys.byteorder != "little":  # pragma: no cover
        packed.byteswap()
    return packed.tobytes()


def chained_block_digests(data: bytes, block_bytes: int, start: int = 0, parent_digest: bytes = b"") -> list[bytes]:
    """Chained digests of the complete `block_bytes` blocks of `data[start:]`, continuing `parent_digest`
    (the digest of the block ending at `start`, a block boundary)."""
    digests: list[bytes] = []
    previous = parent_digest
    sha256 = hashlib.sha256
    for begin in range(start, len(data) - block_bytes + 1, block_bytes):
        previous = sha256(previous + data[begin : begin + block_bytes]).digest()
        digests.append(previous)
    return digests


def page_digests(token_ids: Sequence[int], page_size: int, parent_digest: bytes = b"") -> list[bytes]:
    """Chained SHA-256 digests of the complete pages of `token_ids`, continuing `parent_digest`."""
    if page_size < 1:
        raise ValueError("page_size must be >= 1")
    return chained_block_digests(pack_token_ids(token_ids), 4 * page_size, 0, parent_digest)


def token_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Ids of the complete `block_size`-token pages of a prompt, chained from the root."""
    return [digest_to_block_id(d) for d in page_digests(token_ids, block_size)]


def held_prefix(block_hashes: Sequence[int], held: Container[int]) -> int:
    """How many leading blocks of a chain `held` contains, when what it holds is closed under
    prefixes (a chained id names its whole prefix, so any set built from whole chains is). Found
    by bisection: O(log n) lookups instead of a walk over a prompt of thousands of blocks."""
    low, high = 0, len(block_hashes)  # block_hashes[:low] is held
    while low < high:
        mid = (low + high + 1) // 2
        if block_hashes[mid - 1] in held:
            low = mid
        else:
            high = mid - 1
    return low


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Leading blocks two chains share: a bisection (equal ids at a depth mean equal prefixes).
    The two ends are tried first: one chain often extends the other, or they share nothing."""
    high = min(len(a), len(b))
    if not high or a[0] != b[0]:
        return 0
    if a[high - 1] == b[high - 1]:
        return high
    low, high = 1, high - 1  # a[:low] == b[:low]; they differ at high
    while low < high:
        mid = (low + high + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            low = mid
        else:
            high = mid - 1
    return low


def chains_prefix(chains: list[tuple[int, ...]], chain: tuple[int, ...], exclude_self: bool) -> int:
    """The longest prefix `chain` shares with any of the sorted `chains` (less one copy of
    itself with `exclude_self`): in sorted order the longest is with a neighbour. So the union
    of a set of chains, closed under prefixes, needs no per-block entry: a chain adds to it its
    length less this, and `chains_prefix(chains, query, False)` is `held_prefix` of the union."""
    return chains_position(chains, chain, exclude_self)[1]


def chains_position(chains: list[tuple[int, ...]], chain: tuple[int, ...], exclude_self: bool) -> tuple[int, int]:
    """(`bisect_left(chains, chain)`, `chains_prefix(chains, chain, exclude_self)`): where `chain`
    goes among the sorted `chains`, or where a copy of it is, and its longest shared prefix, from one
    bisection. A caller that inserts or deletes the chain next needs no second one (equal chains
    are equal values: which copy goes, or which side of its equals a new one goes, is the same list).
    Long chains compare in time proportional to their common prefix, so each bisection counts."""
    low = bisect_left(chains, chain)
    high = low
    if exclude_self:
        # bisect_right(chains, chain, low) when fewer than two copies follow `low`: an equality test
        # of tuples of different lengths ends at once, where each step of a bisection walks a prefix.
        n = len(chains)
        if low < n and chains[low] == chain:
            high = low + 1
            if high < n and chains[high] == chain:
                return low, len(chain)  # another request holds the same chain
    best = common_prefix(chain, chains[low - 1]) if low > 0 else 0
    if high < len(chains):
        # The other neighbour shares more only if it agrees at depth `best` (equal ids at a depth
        # mean equal prefixes): mostly it does not, and its bisection is skipped.
        other = chains[high]
        if best < len(chain) and best < len(other) and chain[best] == other[best]:
            best = common_prefix(chain, other)
    return low, best


def text_chunk_digests(
    text: str, chunk_chars: int, start: int = 0, parent_digest: bytes = TEXT_ROOT_DIGEST
) -> list[bytes]:
    """Chained digests of the complete chunks of `text[start:]`, continuing `parent_digest`
    (the digest of the chunk ending at `start`; `start` must be a multiple of `chunk_chars`).
    Lets a caller that knows its text only grows hash each chunk once."""
    if chunk_chars < 1:
        raise ValueError("chunk_chars must be >= 1")
    if start % chunk_chars:
        raise ValueError("start must be a chunk boundary")
    if text.isascii():  # a character is a byte: encode once, slice bytes (the same chunks, the same digests)
        return chained_block_digests(text.encode("ascii"), chunk_chars, start, parent_digest)
    digests: list[bytes] = []
    previous = parent_digest
    sha256 = hashlib.sha256
    for begin in range(start, len(text) - chunk_chars + 1, chunk_chars):
        previous = sha256(previous + text[begin : begin + chunk_chars].encode("utf-8", "surrogatepass")).digest()
        digests.append(previous)
    return digests


def text_chunk_hashes(text: str, chunk_chars: int) -> list[int]:
    """Ids of the complete `chunk_chars`-character chunks of a rendered prompt, chained."""
    return [digest_to_block_id(d) for d in text_chunk_digests(text, chunk_chars)]
