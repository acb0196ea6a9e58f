"""The shared model tokenizer: loading errors, chat template rendering as SGLang applies it, encoding."""

from __future__ import annotations

import json

import pytest

from services.common.settings.errors import ConfigError
from services.common.sglang.tokenizer import CONTENT_PARTS, CONTENT_STRING, ChatTemplateError, load_tokenizer
from tests.support.tokenizer_files import BOS, build_tokenizer_dir, tokenizer_dir  # noqa: F401


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "Run the tests"}


# -- rendering ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages, expected",
    [
        (
            [SYSTEM, USER],
            f"{BOS}<|system|>\nYou are a coding agent.<|end|>\n<|user|>\nRun the tests<|end|>\n<|assistant|>\n",
        ),
        # null content renders as "", null keys are dropped; arguments given as a JSON string reach the
        # template as an object (tojson prints it back); list content is flattened with one space
        (
            [
                USER,
                {
                    "role": "assistant",
                    "content": None,
                    "name": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "make"}'}}
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": "c1",
                    "content": [{"type": "text", "text": "all"}, {"type": "text", "text": "passed"}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "good"},
                        {"type": "image_url", "image_url": {}},
                        {"type": "text", "text": "now"},
                    ],
                },
            ],
            f'{BOS}<|user|>\nRun the tests<|end|>\n<|assistant|>\n<call>bash {{"cmd": "make"}}</call><|end|>\n'
            "<|tool|>\nall passed<|end|>\n<|user|>\ngood now<|end|>\n<|assistant|>\n",
        ),
    ],
)
def test_chat_prompt_renders_like_sglang(tok, messages, expected):
    assert tok.chat_prompt({"messages": messages}) == expected


def test_generation_prompt_and_raw_rendering(tok):
    assert tok.render_chat([USER], add_generation_prompt=False).endswith("<|end|>\n")
    assert tok.render_chat([USER]).endswith("<|end|>\n<|assistant|>\n")


def test_trailing_assistant_message_is_continued_or_becomes_a_user_message(tok):
    messages = [USER, {"role": "assistant", "content": "I will run"}]
    continued = tok.chat_prompt({"messages": messages, "continue_final_message": True})
    assert continued.endswith("<|user|>\nRun the tests<|end|>\n<|assistant|>\nI will run")
    as_user = tok.chat_prompt({"messages": messages})
    assert as_user.endswith("<|user|>\nI will run<|end|>\n<|assistant|>\n")


def test_tools_are_passed_unless_tool_choice_is_none(tok):
    tools = [
        {"type": "function", "function": {"name": "bash", "parameters": {}}},
        {"type": "function", "function": {"name": "edit", "parameters": {}}},
    ]
    with_tools = tok.chat_prompt({"messages": [USER], "tools": tools})
    assert with_tools.startswith(f'{BOS}<|system|>\nTools: [{{"type": "function"') and "edit" in with_tools
    named = tok.chat_prompt(
        {"messages": [USER], "tools": tools, "tool_choice": {"type": "function", "function": {"name": "bash"}}}
    )
    assert "bash" in named and "edit" not in named
    assert "Tools" not in tok.chat_prompt({"messages": [USER], "tools": tools, "tool_choice": "none"})


def test_template_kwargs_reach_the_template(tmp_path):
    template = "{{ bos_token }}{{ greeting }}|{{ reasoning_effort }}|{{ messages[0]['content'] }}"
    tok = load_tokenizer(build_tokenizer_dir(tmp_path / "t", chat_template=template))
    prompt = tok.chat_prompt(
        {"messages": [USER], "chat_template_kwargs": {"greeting": "hi"}, "reasoning_effort": "low"}
    )
    assert prompt == f"{BOS}hi|low|Run the tests"


def test_named_templates_pick_default_or_tool_use(tmp_path):
    templates = [
        {"name": "default", "template": "D{{ messages | length }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]
    tok = load_tokenizer(build_tokenizer_dir(tmp_path / "t", chat_template=templates))
    assert tok.chat_prompt({"messages": [USER]}) == "D1"
    assert tok.chat_prompt({"messages": [USER], "tools": [{"type": "function", "function": {"name": "x"}}]}) == "T1"


def test_content_format_detection(tmp_path):
    parts = "{% for m in messages %}{% for part in m['content'] %}[{{ part['text'] }}]{% endfor %}{% endfor %}"
    tok = load_tokenizer(build_tokenizer_dir(tmp_path / "t", chat_template=parts))
    assert tok.content_format() == CONTENT_PARTS
    assert (
        tok.chat_prompt(
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
        )
        == "[a][b]"
    )
    assert load_tokenizer(build_tokenizer_dir(tmp_path / "s")).content_format() == CONTENT_STRING


def test_chat_template_file_wins_over_the_config(tmp_path):
    directory = build_tokenizer_dir(tmp_path / "t")
    (directory / "chat_template.jinja").write_text("FILE {{ messages[0]['content'] }}")
    assert load_tokenizer(directory).chat_prompt({"messages": [USER]}) == "FILE Run the tests"


@pytest.mark.parametrize(
    "request_body, message",
    [
        ({"messages": [{"role": "alien", "content": "x"}]}, "unknown role: alien"),
        ({"messages": []}, "non-empty"),
        ({"messages": ["x"]}, "string role"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}],
                    }
                ]
            },
            "valid JSON",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
                    }
                ]
            },
            "JSON object",
        ),
    ],
)
def test_requests_the_template_cannot_render(tok, request_body, message):
    with pytest.raises(ChatTemplateError, match=message):
        tok.chat_token_ids(request_body)


