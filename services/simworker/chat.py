"""The simworker's built-in chat template: OpenAI messages -> one prompt string.

Used with the built-in tokenizer; with `--tokenizer-path` the model's own chat template renders the
request instead (services/common/sglang/tokenizer.py).

The template is deliberately simple and stable, so that a multi-turn conversation that
re-sends its history renders to a prompt whose prefix is the previous turn's prompt plus
the previous answer (that is what makes the radix cache hit, as with a real chat template):

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n{content}\\n ... <|assistant|>\\n

Each message is `<|{role}|>\\n{text}\\n`; the generation prompt `<|assistant|>\\n` is appended
unless the last message is an assistant message and `continue_final_message` is set.
`content` is a string, null, or a list of `{"type": "text", "text": ...}` parts (joined with
no separator); other part types are refused. Tool calls of an assistant message are rendered
as `<|tool_call|>{name}({arguments})` lines after its text.
"""

from __future__ import annotations

from typing import Any

from services.common.sglang.tokenizer import ChatTemplateError  # one error type for both templates (HTTP 400)

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _content_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatTemplateError(f"messages[{index}].content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise ChatTemplateError(f"messages[{index}].content must be a string or a list of text parts")


def _tool_calls_text(tool_calls: Any, index: int) -> str:
    if not tool_calls:
        return ""
    if not isinstance(tool_calls, list):
        raise ChatTemplateError(f"messages[{index}].tool_calls must be a list")
    lines = []
    for call in tool_calls:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        lines.append(f"<|tool_call|>{fn.get('name', '')}({fn.get('arguments', '')})\n")
    return "".join(lines)


def render_chat(messages: object, *, add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
    """Render OpenAI chat messages to the prompt text; raises ChatTemplateError on bad input."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    out: list[str] = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"messages[{i}] must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        text = _content_text(message.get("content"), i) + _tool_calls_text(message.get("tool_calls"), i)
        if i == last and continue_final_message and role == "assistant":
            out.append(f"<|assistant|>\n{text}")
            return "".join(out)
        out.append(f"<|{role}|>\n{text}\n")
    if add_generation_prompt:
        out.append("<|assistant|>\n")
    return "".join(out)
