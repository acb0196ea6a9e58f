"""Exact prompts: the model's tokenizer turns a text request into the token ids the worker will see.

With `--tokenizer`, a chat request is rendered with the model's chat template and encoded exactly as
SGLang does (services/common/sglang/tokenizer.py), a `/v1/completions` or `/generate` text prompt is encoded
with the model's special tokens, and the router hashes token pages (hashing.py) that equal the block
hashes of the workers' KV events. Without it, text prompts keep the approximate text-chunk mode.

Long prompts are encoded on a worker thread: the Rust tokenizer releases the GIL, so the event loop
keeps relaying other streams meanwhile (a 100K-token prompt takes a few hundred milliseconds). Short
ones are encoded inline, where the thread hop would cost more than the encoding.
"""

from __future__ import annotations

import asyncio
import enum

from services.common.sglang.tokenizer import ModelTokenizer

# Below this many characters (~2K tokens, ~3 ms) a prompt is encoded on the event loop.
INLINE_MAX_CHARS = 8192


class PromptMode(enum.Enum):
    """How a turn's prompt was hashed. The value is a metric label."""

    TOKENS = "tokens"  # exact token pages: ids given by the client or from the tokenizer
    TEXT = "text"  # approximate text chunks (no tokenizer)
    TEXT_FALLBACK = "text_fallback"  # a tokenizer is configured but the template could not render it


class PromptTokenizer:
    """The router's use of the model tokenizer: which text of a request to encode, and where."""

    def __init__(self, tokenizer: ModelTokenizer) -> None:
        self.tokenizer = tokenizer

    async def token_ids(self, text: str, *, chat_request: dict | None = None) -> list[int]:
        """Token ids of a text prompt, or of `chat_request` (an OpenAI chat body) when given.
        Raises ChatTemplateError when the chat template cannot render the request."""
        if chat_request is not None:
            if isinstance(chat_request.get("input_ids"), list):
                return self.tokenizer.chat_token_ids(chat_request)
            text, special = self.tokenizer.chat_prompt(chat_request), False  # the template holds the BOS
        else:
            special = True
        if len(text) <= INLINE_MAX_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=special)
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=special)
