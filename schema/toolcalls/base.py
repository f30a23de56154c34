"""What every tool-call format shares: the parsed turn, the format interface, and the one turn parser.

A chat model writes its turn as plain text in its template's conventions;
the harness needs structured blocks. `TurnParser` splits a generated turn
(special tokens kept, end-of-turn token removed) into reasoning, text and
tool calls as the text arrives, so serve mode can stream it; the parse of a
whole text is the same parser fed once (`parse_generation`), so a streamed
turn and a parsed one never differ.

A format (one module each: `hermes`, `qwen3_coder`, `glm45`) says only what
differs between template families: the tags around reasoning and around one
call, how a call's body reads, and how to recognise its chat template. A call
whose body does not read (bad JSON, unknown shape, cut off at the token
limit) stays text, exactly as generated, and is counted in `malformed`.

Layout rules (what the templates write, so a parsed turn renders back as it
was generated): newlines just inside the reasoning tags, between the
reasoning and the text, around and between calls, and at the end of the
text are the template's, not the model's words, and are dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..messages import Message, Part


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
    malformed: int = 0  # call-shaped spans that did not read as a call and stayed text

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


Schemas = Mapping[str, Mapping[str, Any]]
"""Tool name -> its parameters' JSON-schema `properties` (what typed formats read values with)."""


class ToolCallFormat:
    """One template family's conventions. Subclasses set the tags and implement `read_call` and `writes`."""

    name: str = ""
    think_open: str = "<think>"
    think_close: str = "</think>"
    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"

    def read_call(self, body: str, schemas: Schemas) -> ToolCall | None:
        """The call between `call_open` and `call_close`, or None when it does not read as one."""
        raise NotImplementedError

    def writes(self, chat_template: str) -> bool:
        """Whether `chat_template` writes tool calls in this format."""
        raise NotImplementedError


