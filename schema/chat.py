"""Canonical messages to chat-template form, and rendering them with a tokenizer.

Chat templates (HF `apply_chat_template`, veRL's datasets, vLLM's server) all
consume OpenAI-chat-style dicts. This is the one place that maps the
canonical `Message` model onto them, so the converters and the recorder's
policy-serving mode render the same history the same way:

- system and developer messages -> `role: system` (text parts joined).
- user messages -> `role: user`; `tool_result` parts inside them (Anthropic
  keeps tool results in the user turn) become `role: tool` messages, in order.
- tool messages (Chat / Responses) -> `role: tool` with `tool_call_id`.
- assistant messages -> `content` (text parts joined), `reasoning_content`
  (reasoning parts with text; redacted / encrypted-only reasoning has none),
  `tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]`
  with `arguments` a dict (or, with `arguments="json"`, the JSON string a
  template's `tojson` would write for it: columnar stores cannot hold
  heterogeneous dicts without adding null keys).
- images -> the `<image>` placeholder in the text (veRL's multimodal
  convention); `image_refs` lists their blob hashes in the same order.
- `other` parts (server-tool blocks, unknown items) carry nothing a chat
  template can show and are left out; a message holding only such parts
  (e.g. an opaque item Codex replays first) is left out whole.

Tools: the one mapping onto the chat shape `{"type": T, T: definition}`
(what the template's `tojson` prints), from `Exchange.tools`, where the
codecs keep each definition with every key the harness sent, in its order:

- Chat Completions: the tool verbatim (`function` object and its keys, key
  order and `strict` included; `custom` tools likewise).
- Responses: T is the item's `type`; the definition is the item's other keys
  in order (`{"type": "function", "name", "parameters", "strict"}` becomes
  `{"type": "function", "function": {"name", "parameters", "strict"}}`).
  Built-in tools with no `name` (`web_search`, `local_shell`) get their type
  as a first key `name`.
- Anthropic: T is `function` for client tools (no `type`, or `custom`),
  else the server tool's type (`web_search_20250305`); the definition is
  the tool's keys in order with `input_schema` renamed `parameters` in place,
  less `type` and `cache_control` (a caching directive, not part of the tool).
- Gemini: T is `function` for each entry of `tools[].functionDeclarations`,
  the declaration's keys in order with `parametersJsonSchema` renamed
  `parameters` in place (Gemini CLI sends JSON Schema there); other tools
  (`googleSearch`, `codeExecution`) get T = their key and `name` = it too.

Datasets recorded before the codecs kept definitions whole hold every tool
as `name`, `description`, `parameters`, with null for a key not sent: a null
`description` or `parameters` is read as absent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Literal

from .messages import Message, Part

IMAGE_PLACEHOLDER = "<image>"
_NULL_MEANS_ABSENT = ("description", "parameters")  # tool keys of datasets recorded before tools were kept whole
ArgumentsForm = Literal["dict", "json"]


def _image_ref(part: Part) -> str:
    return part.blob_hash or part.url or ""


def _text_of(parts: Iterable[Part], placeholder: str) -> str:
    """Text and image placeholders of parts, in order (nested tool-result content included)."""
    out: list[str] = []
    for part in parts:
        if part.type == "text":
            out.append(part.text or "")
        elif part.type == "image":
            out.append(placeholder)
        elif part.type == "tool_result":
            out.append(_result_text(part, placeholder))
    return "".join(out)


def _result_text(part: Part, placeholder: str) -> str:
    if part.content is not None:
        return _text_of(part.content, placeholder)
    return part.text or ""


def _arguments(raw: str | None, form: ArgumentsForm) -> Any:
    """A tool call's arguments as a template expects them; text that is not a JSON object stays text."""
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return raw
    if not isinstance(value, dict):
        return raw
    return value if form == "dict" else json.dumps(value, ensure_ascii=False)


