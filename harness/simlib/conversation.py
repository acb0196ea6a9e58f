"""One program's chat as the live path sees it: the worker's prompt token ids and the router's prompt.

The live runner (clients/player.py) sends a growing OpenAI message list: a shared system prompt, then per
turn a new user message and, after the answer, the assistant's text. On the worker that list goes
through the simworker chat template (`services.simworker.chat.render_chat`) and tokenizer
(`services.simworker.core.tokenizer.encode`); on the router it becomes `chat_routing_text` (one JSON
line per message) hashed in text chunks, with `len(text) // 4` as the token estimate it sends to the
scheduler. This class produces exactly those, incrementally, so that a long program costs O(new
tokens) per turn rather than re-rendering and re-tokenizing its whole history.

Why the incremental token ids are exact: the tokenizer's pieces are `\\s*\\S{1,4}` (plus one piece
of trailing whitespace at the very end). A piece can never span a point where a non-space character
is followed by whitespace, so `encode(a + b) == encode(a) + encode(b)` whenever `a` ends with a
non-space character and `b` starts with whitespace. The chat template puts exactly such a point
after every role marker (`<|user|>` + `\\n`), so the history up to the last role marker is encoded
once and only the last message and the generation prompt are encoded per turn (tested against
`encode(render_chat(messages))`).
"""

from __future__ import annotations

import functools
import sys
from array import array
from typing import Sequence

from services.router.core.hashing import TEXT_ROOT_DIGEST, text_chunk_digests
from services.router.core.prompt_text import CHARS_PER_TOKEN, chat_routing_text
from services.router.core.types import Prompt
from services.simworker.core.radix import PageChain, extend_chain, published_hashes, token_bytes
from services.simworker.core.tokenizer import WORD_ID_BASE, WORDS, decode, encode, words_text

_LITTLE = sys.byteorder == "little"

# The generation prompt the template appends after the last message (add_generation_prompt).
_GENERATION_PROMPT = "<|assistant|>\n"


# The chunk ids of the system message, which starts every program's conversation, as one int object
# per value for all conversations: the router keeps chains sorted and compares them element by
# element, and equal elements that are the same object compare at C speed (an identity test),
# where equal values in distinct objects take a full int comparison each. Bounded (a run has one
# system prompt); the ids themselves are unchanged.
_SHARED_START_IDS: dict[int, int] = {}
_SHARED_START_MAX = 4_096


@functools.lru_cache(maxsize=64)
def _template_ids(text: str) -> tuple[int, ...]:
    """Ids of a fixed piece of the chat template (a role marker or the generation prompt)."""
    return tuple(encode(text))


@functools.lru_cache(maxsize=1)
def _generation_ids() -> array:
    """Ids of the generation prompt after a message that ends with a non-space character."""
    return array("I", _template_ids("\n" + _GENERATION_PROMPT))


@functools.lru_cache(maxsize=None)
def _newline_word_ids(word_id: int) -> tuple[int, ...]:
    """Ids of a message's first word after the template's newline (at most one per word)."""
    return tuple(encode("\n" + WORDS[word_id - WORD_ID_BASE]))