def tool_schemas(tools: list[dict[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """`Schemas` from chat-shaped tools (`{"type": "function", "function": {...}}`, as `schema.chat` makes them)."""
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools or ():
        definition = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        parameters = definition.get("parameters") if isinstance(definition, dict) else None
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        if isinstance(definition.get("name"), str) and isinstance(properties, dict):
            out[definition["name"]] = properties
    return out


_PYTHON_SPELLINGS = {"True": True, "False": False, "None": None}  # what a template's `| string` writes


def typed_value(raw: str, schema: Mapping[str, Any] | None) -> tuple[bool, Any]:
    """One XML-style argument value (templates write strings raw and other values as JSON) read by its schema
    type: (ok, value). A parameter with no schema, or typed string, keeps the text: reading "5" as a number
    there would be a guess."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True, raw
    if raw in _PYTHON_SPELLINGS:
        return True, _PYTHON_SPELLINGS[raw]
    try:
        return True, json.loads(raw)
    except json.JSONDecodeError:
        return False, None


def read_elements(name: str, text: str, element: re.Pattern[str], schemas: Schemas) -> ToolCall | None:
    """A call whose arguments are key/value elements (`element` matches one: groups key and raw value) with
    nothing but whitespace around them, each value read by its schema type; None if anything else is there."""
    properties = schemas.get(name, {})
    arguments = {}
    at = 0
    for match in element.finditer(text):
        if text[at:match.start()].strip():
            return None
        ok, value = typed_value(match.group(2), properties.get(match.group(1)))
        if not ok:
            return None
        arguments[match.group(1)] = value
        at = match.end()
    return None if text[at:].strip() else ToolCall(name, arguments)


# States that only skip newlines (after the reasoning's opening tag; after its close or a call), and the next.
_LAYOUT = {"reasoning_lead": "reasoning", "after_tag": "text"}


class TurnParser:
    """Splits a turn into reasoning, text and calls as its text arrives.

    `feed(text)` and `finish()` return events, in order: ("reasoning", piece),
    ("text", piece), ("call", ToolCall). A reasoning block is announced by a
    ("reasoning", "") event when it opens, so an empty one still shows. Text
    that might still turn into a tag (a trailing "<tool", trailing newlines)
    is held back until the next piece decides it. `turn()` is everything said.
    `in_reasoning`: the prompt opened the reasoning block (templates that end the
    generation prompt with `<think>`), so the model writes only its close.
    """

    def __init__(self, fmt: ToolCallFormat, tools: list[dict[str, Any]] | None = None, in_reasoning: bool = False):
        self.fmt = fmt
        self.schemas = tool_schemas(tools)
        self._state = "reasoning" if in_reasoning else "start"
        self._buffer = ""
        self._reasoning: list[str] | None = None
        self._text: list[str] = []
        self._calls: list[ToolCall] = []
        self._malformed = 0
        self._held_newlines = ""  # newlines at the end of the text so far: said only if more text follows
        self._held_reasoning = ""
        self._before_call = ""
        self._events: list[tuple[str, Any]] = []
        self.finished = False
        if in_reasoning:
            self._open_reasoning()

    # -- events -----------------------------------------------------------------
    def feed(self, text: str) -> list[tuple[str, Any]]:
        self._buffer += text
        self._run(final=False)
        return self._take()

    def finish(self) -> list[tuple[str, Any]]:
        self._run(final=True)
        self.finished = True
        return self._take()

    def turn(self) -> ParsedTurn:
        reasoning = None if self._reasoning is None else "".join(self._reasoning)
        return ParsedTurn(reasoning, "".join(self._text), tuple(self._calls), self._malformed)

    def _take(self) -> list[tuple[str, Any]]:
        events, self._events = self._events, []
        return events

    def _open_reasoning(self) -> None:
        self._reasoning = []
        self._events.append(("reasoning", ""))

    def _say_reasoning(self, piece: str) -> None:
        self._held_reasoning = self._say(piece, self._held_reasoning, self._reasoning, "reasoning")

    def _say_text(self, piece: str) -> None:
        self._held_newlines = self._say(piece, self._held_newlines, self._text, "text")

    def _say(self, piece: str, held: str, said: list[str], kind: str) -> str:
        """Say `piece` less its trailing newlines, which are held (and returned) until more words follow."""
        body = piece.rstrip("\n")
        if body:
            said.append(held + body)
            self._events.append((kind, held + body))
            held = ""
        return held + piece[len(body):]

    # -- the state machine -------------------------------------------------------
    def _run(self, final: bool) -> None:
        while True:
            before = (self._state, len(self._buffer))
            if self._state in _LAYOUT:  # newlines here are the template's: skip them, then go on
                self._buffer = self._buffer.lstrip("\n")
                if self._buffer or final:
                    self._state = _LAYOUT[self._state]
            else:
                getattr(self, f"_in_{self._state}")(final)
            if (self._state, len(self._buffer)) == before:
                return

    def _in_start(self, final: bool) -> None:
        """Before anything is said: a reasoning block may open (after blank lines)."""
        stripped = self._buffer.lstrip("\n")
        opening = self.fmt.think_open
        if stripped.startswith(opening):
            self._buffer = stripped[len(opening):]
            self._open_reasoning()
            self._state = "reasoning_lead"
        elif not final and opening.startswith(stripped):
            return  # still might become the opening tag
        else:
            self._state = "text"

    def _in_reasoning(self, final: bool) -> None:
        close = self.fmt.think_close
        at = self._buffer.find(close)
        if at >= 0:
            self._say_reasoning(self._buffer[:at])
            self._held_reasoning = ""  # newlines before the close tag are the template's
            self._buffer = self._buffer[at + len(close):]
            self._state = "after_tag"
        elif final:  # cut off while reasoning: what was said is the reasoning
            self._say_reasoning(self._buffer)
            self._buffer = ""
        else:
            keep = _partial_suffix(self._buffer, close)
            self._say_reasoning(self._buffer[:len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]

    def _in_text(self, final: bool) -> None:
        opening = self.fmt.call_open
        at = self._buffer.find(opening)
        if at >= 0:
            self._say_text(self._buffer[:at])
            self._before_call, self._held_newlines = self._held_newlines, ""  # the template's, if a call follows
            self._buffer = self._buffer[at:]
            self._state = "call"
            return
        keep = 0 if final else _partial_suffix(self._buffer, opening)
        self._say_text(self._buffer[:len(self._buffer) - keep])
        self._buffer = self._buffer[len(self._buffer) - keep:]

    def _in_call(self, final: bool) -> None:
        close = self.fmt.call_close
        at = self._buffer.find(close, len(self.fmt.call_open))
        if at < 0 and not final:
            return
        whole = self._buffer if at < 0 else self._buffer[:at + len(close)]
        self._buffer = self._buffer[len(whole):]
        call = None if at < 0 else self.fmt.read_call(whole[len(self.fmt.call_open):-len(close)], self.schemas)
        if call is None:  # unreadable, or cut off at the token limit: it stays what it was, text
            self._malformed += 1
            self._held_newlines = self._before_call
            self._say_text(whole)
            self._state = "text"
        else:
            self._calls.append(call)
            self._events.append(("call", call))
            self._state = "after_tag"


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag` (it may yet become the tag)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def parse_text(text: str, fmt: ToolCallFormat, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
    """Split one whole generated turn (without its end-of-turn token). A close tag with no opening tag before
    it means the prompt opened the reasoning block."""
    opened = fmt.think_close in text and not text.lstrip("\n").startswith(fmt.think_open)
    parser = TurnParser(fmt, tools, in_reasoning=opened)
    parser.feed(text)
    parser.finish()
    return parser.turn()
