"""A model's own tokenizer and chat template, as SGLang applies them: the one copy the router and the
simworker share, so that both turn the same request into the same token ids.

    tok = load_tokenizer("/models/GLM-4.5")        # a directory with tokenizer.json + tokenizer_config.json
    tok.chat_token_ids(body)                       # an OpenAI chat request -> prompt token ids
    tok.encode(text)                               # a /v1/completions or /generate text prompt

Loading (the only I/O, at construction; every problem is a `ConfigError` naming the file):

* `tokenizer.json` is read with the HuggingFace `tokenizers` library (the fast, Rust tokenizer).
* `tokenizer_config.json` gives the special tokens (`bos_token`, `eos_token`, ... as strings or
  `{"content": ...}` objects; `special_tokens_map.json` fills the ones it lacks), `add_bos_token` /
  `add_eos_token`, and `chat_template`: a string, or a list of `{"name", "template"}` of which
  "default" is used (and "tool_use" when the request has tools, as transformers does). A
  `chat_template.jinja` file beside them wins over the config's template (newer transformers save
  it there). No template at all is allowed: `has_chat_template` is False and chat requests raise
  `ChatTemplateError`.

Rendering follows transformers' `apply_chat_template`: a sandboxed `ImmutableSandboxedEnvironment`
with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` tag that
renders its body, a `tojson` filter that does not escape HTML, and the globals `raise_exception` and
`strftime_now`; it is called with `messages`, `tools`, `documents`, `add_generation_prompt` and the
special tokens, then any template kwargs.

`chat_token_ids` applies SGLang's preprocessing of an OpenAI chat request before that
(`serving_chat._apply_jinja_template`): null content becomes "", a list of parts is flattened to
its text parts joined by one space (or kept as a list of parts when the template iterates over
`message.content`), keys whose value is null are dropped, an assistant's `tool_calls[].function.arguments`
JSON string becomes an object, a trailing assistant message is either continued
(`continue_final_message`: its text is appended after the generation prompt) or turned into a user
message, `tools` are passed unless `tool_choice` is "none" (only the named one for a named choice),
`reasoning_effort` and `chat_template_kwargs` become template kwargs, and the generation prompt is
always added. The rendered text is then encoded without adding special tokens (the template holds
them), so a BOS is never added twice. What is not reproduced: SGLang validates the request with
pydantic first, so a template that prints a whole message or tool with `tojson` sees its default
fields there and not here; multimodal parts are reduced to their type.

`encode(text)` adds special tokens as the model's tokenizer does: `add_bos_token` / `add_eos_token`
when the config sets either (transformers rebuilds the post-processor from them), else the
`tokenizer.json` post-processor.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from services.common.settings.errors import ConfigError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Template content formats (SGLang's names): message content as one string, or as a list of parts.
CONTENT_STRING = "string"
CONTENT_PARTS = "openai"


class ChatTemplateError(ValueError):
    """A chat request the template cannot render (the template raised, or the messages are malformed)."""


# -- the Jinja environment --------------------------------------------------------------------------


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers marks assistant text with it): the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; chat templates want the plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _iterates_content(node: jinja2.nodes.Node) -> bool:
    """`message['content']`, `message.content` (or msg/m), possibly filtered or sliced."""
    while isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)) or (
        isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)
    ):
        inner = node.node
        if inner is None:
            return False
        node = inner
    if isinstance(node, jinja2.nodes.Getitem):
        key = node.arg.value if isinstance(node.arg, jinja2.nodes.Const) else None
    elif isinstance(node, jinja2.nodes.Getattr):
        key = node.attr
    else:
        return False
    return key == "content" and isinstance(node.node, jinja2.nodes.Name) and node.node.name in ("message", "msg", "m")


def content_format(env: jinja2.Environment, source: str) -> str:
    """SGLang's detection: a template that loops over a message's content takes a list of parts."""
    if any(word in source for word in ("image", "audio", "video", "vision")):
        return CONTENT_PARTS
    ast = env.parse(source)
    return (
        CONTENT_PARTS
        if any(_iterates_content(loop.iter) for loop in ast.find_all(jinja2.nodes.For))
        else CONTENT_STRING
    )


# -- loading ----------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("tokenizer", str(path), "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("tokenizer", str(path), f"cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError("tokenizer", str(path), f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise ConfigError("tokenizer", str(path), "must hold a JSON object")
    return raw


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _templates(config: Mapping[str, Any], template_file: Path | None, config_path: Path) -> dict[str, str]:
    if template_file is not None and template_file.is_file():
        try:
            return {"default": template_file.read_text(encoding="utf-8")}
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("tokenizer", str(template_file), f"cannot read it ({exc})") from None
    raw = config.get("chat_template")
    if raw is None:
        return {}
    if isinstance(raw, str):
        return {"default": raw}
    if isinstance(raw, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in raw
    ):
        named = {t["name"]: t["template"] for t in raw}
        if "default" not in named:
            raise ConfigError(
                "tokenizer",
                f"{config_path}:chat_template",
                f"a list of templates needs one named 'default' (has {', '.join(sorted(named))})",
            )
        return named
    raise ConfigError(
        "tokenizer", f"{config_path}:chat_template", "must be a string or a list of {name, template} objects"
    )


def load_tokenizer(path: str | Path) -> "ModelTokenizer":
    """The tokenizer in directory `path` (or of the `tokenizer.json` file `path`, with its config beside it)."""
    location = Path(path).expanduser()
    if location.is_dir():
        directory, tokenizer_file = location, location / TOKENIZER_FILE
    elif location.name.endswith(".json") and location.exists():
        directory, tokenizer_file = location.parent, location
    else:
        raise ConfigError("tokenizer", str(path), f"not a directory holding {TOKENIZER_FILE} and {CONFIG_FILE}")
    return ModelTokenizer.from_files(
        tokenizer_file,
        directory / CONFIG_FILE,
        special_tokens_file=directory / SPECIAL_TOKENS_FILE,
        template_file=directory / TEMPLATE_FILE,
    )


class ModelTokenizer:
    """A loaded tokenizer and chat template. Pure after construction; safe to share between threads."""

    def __init__(
        self, tokenizer: Tokenizer, config: Mapping[str, Any], templates: Mapping[str, str], *, source: str = ""
    ) -> None:
        """`templates` maps template names to Jinja sources ("default" first); raises ConfigError
        naming `source` for a template that does not compile."""
        self.source = source
        self._tokenizer = tokenizer
        self._encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        self.special_tokens: dict[str, Any] = {}
        for key in SPECIAL_TOKEN_KEYS:
            text = _token_text(config.get(key))
            if text is not None:
                self.special_tokens[key] = text
        extra = config.get("additional_special_tokens")
        if isinstance(extra, list):
            self.special_tokens["additional_special_tokens"] = [t for t in map(_token_text, extra) if t is not None]
        self.bos_token_id = self._id_of(self.special_tokens.get("bos_token"))
        self.eos_token_id = self._id_of(self.special_tokens.get("eos_token"))
        add_bos, add_eos = config.get("add_bos_token"), config.get("add_eos_token")
        # None = the tokenizer.json post-processor decides; else (add BOS, add EOS) as the config says.
        self._specials: tuple[bool, bool] | None = None
        if isinstance(add_bos, bool) or isinstance(add_eos, bool):
            self._specials = (
                add_bos is True and self.bos_token_id is not None,
                add_eos is True and self.eos_token_id is not None,
            )
        env = _environment()
        self._templates: dict[str, jinja2.Template] = {}
        self._formats: dict[str, str] = {}
        for name, text in templates.items():
            where = f"{source}:chat_template" + ("" if name == "default" else f"[{name}]")
            try:
                self._templates[name] = env.from_string(text)
                self._formats[name] = content_format(env, text)
            except jinja2.TemplateSyntaxError as exc:
                raise ConfigError(
                    "tokenizer", where, f"template syntax error at line {exc.lineno}: {exc.message}"
                ) from None

    @classmethod
    def from_files(
        cls,
        tokenizer_file: str | Path,
        config_file: str | Path,
        *,
        special_tokens_file: str | Path | None = None,
        template_file: str | Path | None = None,
    ) -> "ModelTokenizer":
        tokenizer_path, config_path = Path(tokenizer_file), Path(config_file)
        if not tokenizer_path.is_file():
            raise ConfigError("tokenizer", str(tokenizer_path), "file not found")
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # the Rust side raises a bare Exception for every kind of problem
            raise ConfigError("tokenizer", str(tokenizer_path), f"not a tokenizers file ({exc})") from None
        config = _read_json(config_path)
        if special_tokens_file is not None and Path(special_tokens_file).is_file():
            for key, value in _read_json(Path(special_tokens_file)).items():
                config.setdefault(key, value)
        templates = _templates(config, Path(template_file) if template_file else None, config_path)
        return cls(tokenizer, config, templates, source=str(config_path))

    # -- tokens -------------------------------------------------------------------------------

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tokenizer.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def _ids(self, text: str, add_special_tokens: bool) -> list[int]:
        # The batch call releases the GIL while the Rust side works (`encode` holds it): a caller may run
        # a long prompt on a thread without stalling the others. `_fast` skips the character offsets.
        return self._encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens as the model's tokenizer adds them (see the module doc).
        Releases the GIL while it tokenizes."""
        if self._specials is None or not add_special_tokens:
            return self._ids(text, add_special_tokens)
        ids = self._ids(text, False)
        add_bos, add_eos = self._specials
        if add_bos and self.bos_token_id is not None:  # (add_bos: the model has one)
            ids.insert(0, self.bos_token_id)
        if add_eos and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # -- chat -------------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return bool(self._templates)

    def _template_name(self, tools: Any) -> str:
        if not self._templates:
            raise ChatTemplateError(f"{self.source} has no chat_template")
        return "tool_use" if tools is not None and "tool_use" in self._templates else "default"

    def content_format(self, tools: Any = None) -> str:
        return self._formats[self._template_name(tools)]

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        documents: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The template applied to `messages` as they are (transformers' `apply_chat_template(...,
        tokenize=False)`). Raises ChatTemplateError when the template raises or cannot render them."""
        template = self._templates[self._template_name(tools)]
        kwargs = {**self.special_tokens, **template_kwargs}
        try:
            return template.render(
                messages=messages,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ChatTemplateError(f"chat template: {exc}") from None

    def chat_prompt(self, request: Mapping[str, Any]) -> str:
        """The prompt text SGLang renders for OpenAI chat request `request` (see the module doc)."""
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ChatTemplateError("messages must be a non-empty list")
        tools = _request_tools(request)
        fmt = self.content_format(tools)
        processed = [_message_for_template(m, i, fmt) for i, m in enumerate(messages)]
        prefix = None
        last = processed[-1]
        if last.get("role") == "assistant" and isinstance(last.get("content"), str):
            if request.get("continue_final_message"):
                prefix = last["content"]
                processed.pop()
            else:
                processed[-1] = {"role": "user", "content": last["content"]}
        kwargs: dict[str, Any] = {}
        if request.get("reasoning_effort") is not None:
            kwargs["reasoning_effort"] = request["reasoning_effort"]
        extra = request.get("chat_template_kwargs")
        if isinstance(extra, dict):
            kwargs.update(extra)
        try:
            rendered = self.render_chat(processed, tools=tools, add_generation_prompt=True, **kwargs)
        except ChatTemplateError:
            if not tools:
                raise
            # SGLang retries with bare function schemas (some templates, e.g. Mistral's, expect them).
            flat = [t["function"] if isinstance(t, dict) and "function" in t else t for t in tools]
            rendered = self.render_chat(processed, tools=flat, add_generation_prompt=True, **kwargs)
        return rendered + (prefix or "")

    def chat_token_ids(self, request: Mapping[str, Any]) -> list[int]:
        """Prompt token ids of OpenAI chat request `request`, as SGLang computes them."""
        ids = request.get("input_ids")
        if isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return list(ids)  # SGLang's extension: the caller tokenized already
        return self.encode(self.chat_prompt(request), add_special_tokens=False)


def _request_tools(request: Mapping[str, Any]) -> list | None:
    tools = request.get("tools")
    choice = request.get("tool_choice")
    if not tools or not isinstance(tools, list) or choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        return [t for t in tools if isinstance(t, dict) and (t.get("function") or {}).get("name") == name]
    return list(tools)


def _message_for_template(message: Any, index: int, fmt: str) -> dict:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ChatTemplateError(f"messages[{index}] must be an object with a string role")
    msg = dict(message)
    if msg.get("role") == "assistant" and isinstance(msg.get("tool_calls"), list):
        msg["tool_calls"] = [_tool_call_for_template(call, index) for call in msg["tool_calls"]]
    content = msg.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):
        content = _parts_for_template(content, fmt)
    if (
        msg["role"] == "tool"
        and isinstance(content, list)
        and all(isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text") for p in content)
    ):
        content = " ".join(p if isinstance(p, str) else p.get("text", "") for p in content)
    msg["content"] = content
    return {k: v for k, v in msg.items() if v is not None}


def _tool_call_for_template(call: Any, index: int) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        raise ChatTemplateError(f"messages[{index}]: tool call function.arguments must be valid JSON") from None
    if not isinstance(arguments, dict):
        raise ChatTemplateError(f"messages[{index}]: tool call function.arguments must be a JSON object")
    return {**call, "function": {**function, "arguments": arguments}}


_MEDIA_PARTS = {"image_url": "image", "input_image": "image", "video_url": "video", "audio_url": "audio"}


def _parts_for_template(parts: list, fmt: str) -> str | list:
    if fmt == CONTENT_STRING:
        return " ".join(
            p["text"] for p in parts if isinstance(p, dict) and p.get("type") in ("text", "input_text") and "text" in p
        )
    out: list = []
    for part in parts:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("text", "input_text"):
            out.append({"type": "text", "text": part.get("text")})
        elif kind in _MEDIA_PARTS:
            out.append({"type": _MEDIA_PARTS[kind]})
        elif kind == "tool_reference":
            out.append(part)
    return out
