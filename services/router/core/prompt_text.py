"""The router's text view of a prompt when it has no tokenizer (approximate mode), pure.

The HTTP and gRPC edges render chat messages with `chat_routing_text` for the prefix index and
estimate prompt size with `CHARS_PER_TOKEN`; the offline simulator (harness/simlib) uses the same
two so that its routing sees exactly the text the live router sees.
"""

from __future__ import annotations

import orjson

CHARS_PER_TOKEN = 4  # prompt-size estimate for text prompts when the router has no tokenizer


def chat_routing_text(messages: list) -> str:
    """A stable rendering for the prefix index: history re-sent verbatim renders to the same prefix."""
    return "".join(orjson.dumps(m).decode() + "\n" for m in messages)
