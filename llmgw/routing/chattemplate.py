"""A model's chat template, rendered as the engines render it (transformers' apply_chat_template, vLLM's).

The template is the model's chat_template.jinja or, where it has none,
tokenizer_config.json's `chat_template` (a string, or a list of named templates
of which `default` is taken). It is rendered with jinja2 as transformers does: a
sandboxed environment that cannot change its arguments, trim_blocks and
lstrip_blocks, the loop controls, a `{% generation %}` block (rendered as its
body: transformers uses it to find the assistant's tokens), a `tojson` that
leaves non-ASCII as it is, the globals `raise_exception` (a TemplateError: vLLM
answers 400) and `strftime_now`; its variables are `messages`, `tools`,
`documents`, `add_generation_prompt` (a chat request's own, else true, as vLLM's
default), the tokenizer's special tokens (`bos_token`,
`eos_token`, ... as tokenizer_config.json, else special_tokens_map.json, names them) and a request's
`chat_template_kwargs`. A message's content given as text parts is their texts
joined by newlines (vLLM's "string" content format). With the request's
`continue_final_message` the text ends where the last message's content does, as
transformers cuts it (the assistant goes on with that message). The text is then tokenized
without adding special tokens (vLLM's chat default): the template wrote them.
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                  "additional_special_tokens")


def _token(value: Any) -> Any:
    """A special token as tokenizer_config.json writes it: its text, or an AddedToken's {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    if isinstance(value, list):
        return [_token(v) for v in value]
    return value


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return time.strftime(fmt)


def _content(message: Any) -> Any:
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    texts = [part.get("text", "") for part in message["content"] if isinstance(part, dict)]
    return {**message, "content": "\n".join(t for t in texts if isinstance(t, str))}


class ChatTemplate:
    def __init__(self, source: str, special_tokens: Mapping[str, Any] | None = None):
        """ValueError where `source` is not a template jinja2 can compile."""
        import jinja2  # only where a model has a template: every llmgw command imports kvblocks
        import jinja2.ext
        import jinja2.sandbox

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        class Generation(jinja2.ext.Extension):
            tags = {"generation"}

            def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
                next(parser.stream)
                return parser.parse_statements(("name:endgeneration",), drop_needle=True)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=[jinja2.ext.loopcontrols, Generation])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._error = jinja2.TemplateError
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template does not compile: {e}") from e
        self.special = {k: _token(v) for k, v in (special_tokens or {}).items() if k in SPECIAL_TOKENS and v}

    def render(self, doc: Mapping[str, Any]) -> str:
        """A chat request's prompt text (`doc`: its body); ValueError where the template refuses it."""
        extra = doc.get("chat_template_kwargs")
        generation = doc.get("add_generation_prompt", True)
        messages = [_content(m) for m in doc.get("messages") or ()]
        try:
            text = self._template.render(
                **self.special, **(extra if isinstance(extra, dict) else {}), messages=messages,
                tools=doc.get("tools"), documents=doc.get("documents"),
                add_generation_prompt=generation if isinstance(generation, bool) else True)
        except self._error as e:
            raise ValueError(f"the chat template refused the messages: {e}") from e
        except TypeError as e:  # a template that treats a message's fields as other types than given
            raise ValueError(f"the chat template could not render the messages: {e}") from e
        last = messages[-1].get("content") if doc.get("continue_final_message") is True and messages and \
            isinstance(messages[-1], dict) else None
        if isinstance(last, str):
            for end in (last, last.strip()):
                if end in text:
                    return text[:text.rindex(end) + len(end)]
            raise ValueError("continue_final_message is set but the final message does not appear in the chat "
                             "after applying the chat template")
        return text


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON: {e}") from e
    return loaded if isinstance(loaded, dict) else {}


def load_chat_template(directory: str | Path | None) -> ChatTemplate | None:
    """The chat template of the model in `directory`, if it has one; ValueError when it is malformed."""
    if not directory:
        return None
    config = {**_json(Path(directory, "special_tokens_map.json")), **_json(Path(directory, "tokenizer_config.json"))}
    jinja_path = Path(directory, "chat_template.jinja")
    source = jinja_path.read_text() if jinja_path.is_file() else config.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(source, str):
        return None
    try:
        return ChatTemplate(source, config)
    except ValueError as e:
        raise ValueError(f"{directory}: {e}") from None
