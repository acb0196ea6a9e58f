"""Each session's last chain of block digests, so that a turn hashes only what its prompt adds.

An agent re-sends its whole conversation every turn: turn n+1's prompt is turn n's prompt plus what
happened since. Hashing it from the start (one SHA-256 per 64 characters or 16-token page, in a
Python loop) was the router's largest CPU cost at real context lengths (a quarter of its samples at
16,000-token prompts). Here the chain of a session's previous prompt is kept; the next prompt's
common prefix with it (whole blocks, checked by comparing the text or the packed token ids, not
trusted from the session id) reuses those digests, and only the blocks after it are hashed. The ids
are exactly those hashing from scratch gives (`hashing.py`), whatever the session header says.

Bounded by `max_bytes` (the kept prompts, digests and ids), least recently used sessions first.
Pure: no clock, no I/O; not thread-safe (the router's event loop only).
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from services.router.core.hashing import (
    TEXT_ROOT_DIGEST,
    chained_block_digests,
    digest_to_block_id,
    pack_token_ids,
    text_chunk_digests,
)

Source = TypeVar("Source", str, bytes)
_DIGEST = 32


@dataclass
class _Chain(Generic[Source]):
    source: Source
    """The prompt (text, or token ids packed as little-endian u32) the chain was hashed from."""
    unit: int
    """Characters (text) or bytes (tokens) per block."""
    digests: bytes
    """The chained 32-byte digests of its complete blocks, concatenated."""
    ids: array
    size: int


def _common_blocks(old: Source, new: Source, unit: int, limit: int) -> int:
    """How many leading whole blocks (at most `limit`) `old` and `new` share."""
    if limit <= 0:
        return 0
    if new.startswith(old[: limit * unit]):  # the usual turn: the old prompt is a prefix of the new one
        return limit
    low, high = 0, limit - 1  # old[:low*unit] is shared; old[:(limit)*unit] is not
    while low < high:
        mid = (low + high + 1) // 2
        if new.startswith(old[: mid * unit]):
            low = mid
        else:
            high = mid - 1
    return low


class SessionChains:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes >= 0")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._chains: OrderedDict[tuple[str, str], _Chain] = OrderedDict()
        self.reused_blocks = 0
        """Blocks whose digest came from a session's previous prompt (a counter for metrics and tests)."""
        self.hashed_blocks = 0

    def __len__(self) -> int:
        return len(self._chains)

    def text_ids(self, session: str, text: str, chunk_chars: int) -> tuple[int, ...]:
        """`hashing.text_chunk_hashes(text, chunk_chars)`, reusing the session's previous text chain."""
        return self._ids(
            ("text", session),
            text,
            chunk_chars,
            lambda start, parent: text_chunk_digests(text, chunk_chars, start, parent),
            TEXT_ROOT_DIGEST,
        )

    def token_ids(self, session: str, token_ids, page_size: int) -> tuple[int, ...]:
        """`hashing.token_block_hashes(token_ids, page_size)`, reusing the session's previous token chain."""
        packed = pack_token_ids(token_ids)
        unit = 4 * page_size
        return self._ids(
            ("tokens", session),
            packed,
            unit,
            lambda start, parent: chained_block_digests(packed, unit, start, parent),
            b"",
        )

    def forget(self, session: str) -> None:
        for kind in ("text", "tokens"):
            chain = self._chains.pop((kind, session), None)
            if chain is not None:
                self.bytes -= chain.size

    def _ids(
        self,
        key: tuple[str, str],
        source: Source,
        unit: int,
        hash_from: Callable[[int, bytes], list[bytes]],
        root: bytes,
    ) -> tuple[int, ...]:
        blocks = len(source) // unit
        old = self._chains.pop(key, None)
        shared = 0
        if old is not None:
            self.bytes -= old.size
            if old.unit == unit:
                shared = _common_blocks(old.source, source, unit, min(blocks, len(old.ids)))
        kept_ids, kept_digests = (old.ids[:shared], old.digests[: shared * _DIGEST]) if old else (array("q"), b"")
        parent = kept_digests[-_DIGEST:] if shared else root
        fresh = hash_from(shared * unit, parent)
        ids = array("q", kept_ids)
        ids.extend(digest_to_block_id(d) for d in fresh)
        digests = kept_digests + b"".join(fresh)
        self.reused_blocks += shared
        self.hashed_blocks += len(fresh)
        size = sys.getsizeof(source) + len(digests) + ids.itemsize * len(ids)
        if size <= self.max_bytes:
            self._chains[key] = _Chain(source, unit, digests, ids, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, evicted = self._chains.popitem(last=False)
                self.bytes -= evicted.size
        return tuple(ids)
