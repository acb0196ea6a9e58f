"""A deterministic built-in tokenizer for the simulated server: cheap, stable, no model files.

Rule (stable across processes and versions of this module):

* A token is a run of leading whitespace followed by 1 to 4 non-space characters
  (regex ``\\s*\\S{1,4}``); trailing whitespace at the end of the text is one more token.
  So ``" hello world"`` is ``[" hell", "o", " worl", "d"]``.
* A piece in the fixed generated word list (``" ba"``, ``" bake"``, ... see `WORDS`) gets its
  list id: ``WORD_ID_BASE + index``. `decode` of those ids is exact, and
  ``encode(decode(ids)) == ids`` for them, which is what the engine generates.
* Any other piece gets ``HASH_ID_BASE + blake2b(piece) mod HASH_VOCAB``: stable and spread,
  but not invertible; `decode` renders such an id as a 4-character stand-in word.
* ``EOS_TOKEN_ID`` (2) decodes to the empty string, like a skipped special token.

Ids stay below 2**32 so that the KV page hash (4-byte little-endian ids) covers them.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import OrderedDict
from itertools import repeat
from math import floor
from operator import itemgetter
from typing import Callable, Sequence

PAD_TOKEN_ID = 0
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2

_CONSONANTS = "bcdfghjklmnprstvwz"  # 18
_VOWELS = "aeiou"  # 5

# Generated words: consonant-vowel syllables of 2 and 4 letters, each one token with its
# leading space. 90 + 8,100 words; the order is fixed forever (ids depend on it).
WORDS: tuple[str, ...] = tuple(
    [" " + c + v for c in _CONSONANTS for v in _VOWELS]
    + [" " + c1 + v1 + c2 + v2 for c1 in _CONSONANTS for v1 in _VOWELS for c2 in _CONSONANTS for v2 in _VOWELS]
)
WORD_ID_BASE = 256
NUM_WORDS = len(WORDS)
NUM_WORDS_FLOAT = float(NUM_WORDS)  # a word is drawn as floor(random() * NUM_WORDS_FLOAT)
HASH_ID_BASE = 16_384
HASH_VOCAB = 135_168  # ids end at 151,552, GLM-4.5's vocabulary size
VOCAB_SIZE = HASH_ID_BASE + HASH_VOCAB

_WORD_TO_ID = {w: WORD_ID_BASE + i for i, w in enumerate(WORDS)}
_PIECE = re.compile(r"\s*\S{1,4}|\s+$")
# Bounded memo of hashed pieces; agent prompts repeat the same pieces very often.
_piece_cache: dict[str, int] = dict(_WORD_TO_ID)
_PIECE_CACHE_MAX = 1 << 20


def _hash_id(piece: str) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    token_id = HASH_ID_BASE + int.from_bytes(digest, "little") % HASH_VOCAB
    if len(_piece_cache) < _PIECE_CACHE_MAX:
        _piece_cache[piece] = token_id
    return token_id


def encode(text: str) -> list[int]:
    """Token ids of `text` (see the module docstring for the rule)."""
    get = _piece_cache.get
    pieces = _PIECE.findall(text)
    return [get(p) or _hash_id(p) for p in pieces]


# Text of each id below the hashed range: "" for special ids (skipped), the word for word ids.
_TEXT_OF: tuple[str, ...] = ("",) * WORD_ID_BASE + WORDS


def table_text(ids: Sequence[int]) -> str:
    """`decode(ids)` for ids known to be below the hashed range (words, EOS, specials): no checks.
    (One `itemgetter` call looks them all up in C; `join(map(...))` is slower.)"""
    if len(ids) < 2:
        return "".join([_TEXT_OF[token_id] for token_id in ids])
    return "".join(itemgetter(*ids)(_TEXT_OF))


# Text of each generated word's id, None for the other ids below the hashed range (`words_text`).
_WORD_TEXT_OF: tuple[str | None, ...] = (None,) * WORD_ID_BASE + WORDS


def words_text(ids: Sequence[int]) -> str | None:
    """`decode(ids)` when every id is a generated word's (what an engine samples and
    `ids_of_n_tokens` draws), else None; for non-negative ids (as an array('I') holds them). One
    table lookup each, and no range scan first (`min` and `max` of a long list cost more than the
    lookups): an id that is not a word's is found by the lookup itself."""
    if len(ids) < 2:
        if not ids:
            return ""
        token_id = ids[0]
        return _WORD_TEXT_OF[token_id] if 0 <= token_id < len(_WORD_TEXT_OF) else None
    try:
        return "".join(itemgetter(*ids)(_WORD_TEXT_OF))  # TypeError: a None among them
    except (IndexError, TypeError):
        return None


