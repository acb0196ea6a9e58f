from __future__ import annotations

import pytest

from services.simworker.chat import ChatTemplateError, render_chat


def test_render_and_generation_prompt():
    text = render_chat([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert text == "<|system|>\nS\n<|user|>\nU\n<|assistant|>\n"


def test_text_parts_and_none_content():
    text = render_chat(
        [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "content": "out"},
        ],
        add_generation_prompt=False,
    )
    assert text == "<|user|>\nab\n<|assistant|>\n<|tool_call|>ls({})\n\n<|tool|>\nout\n"


def test_next_turn_extends_previous_prompt_plus_answer():
    turn1 = [{"role": "user", "content": "q1"}]
    prompt1 = render_chat(turn1)
    turn2 = turn1 + [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    assert render_chat(turn2).startswith(prompt1 + "a1")


def test_continue_final_message():
    text = render_chat(
        [{"role": "user", "content": "u"}, {"role": "assistant", "content": "part"}], continue_final_message=True
    )
    assert text.endswith("<|assistant|>\npart")


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "x",
        [{"role": "alien", "content": "x"}],
        [{"content": "x"}],
        ["x"],
        [{"role": "user", "content": [{"type": "image_url"}]}],
        [{"role": "user", "content": 5}],
    ],
)
def test_invalid_messages(messages):
    with pytest.raises(ChatTemplateError):
        render_chat(messages)