def test_no_template_means_no_chat(tmp_path):
    tok = load_tokenizer(build_tokenizer_dir(tmp_path / "t", chat_template=None))
    assert not tok.has_chat_template and tok.encode("Run the tests")
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        tok.chat_token_ids({"messages": [USER]})


# -- encoding -----------------------------------------------------------------------------------


def test_encode_round_trip_and_special_tokens(tok):
    text = "Run the tests, then call the tool: ünïcode ✓ and unseen words xyzzy."
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id and ids[1:] == tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=False) == BOS + text
    assert tok.eos_token_id is not None and tok.vocab_size == 400


def test_chat_ids_carry_one_bos(tok):
    body = {"messages": [SYSTEM, USER]}
    ids = tok.chat_token_ids(body)
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert ids == tok.encode(tok.chat_prompt(body), add_special_tokens=False)
    assert tok.chat_token_ids({"messages": [USER], "input_ids": [5, 6, 7]}) == [5, 6, 7]


def test_next_turn_extends_the_previous_prompt(tok):
    """What prefix caching relies on: turn 2's ids start with turn 1's prompt ids."""
    turn1 = {"messages": [SYSTEM, USER]}
    turn2 = {
        "messages": [SYSTEM, USER, {"role": "assistant", "content": "ran them"}, {"role": "user", "content": "now fix"}]
    }
    ids1, ids2 = tok.chat_token_ids(turn1), tok.chat_token_ids(turn2)
    assert ids2[: len(ids1)] == ids1 and len(ids2) > len(ids1)


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"add_bos_token": False}, lambda t, ids: ids),  # the config turns BOS off
        ({"add_bos_token": True, "add_eos_token": True}, lambda t, ids: [t.bos_token_id, *ids, t.eos_token_id]),
        ({}, lambda t, ids: [t.bos_token_id, *ids]),  # the post-processor decides
    ],
)
def test_add_bos_and_eos_from_the_config(tmp_path, config, expected):
    tok = load_tokenizer(build_tokenizer_dir(tmp_path / "t", **config))
    plain = tok.encode("run the tests", add_special_tokens=False)
    assert tok.encode("run the tests") == expected(tok, plain)


# -- loading errors -------------------------------------------------------------------------------


def test_missing_directory_or_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="nowhere") as err:
        load_tokenizer(tmp_path / "nowhere")
    assert err.value.field == "tokenizer"
    directory = build_tokenizer_dir(tmp_path / "t")
    (directory / "tokenizer_config.json").unlink()
    with pytest.raises(ConfigError, match="tokenizer_config.json.*file not found"):
        load_tokenizer(directory)
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="tokenizer.json.*file not found"):
        load_tokenizer(directory)


def test_a_tokenizer_json_path_finds_its_config_beside_it(tmp_path):
    directory = build_tokenizer_dir(tmp_path / "t")
    assert load_tokenizer(directory / "tokenizer.json").has_chat_template


@pytest.mark.parametrize(
    "file, content, reason",
    [
        ("tokenizer.json", "{not json", "not a tokenizers file"),
        ("tokenizer_config.json", "{not json", "not valid JSON"),
        ("tokenizer_config.json", "[1, 2]", "JSON object"),
        ("tokenizer_config.json", json.dumps({"chat_template": "{% for m in messages %}"}), "syntax error"),
        ("tokenizer_config.json", json.dumps({"chat_template": "{{ x }"}), "syntax error"),
        ("tokenizer_config.json", json.dumps({"chat_template": 5}), "must be a string or a list"),
        (
            "tokenizer_config.json",
            json.dumps({"chat_template": [{"name": "tool_use", "template": "x"}]}),
            "named 'default'",
        ),
    ],
)
def test_malformed_files_are_config_errors(tmp_path, file, content, reason):
    directory = build_tokenizer_dir(tmp_path / "t")
    (directory / file).write_text(content)
    with pytest.raises(ConfigError, match=reason) as err:
        load_tokenizer(directory)
    assert file in str(err.value)


def test_a_template_that_raises_at_render_time_is_a_request_error_not_a_config_error(tmp_path):
    tok = load_tokenizer(build_tokenizer_dir(tmp_path / "t", chat_template="{{ raise_exception('no') }}"))
    with pytest.raises(ChatTemplateError, match="no"):
        tok.chat_prompt({"messages": [USER]})
