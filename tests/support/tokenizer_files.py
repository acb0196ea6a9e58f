"""A small model tokenizer built on the spot (no downloads): a byte-level BPE trained on a few sentences,
saved as `tokenizer.json`, plus a `tokenizer_config.json` with a small Jinja chat template.

    directory = build_tokenizer_dir(tmp_path)          # or the `tokenizer_dir` fixture

The tokenizer adds `<|bos|>` in front of every text it encodes with special tokens (its post-processor),
and the template starts with `{{ bos_token }}`, so a chat prompt that were encoded with special tokens
would carry two BOS tokens: tests can see that it does not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS = "<|bos|>", "<|eos|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>")
SPECIAL_TOKENS = (BOS, EOS, *ROLE_TOKENS)

CORPUS = (
    "You are a coding agent. Run the tests and fix what fails.",
    "The user asked for a summary of the repository and its build steps.",
    "ran step zero: all tests passed, the build is green",
    "call the tool with the arguments, then read its output carefully",
    "def main(): return 0  # the function returns zero",
    "Ba be bi bo bu, ka ke ki ko ku: syllables of generated words.",
)

# Role markers, tool calls as JSON, tools listed in the system turn; raise_exception on unknown roles.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\nTools: {{ tools | tojson }}<|end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% for call in message.get('tool_calls', []) %}"
    "<call>{{ call['function']['name'] }} {{ call['function']['arguments'] | tojson }}</call>"
    "{% endfor %}"
    "<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def build_tokenizer(vocab_size: int = 400, corpus: tuple[str, ...] = CORPUS) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    return tokenizer


def build_tokenizer_dir(
    directory: Path,
    *,
    chat_template: str | list | None = CHAT_TEMPLATE,
    vocab_size: int = 400,
    corpus: tuple[str, ...] = CORPUS,
    **config: object,
) -> Path:
    """Write tokenizer.json and tokenizer_config.json into `directory` (created); extra `config` keys win."""
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer(vocab_size, corpus).save(str(directory / "tokenizer.json"))
    content = {
        "bos_token": BOS,
        "eos_token": {"content": EOS, "special": True},
        "pad_token": None,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
    }
    if chat_template is not None:
        content["chat_template"] = chat_template
    content.update(config)
    (directory / "tokenizer_config.json").write_text(json.dumps(content, indent=2))
    return directory


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """One tokenizer directory for the whole session (building it takes a few milliseconds, but once is enough)."""
    return build_tokenizer_dir(tmp_path_factory.mktemp("tokenizer"))