class Conversation:
    """Messages of one program and what the worker and the router derive from them."""

    __slots__ = (
        "messages",
        "_done_ids",
        "_tail_text",
        "_tail_ids",
        "_routing_parts",
        "_routing_chars",
        "_page_size",
        "_chain",
        "_chain_ids",
        "_chain_kept",
        "_prompt",
        "_prompt_kept",
        "_chunk_chars",
        "_chunk_ids",
        "_chunk_digest",
        "_system_chars",
    )

    def __init__(self, system_text: str, page_size: int) -> None:
        self.messages: list[dict] = []
        # Token ids of the rendered history up to and including the last message's role marker.
        self._done_ids = array("I")
        # The rendered last message after its role marker: "\n{content}\n".
        self._tail_text = ""
        # encode("\n" + content) of the last message when it ends with a non-space character
        # (then the rest of the template after it can be encoded on its own), as an array('I')
        # (copied into each prompt without converting each id); else None.
        self._tail_ids: array | None = None
        self._routing_parts: list[str] = []
        self._routing_chars = 0
        # The page chain of the last prompt given to `page_chain` (the engine's page digests, which
        # the token-mode router prompt publishes too), that prompt, and how many of its leading ids
        # every later prompt repeats (0: unknown).
        self._page_size = page_size
        self._chain = PageChain([], [])
        self._chain_ids: Sequence[int] | None = None
        self._chain_kept = 0
        # The last `prompt_ids()` and how many of its leading ids every later prompt repeats: the
        # history then (the next message is appended after the last one's ids).
        self._prompt: array | None = None
        self._prompt_kept = 0
        # Text-mode router prompt: chained chunk ids of the routing text hashed so far (it only grows).
        self._chunk_chars = 0
        self._chunk_ids: list[int] = []
        self._chunk_digest = TEXT_ROOT_DIGEST
        self.append("system", system_text)
        self._system_chars = self._routing_chars  # the routing text's part that every program shares

    def append_words(self, role: str, word_ids: list[int]) -> None:
        """`append(role, decode(word_ids))` for ids of generated words only (what the simworker
        samples and `ids_of_n_tokens` draws), without re-tokenizing the text: each word is one
        piece that starts with a space, so the message encodes to its own ids except the first,
        which the template's newline joins."""
        content = None
        if word_ids:
            try:
                ids = array("I", word_ids)
            except OverflowError:  # a negative id: not a word
                pass
            else:
                content = words_text(word_ids)
        if content is None:  # no words, or some id is not a word's
            self.append(role, decode(word_ids))
            return
        tail_ids = array("I", _newline_word_ids(word_ids[0]))
        tail_ids += ids[1:]
        self.append(role, content, tail_ids=tail_ids, plain=True)

    def append(self, role: str, content: str, tail_ids: array | None = None, plain: bool = False) -> None:
        """Add a message. `plain`: its content is words (letters and spaces: nothing JSON escapes)."""
        message = {"role": role, "content": content}
        self.messages.append(message)
        # Close the previous tail at this message's role marker (a valid split: '>' then '\n').
        if self._tail_ids is not None:
            self._done_ids.extend(self._tail_ids)
            self._done_ids.extend(_template_ids(f"\n<|{role}|>"))
        else:
            self._done_ids.extend(encode(f"{self._tail_text}<|{role}|>"))
        self._tail_text = f"\n{content}\n"
        if tail_ids is None and content and not content[-1].isspace():
            tail_ids = array("I", encode(f"\n{content}"))
        self._tail_ids = tail_ids
        if plain and role.isascii() and role.isalpha():
            # chat_routing_text([message]) for a message with nothing to escape: its JSON puts the
            # strings between quotes as they are (one copy, where encoding, decoding and adding the
            # newline made three of a long message).
            part = f'{{"role":"{role}","content":"{content}"}}\n'
        else:
            part = chat_routing_text([message])
        self._routing_parts.append(part)
        self._routing_chars += len(part)

    def prompt_ids(self) -> array:
        """What the simworker's chat endpoint submits: encode(render_chat(messages)), as an
        array('I') (the engine copies it into its own array without converting each id)."""
        # The history is copied once, into an array of the prompt's size (extending a copy of it
        # reallocates it, which copies a long history again).
        if self._tail_ids is not None:
            ids = self._done_ids + (self._tail_ids + _generation_ids())
            self._prompt, self._prompt_kept = ids, len(self._done_ids) + len(self._tail_ids)
        else:  # the last message's text is encoded again with what follows it
            ids = self._done_ids + array("I", encode(self._tail_text + _GENERATION_PROMPT))
            self._prompt, self._prompt_kept = ids, len(self._done_ids)
        return ids

    @property
    def routing_text_chars(self) -> int:
        return self._routing_chars

    def estimated_prompt_tokens(self) -> int:
        """The router's estimate for a text prompt (what it sends to Admit): len(text) // 4."""
        return max(1, self._routing_chars // CHARS_PER_TOKEN)

    def text_prompt(self, chunk_chars: int) -> Prompt:
        """The live router's approximate-mode prompt: text chunks of chat_routing_text(messages).

        Same as `KvRouterCore.prompt_from_text(text, len(text) // 4)` (tested). The routing text
        is one line per message and only grows, so each chunk is hashed once, and only the text
        after the last complete chunk is kept (the whole text is never joined)."""
        if chunk_chars != self._chunk_chars:
            self._chunk_chars, self._chunk_ids, self._chunk_digest = chunk_chars, [], TEXT_ROOT_DIGEST
            pending = chat_routing_text(self.messages)  # = all the parts
        else:
            pending = "".join(self._routing_parts)  # the text after the last complete chunk
        digests = text_chunk_digests(pending, chunk_chars, 0, self._chunk_digest)
        if digests:
            ids = published_hashes(digests).tolist()  # digest_to_block_id of each, in one pass
            if not self._chunk_ids:  # its first chunks are the system message's: share their objects
                shared = _SHARED_START_IDS
                for i in range(min(len(ids), self._system_chars // chunk_chars)):
                    block_id = ids[i]
                    ids[i] = shared.setdefault(block_id, block_id) if len(shared) < _SHARED_START_MAX else block_id
            self._chunk_ids.extend(ids)
            self._chunk_digest = digests[-1]
            pending = pending[len(digests) * chunk_chars :]
        self._routing_parts = [pending] if pending else []
        isl = self.estimated_prompt_tokens()
        tokens_per_chunk = isl * chunk_chars / self._routing_chars if self._routing_chars else 0.0
        return Prompt(tuple(self._chunk_ids), isl, tokens_per_chunk)

    def page_chain(self, ids: Sequence[int]) -> PageChain:
        """The `PageChain` of `ids` (this turn's `prompt_ids()`, which must not change after the
        call) at the worker's page size: the digests and published hashes the engine would compute
        for its complete pages. A prompt repeats the previous one but for its last pages (the
        generation prompt's trailing newline is replaced by the next turn's text), so the pages it
        shares with the previous call's prompt keep their digests and only the pages after them are
        hashed: each page of the history about once per program, not once per turn or per prefill."""
        if ids is self._chain_ids:
            return self._chain
        page = self._page_size
        width = 4 * page
        full = len(ids) // page * page
        previous = self._chain_ids
        data: bytes | memoryview
        if ids is self._prompt and isinstance(ids, array) and ids.typecode == "I" and _LITTLE:
            # Two prompts of this conversation: the previous one's first `_chain_kept` ids are this
            # one's by construction (no need to compare the history's bytes); the pages after them
            # are compared one by one (the last ones differ: the generation prompt was there).
            known = min(self._chain_kept // page, len(self._chain.digests))
            if previous is not None:
                shared = min(len(previous), full) // page
                while (
                    known < shared
                    and previous[known * page : (known + 1) * page] == ids[known * page : (known + 1) * page]
                ):
                    known += 1
            data = memoryview(ids).cast("B")[: 4 * full]  # no copy: only the new pages are read
            self._chain_kept = self._prompt_kept
        else:
            data = token_bytes(ids[:full])
            known = 0
            if previous is not None:
                known = _common_pages(token_bytes(previous[: len(self._chain.digests) * page]), data, width)
            self._chain_kept = 0
        self._chain = extend_chain(self._chain, data, width, known)
        self._chain_ids = ids
        return self._chain

    def token_prompt(self, ids: Sequence[int]) -> Prompt:
        """A token-mode prompt of `ids` (this turn's `prompt_ids()`): the chained page ids of
        `KvRouterCore.prompt_from_tokens` (tested), which are the published hashes of
        `page_chain(ids)`."""
        return Prompt(tuple(self.page_chain(ids).hashes), len(ids), float(self._page_size))


def _common_pages(known: bytes, data: bytes, width: int) -> int:
    """How many leading `width`-byte pages `data` shares with `known` (both whole pages). Usually
    all of `known` or all but its last page; else found by bisection (a shared prefix of pages
    implies every shorter one)."""
    view = memoryview(known)
    pages = min(len(known), len(data)) // width
    if data.startswith(view[: pages * width]):
        return pages
    if pages > 1 and data.startswith(view[: (pages - 1) * width]):
        return pages - 1
    lo, hi = 0, pages - 1  # lo pages are shared, hi are not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if data.startswith(view[: mid * width]):
            lo = mid
        else:
            hi = mid
    return lo