def _assistant(message: Message, form: ArgumentsForm, placeholder: str) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": _text_of(message.parts, placeholder)}
    reasoning = [p.text for p in message.parts if p.type == "reasoning" and p.text and not p.redacted]
    if reasoning:
        out["reasoning_content"] = "\n\n".join(reasoning)
    calls = [{"id": p.call_id, "type": "function",
              "function": {"name": p.tool_name, "arguments": _arguments(p.arguments, form)}}
             for p in message.parts if p.type == "tool_call"]
    if calls:
        out["tool_calls"] = calls
    return out


def _user_side(message: Message, placeholder: str) -> Iterator[dict[str, Any]]:
    """A user/tool message: tool results become tool messages, the rest user text, order kept."""
    pending: list[Part] = []

    def flush() -> Iterator[dict[str, Any]]:
        if pending:
            yield {"role": "user", "content": _text_of(pending, placeholder)}
            pending.clear()

    for part in message.parts:
        if part.type == "tool_result":
            yield from flush()
            yield {"role": "tool", "tool_call_id": part.call_id, "content": _result_text(part, placeholder)}
        elif part.type in ("text", "image"):
            pending.append(part)
    if message.role == "user":
        yield from flush()
    elif pending:  # text beside a tool result in a tool message: keep it with the result
        yield {"role": "tool", "tool_call_id": None, "content": _text_of(pending, placeholder)}


def to_chat_messages(messages: list[Message], *, arguments: ArgumentsForm = "dict",
                     image_placeholder: str = IMAGE_PLACEHOLDER) -> list[dict[str, Any]]:
    """Canonical messages as chat-template dicts (HF / veRL / vLLM convention)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.parts and all(p.type == "other" for p in message.parts):
            continue
        if message.role in ("system", "developer"):
            out.append({"role": "system", "content": _text_of(message.parts, image_placeholder)})
        elif message.role == "assistant":
            out.append(_assistant(message, arguments, image_placeholder))
        else:
            out.extend(_user_side(message, image_placeholder))
    return out


def image_parts(messages: list[Message]) -> list[Part]:
    """The image parts, in the order `to_chat_messages` places their placeholders."""
    found: list[Part] = []

    def walk(parts: Iterable[Part]) -> None:
        for part in parts:
            if part.type == "image":
                found.append(part)
            elif part.type == "tool_result" and part.content is not None:
                walk(part.content)

    for message in messages:
        walk(message.parts)
    return found


def image_refs(messages: list[Message]) -> list[str]:
    """Blob hashes (or URLs) of the images, in placeholder order ("" for an image recorded with neither)."""
    return [_image_ref(part) for part in image_parts(messages)]


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The offered tools (`Exchange.tools`, the calls.tools column) in chat shape, by the mapping above."""
    out: list[dict[str, Any]] = []
    for tool in tools or []:
        kind = tool.get("type") or "function"
        out.append({"type": kind, kind: {key: value for key, value in tool.items() if key != "type"
                                         and not (value is None and key in _NULL_MEANS_ABSENT)}})
    return out


@dataclass(frozen=True)
class Rendered:
    text: str
    ids: list[int]


def render(tokenizer: Any, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
           add_generation_prompt: bool = False, enable_thinking: bool | None = None,
           **template_kwargs: Any) -> Rendered:
    """Render chat dicts with the tokenizer's chat template; ids as `apply_chat_template(tokenize=True)` gives."""
    kwargs = dict(template_kwargs)
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    text = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)
    return Rendered(text, tokenizer.encode(text, add_special_tokens=False))


def render_messages(tokenizer: Any, messages: list[Message], *, tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = False, enable_thinking: bool | None = None,
                    **template_kwargs: Any) -> Rendered:
    """`render` straight from canonical messages and the normalised tool list."""
    return render(tokenizer, to_chat_messages(messages), tools=chat_tools(tools) or None,
                  add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking, **template_kwargs)
