"""Does a prompt fit the model's context? Pure: the router refuses a prompt that cannot fit before Admit,
so that the scheduler never holds (or counts) a turn that every worker would refuse.

The rule is SGLang's own (`TokenizerManager._validate_one_request`): a prompt of `n` tokens is refused
when `n >= context_length` (no room left for one output token). The limit is the largest
`context_length` among the workers that serve the model, and only when every one of them published one
(an unknown limit refuses nothing).

    exact token ids (the client's, or the model tokenizer's)   refuse when  n >= limit
    text only (no tokenizer, or its template failed)            refuse when  ceil(chars / MAX_CHARS_PER_TOKEN) >= limit

Without the tokenizer the router only estimates, so it refuses only what is certain not to fit: a
lower bound of the token count, assuming a token may span `MAX_CHARS_PER_TOKEN` characters on average
(real tokenizers average 3-5 characters on text and code; 16 is reached only by long runs of one
repeated character, which some vocabularies merge). The characters counted are the prompt's own: for a
chat request the text of its messages' contents, never the template or the JSON around them. A prompt
that fits this bound but not the context is still refused, by the worker (its 400 passes through).

`max_tokens` that pushes prompt + output past the context is the worker's decision (SGLang refuses it,
or caps it, depending on the version and its flags): the router does not judge it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

MAX_CHARS_PER_TOKEN = 16
"""Most characters one token spans on average over a whole prompt, for the text-only lower bound."""


@dataclass(frozen=True)
class ContextOverflow:
    prompt_tokens: int  # exact, or the lower bound ("at least")
    context_length: int
    exact: bool

    def message(self) -> str:
        count = f"{self.prompt_tokens}" if self.exact else f"at least {self.prompt_tokens}"
        return (
            f"This model's maximum context length is {self.context_length} tokens. However, your prompt has "
            f"{count} tokens (the prompt must be shorter than the context length). Please reduce the length "
            f"of the prompt."
        )


def context_limit(context_lengths: Iterable[int]) -> int:
    """The limit over the workers serving the model: the largest, or 0 (unknown) if any did not publish one."""
    limit = 0
    for length in context_lengths:
        if length <= 0:
            return 0
        limit = max(limit, length)
    return limit


def text_token_floor(chars: int) -> int:
    """A lower bound of the tokens of `chars` characters of text."""
    return -(-max(0, chars) // MAX_CHARS_PER_TOKEN)


def overflow(limit: int, *, token_count: int | None, text_chars: int) -> ContextOverflow | None:
    """The refusal, or None when the prompt may fit (or the limit is unknown)."""
    if limit <= 0:
        return None
    if token_count is not None:
        return ContextOverflow(token_count, limit, True) if token_count >= limit else None
    floor = text_token_floor(text_chars)
    return ContextOverflow(floor, limit, False) if floor >= limit else None


def chat_content_chars(messages: list) -> int:
    """Characters of text in an OpenAI chat request's messages: string contents and text parts only."""
    total = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += len(part["text"])
    return total