def decode(ids) -> str:
    """Text of `ids`: exact for generated words and EOS; other ids render as stand-in words."""
    ids = ids if isinstance(ids, (list, tuple)) else list(ids)
    if not ids:
        return ""
    if min(ids) >= 0 and max(ids) < len(_TEXT_OF):  # what an engine generates: one table lookup each
        return table_text(ids)
    out = []
    for token_id in ids:
        i = token_id - WORD_ID_BASE
        if 0 <= i < NUM_WORDS:
            out.append(WORDS[i])
        elif token_id < WORD_ID_BASE:
            continue  # special tokens are skipped, as with skip_special_tokens
        else:
            out.append(WORDS[NUM_WORDS - 1 - token_id % (NUM_WORDS - 90)])
    return "".join(out)


# Where a chat prompt may be cut without changing its tokens: a message marker's newline right after a
# non-space character (see `ChunkCache`).
_MARKER = "\n<|"


class ChunkCache:
    """`encode` for prompts that repeat their history, as an agent's chat prompts do every turn.

    The rule of `encode` never lets a token span a cut at position p when text[p-1] is not whitespace
    and text[p] is: `\\S{1,4}` stops before whitespace, and the next token starts at p with its
    leading whitespace. So encode(text) == encode(text[:p]) + encode(text[p:]) exactly there. The
    prompt is cut before every message marker (`\\n<|`) that follows a non-space character, and each
    piece's ids are kept, least recently used first out, up to `max_tokens` ids in all: a turn then
    tokenises only its new messages. (A real SGLang server tokenises in its own process, so the whole
    prompt never holds up its scheduler; here the tokeniser shares the engine loop's thread.)"""

    def __init__(self, max_tokens: int = 2_000_000) -> None:
        if max_tokens < 1:
            raise ValueError("max_tokens >= 1")
        self.max_tokens = max_tokens
        self._ids: OrderedDict[str, list[int]] = OrderedDict()
        self._tokens = 0
        self.hits = 0
        self.misses = 0

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        start = 0
        at = text.find(_MARKER, 1)
        while at != -1:
            if not text[at - 1].isspace():
                out += self._piece(text[start:at])
                start = at
            at = text.find(_MARKER, at + 1)
        out += self._piece(text[start:])
        return out

    def _piece(self, piece: str) -> list[int]:
        ids = self._ids.get(piece)
        if ids is not None:
            self._ids.move_to_end(piece)
            self.hits += 1
            return ids
        self.misses += 1
        ids = encode(piece)
        if len(ids) <= self.max_tokens:
            self._ids[piece] = ids
            self._tokens += len(ids)
            while self._tokens > self.max_tokens:
                _, old = self._ids.popitem(last=False)
                self._tokens -= len(old)
        return ids

    @property
    def tokens(self) -> int:
        """Ids held now."""
        return self._tokens


def word_id(index: int) -> int:
    """Id of generated word `index` (taken modulo the list size)."""
    return WORD_ID_BASE + index % NUM_WORDS


def text_of_n_tokens(n: int, seed: int = 0) -> str:
    """Text that encodes to exactly `n` tokens, drawn from the word list (deterministic per seed)."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return "".join([WORDS[i - WORD_ID_BASE] for i in ids_of_n_tokens(n, seed)])


def ids_of_n_tokens(n: int, seed: int = 0) -> list[int]:
    """The ids `encode(text_of_n_tokens(n, seed))` returns, without building the text."""
    # rng.choices(range(NUM_WORDS), k=n) draws floor(random() * NUM_WORDS) per token; the same
    # draws in one pass (tested equal).
    return draw_word_ids(random.Random(seed).random, n)


def draw_word_ids(random_: Callable[[], float], n: int) -> list[int]:
    """`n` word ids, `WORD_ID_BASE + int(random_() * NUM_WORDS)` each in order (what the engine samples
    and `ids_of_n_tokens` draws). `floor` gives the same int as `int` for a non-negative float at
    about half the cost (`int` of a float goes through the type's constructor)."""
    words = NUM_WORDS_FLOAT
    return [WORD_ID_BASE + floor(random_() * words) for _ in repeat(None, n)]
