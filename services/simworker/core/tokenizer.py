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


def decode(ids) -> str:
    """Text of `ids`: exact for generated words and EOS; other ids render as stand-in words."""
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


def word_id(index: int) -> int:
    """Id of generated word `index` (taken modulo the list size)."""
    return WORD_ID_BASE + index % NUM_WORDS


def text_of_n_tokens(n: int, seed: int = 0) -> str:
    """Text that encodes to exactly `n` tokens, drawn from the word list (deterministic per seed)."""
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(seed)
    return "".join(WORDS[i] for i in rng.choices(range(NUM_WORDS), k=n))


def ids_of_n_tokens(n: int, seed: int = 0) -> list[int]:
    """The ids `encode(text_of_n_tokens(n, seed))` returns, without building the text."""
    rng = random.Random(seed)
    return [WORD_ID_BASE + i for i in rng.choices(range(NUM_WORDS), k=n)]
