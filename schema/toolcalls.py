"""Parse what a policy generated into reasoning, text and tool calls.

A chat model writes its turn as plain text in its template's conventions;
the harness needs structured blocks. `parse_generation` splits a completion
(special tokens kept, end-of-turn token removed) the way the template wrote
earlier turns, so that rendering the parsed message again gives back the
same text. Qwen3 / Hermes style (the default):

    <think>\\nREASONING\\n</think>\\n\\nTEXT\\n<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>

A `<tool_call>` body that is not a JSON object with a string `name` stays in
the text (the harness sees what the model wrote, and the turn has no call).
`ToolCallFormat` holds the tags, so another template family is a new instance.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .messages import Message, Part


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    think_open: str = "<think>"
    think_close: str = "</think>"
    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"


HERMES = ToolCallFormat("hermes")
"""Qwen2.5 / Qwen3 / Hermes: `<think>` reasoning and `<tool_call>` JSON blocks."""

FORMATS = {HERMES.name: HERMES}


def format_for_template(chat_template: str | None) -> ToolCallFormat:
    """The format a chat template writes tool calls in; refuses templates it does not know."""
    if chat_template and HERMES.call_open in chat_template:
        return HERMES
    raise ValueError("the tokenizer's chat template has no known tool-call format (expected <tool_call> blocks)")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ParsedTurn:
    reasoning: str | None
    text: str
    tool_calls: tuple[ToolCall, ...]

    def message(self, call_ids: list[str]) -> Message:
        """The canonical assistant message; `call_ids` names the calls in order."""
        parts: list[Part] = []
        if self.reasoning is not None:
            parts.append(Part("reasoning", text=self.reasoning))
        if self.text:
            parts.append(Part("text", text=self.text))
        for call, call_id in zip(self.tool_calls, call_ids, strict=True):
            parts.append(Part("tool_call", tool_name=call.name, call_id=call_id, arguments=call.arguments_json()))
        return Message("assistant", tuple(parts))


def parse_generation(text: str, fmt: ToolCallFormat = HERMES) -> ParsedTurn:
    """Split one generated turn (without its end-of-turn token)."""
    reasoning = None
    body = text
    stripped = body.lstrip("\n")
    if stripped.startswith(fmt.think_open) and fmt.think_close in stripped:
        inner, _, body = stripped[len(fmt.think_open):].partition(fmt.think_close)
        reasoning = inner.strip("\n")
        body = body.lstrip("\n")
    elif fmt.think_close in body:  # templates that open <think> in the prompt: the model writes only the close
        inner, _, body = body.partition(fmt.think_close)
        reasoning = inner.strip("\n")
        body = body.lstrip("\n")
    calls: list[ToolCall] = []
    kept: list[str] = []
    pattern = re.compile(re.escape(fmt.call_open) + r"(.*?)" + re.escape(fmt.call_close), re.DOTALL)
    position = 0
    for match in pattern.finditer(body):
        call = _tool_call(match.group(1))
        if call is None:
            continue
        kept.append(body[position:match.start()])
        calls.append(call)
        position = match.end()
    kept.append(body[position:])
    content = "".join(kept).strip("\n") if calls else body.rstrip("\n")
    return ParsedTurn(reasoning=reasoning, text=content, tool_calls=tuple(calls))


def _tool_call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], arguments)
