"""OpenAI Responses (`POST /v1/responses`): requests to canonical messages and back, and streams.

Codex CLI and OpenClaw speak it. The body's `input` is a string or a list of
items; items map to messages as follows (keys no part field holds stay in
`Part.extra`, message-level keys in `Message.extra`):

- `instructions` → a leading "system" message with hint `instructions`;
  a string `input` → one "user" message with hint `input_string`.
- message items (with `"type": "message"` or without a type) → a message of
  their role. Content: input_text / output_text → text (the wire type rides
  in extra only when it is not the role's default, output_text for the
  assistant and input_text otherwise), input_image → image (data URLs to
  blobs), anything else → other.
- A run of consecutive assistant-side items (assistant messages, reasoning,
  tool calls, web_search_call, ...) becomes ONE assistant message, as a turn
  is in the other APIs; hint `items` records how its parts split back into
  items (`{"kind": "message", "parts": n, "keys": ..., "hints": ...}` or
  `{"kind": "item"}`).
- reasoning → reasoning part: `signature` = encrypted_content; `text` = the
  raw reasoning_text content when present (gpt-oss on vLLM), else the summary
  texts, joined by blank lines; summary, content and id stay in extra.
- function_call, custom_tool_call (arguments = its free-form `input`), and
  local_shell_call / shell_call / apply_patch_call (arguments = the action or
  operation object as JSON, tool name = the type without "_call") → tool_call;
  the wire type stays in extra unless it is function_call.
- items whose type ends in `_output` → a "tool" message holding one
  tool_result part (string output → text, list → content; is_error None).
- anything else → an other part holding the whole item.

`Exchange.tools`: the body's `tools`, then the tools of `additional_tools`
input items (Codex 0.171 sends its namespaces there; the item itself stays
in the input as an other part).

`parse_response` reads the response's `output` the same way; its stop reason
is `incomplete_details.reason` when there is one, else the response status.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from forgerl.recorder.apis.answer import Answer, Frame, Pieces, chunks, replay
from forgerl.recorder.apis.common import (HINTS, BlockOf, Fragments, PartOf, StreamState, block, describe_error,
                                          dict_list, dump_arguments, error_of, image_part, image_url, join_message,
                                          message_extra, openai_usage, params_without, render_openai_usage,
                                          split_extra, split_message, take, tool_spec)
from forgerl.recorder.policy_tokens import TOKENS_KEY, read_token_extension, token_extension
from forgerl.recorder.sse import SSEEvent
from forgerl.schema.messages import Exchange, Message, Part
from forgerl.schema.toolcalls import ToolCall

_ROLES = ("user", "assistant", "system", "developer")


@dataclass(frozen=True)
class _Call:
    """Where a tool-call item keeps its arguments and tool name."""

    arguments: str
    name: str | None = "name"  # None: the item type names the tool
    as_json: bool = False  # the arguments are an object, carried as JSON text


_CALLS = {
    "function_call": _Call("arguments"),
    "custom_tool_call": _Call("input"),
    "local_shell_call": _Call("action", None, True),
    "shell_call": _Call("action", None, True),
    "apply_patch_call": _Call("operation", None, True),
}
_CALL_ID_KEY = {"local_shell_call_output": "id"}  # tool outputs name the call by `call_id`, except these
# Codex 0.171 offers an MCP server's tools in a namespace `mcp__SERVER` and runs a call only when it names the
# namespace and the tool apart: a call to `mcp__SERVER__TOOL` (as models name MCP tools) is written that way.
MCP_NAMESPACE = "mcp__"


class ResponsesCodec:
    name = "responses"

    def parse_request(self, body: dict[str, Any]) -> Exchange:
        exchange = Exchange(model_requested=body.get("model"))
        moved = []
        if isinstance(body.get("instructions"), str):
            moved.append("instructions")
            exchange.input.append(_text_message("system", body["instructions"], "instructions"))
        items = dict_list(body.get("input"))
        if isinstance(body.get("input"), str):
            moved.append("input")
            exchange.input.append(_text_message("user", body["input"], "input_string"))
        elif items is not None:
            moved.append("input")
            exchange.input.extend(_read_items(items, exchange.blobs))
        exchange.params = params_without(body, moved)
        exchange.tools = [_tool(tool) for tool in _offered_tools(body, items)]
        return exchange

    def render_request(self, exchange: Exchange, blobs: Mapping[str, bytes]) -> dict[str, Any]:
        body = dict(exchange.params)
        items: list[dict[str, Any]] = []
        for message in exchange.input:
            hints = split_extra(message.extra)[1]
            if hints.get("instructions"):
                body["instructions"] = message.text()
            elif hints.get("input_string"):
                body["input"] = message.text()
            else:
                items.extend(_write_items(message, blobs))
        if items:
            body["input"] = items
        return body

    def new_stream(self) -> ResponsesStream:
        return ResponsesStream()

    def parse_response(self, body: dict[str, Any], exchange: Exchange) -> None:
        exchange.error = error_of(body)
        exchange.model_returned = body.get("model")
        exchange.usage = openai_usage(body.get("usage"), "input_tokens", "output_tokens")
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        exchange.stop_reason = reason or body.get("status")
        exchange.output = _read_items(dict_list(body.get("output")) or [], exchange.blobs)
        read_token_extension(body, exchange)

    def render_response(self, answer: Answer, request: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of `parse_response`: the answer as a `response` object. Reasoning is a reasoning
        item whose summary holds it (as OpenAI's models say theirs), the signature as encrypted_content;
        the request's settings are echoed, as the API does."""
        return _response(answer, request, "incomplete" if answer.truncated else "completed", _answer_items(answer))

    def render_stream(self, answer: Answer, request: Mapping[str, Any], pieces: Pieces = chunks) -> Iterator[Frame]:
        """The inverse of `ResponsesStream` (see `ResponsesWriter`)."""
        return replay(self.stream_writer(answer, request), answer, pieces)

    def stream_writer(self, head: Answer, request: Mapping[str, Any]) -> ResponsesWriter:
        return ResponsesWriter(head, request)


class ResponsesWriter:
    """A Responses stream: created, in_progress, per item its added event, its parts and text deltas and done
    events, then the terminal event with the whole response; a failure is `response.failed`. Each frame is
    also what the Responses WebSocket sends as one text message."""

    def __init__(self, head: Answer, request: Mapping[str, Any]):
        self.head, self.request = head, request
        self._numbers = itertools.count()
        self._index = -1
        self._item: dict[str, Any] | None = None  # the item being written
        self._said: list[str] = []

    def start(self) -> list[Frame]:
        shell = _response(self.head, self.request, "in_progress", [])
        return [self._event("created", response=shell), self._event("in_progress", response=shell)]

    def reasoning(self, piece: str) -> list[Frame]:
        frames = []
        if self._item is None or self._item["type"] != "reasoning":
            frames = self._add(_reasoning_item(self.head, ""))
            frames.append(self._event("reasoning_summary_part.added", **self._at(), summary_index=0,
                                      part={"type": "summary_text", "text": ""}))
        if piece:
            self._said.append(piece)
            frames.append(self._event("reasoning_summary_text.delta", True, **self._at(), summary_index=0,
                                      delta=piece))
        return frames

    def text(self, piece: str) -> list[Frame]:
        if not piece:
            return []
        frames = []
        if self._item is None or self._item["type"] != "message":
            frames = self._add(_message_item(self.head, ""))
            frames.append(self._event("content_part.added", **self._at(), content_index=0, part=_output_text("")))
        self._said.append(piece)
        frames.append(self._event("output_text.delta", True, **self._at(), content_index=0, delta=piece, logprobs=[]))
        return frames

    def tool_call(self, call_id: str, call: ToolCall, pieces: Pieces) -> list[Frame]:
        item = _function_call_item(call_id, call)
        frames = self._add(item)
        frames.extend(self._event("function_call_arguments.delta", True, **self._at(), delta=piece)
                      for piece in pieces(item["arguments"]))
        frames.append(self._event("function_call_arguments.done", **self._at(), name=item["name"],
                                  arguments=item["arguments"]))
        return frames + self._done()

    def finish(self, answer: Answer) -> list[Frame]:
        status = "incomplete" if answer.truncated else "completed"
        return self._done() + [self._event(status, response=_response(answer, self.request, status,
                                                                       _answer_items(answer)))]

    def fail(self, message: str) -> list[Frame]:
        failed = _response(self.head, self.request, "failed", [])
        failed["error"] = {"code": "server_error", "message": message}
        return [self._event("failed", response=failed)]

    def _event(self, kind: str, tokens: bool = False, **data: Any) -> Frame:
        name = f"response.{kind}"
        return Frame(name, {"type": name, "sequence_number": next(self._numbers), **data}, tokens)

    def _at(self) -> dict[str, Any]:
        return {"item_id": self._item["id"], "output_index": self._index}  # type: ignore[index]

    def _add(self, item: dict[str, Any]) -> list[Frame]:
        frames = self._done()
        self._index += 1
        self._item, self._said = item, []
        return frames + [self._event("output_item.added", output_index=self._index,
                                     item={**item, **_EMPTY_ITEMS[item["type"]]})]

    def _done(self) -> list[Frame]:
        """The open item's done events, its text now whole."""
        item = self._item
        if item is None:
            return []
        frames = []
        text = "".join(self._said)
        if item["type"] == "reasoning":
            item = _reasoning_item(self.head, text)
            frames.append(self._event("reasoning_summary_text.done", **self._at(), summary_index=0, text=text))
            frames.append(self._event("reasoning_summary_part.done", **self._at(), summary_index=0,
                                      part=item["summary"][0]))
        elif item["type"] == "message":
            item = _message_item(self.head, text)
            frames.append(self._event("output_text.done", **self._at(), content_index=0, text=text, logprobs=[]))
            frames.append(self._event("content_part.done", **self._at(), content_index=0, part=item["content"][0]))
        frames.append(self._event("output_item.done", output_index=self._index, item=item))
        self._item = None
        return frames


# What the response echoes of the request, and the API's defaults for what the request left out.
_ECHOED = {"instructions": None, "metadata": {}, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
           "temperature": 1.0, "top_p": 1.0, "reasoning": None, "text": {"format": {"type": "text"}}, "store": False,
           "truncation": "disabled"}
# An item as output_item.added announces it, before its parts stream.
_EMPTY_ITEMS = {"reasoning": {"summary": []}, "message": {"status": "in_progress", "content": []},
                "function_call": {"status": "in_progress", "arguments": ""}}


def _response(answer: Answer, request: Mapping[str, Any], status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    done = status != "in_progress"
    body = {"id": f"resp_{answer.id}", "object": "response", "created_at": answer.created, "status": status,
            "model": answer.model, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "usage": render_openai_usage(answer.usage, "input_tokens", "output_tokens") if done else None,
            **{key: default if request.get(key) is None else request[key] for key, default in _ECHOED.items()}}
    if done and answer.completion_token_ids is not None:
        body[TOKENS_KEY] = token_extension(answer.prompt_token_ids, answer.completion_token_ids,
                                           answer.completion_logprobs, answer.turn.malformed)
    return body


def _answer_items(answer: Answer) -> list[dict[str, Any]]:
    turn = answer.turn
    items: list[dict[str, Any]] = []
    if turn.reasoning is not None:
        items.append(_reasoning_item(answer, turn.reasoning))
    if turn.text:
        items.append(_message_item(answer, turn.text))
    items.extend(_function_call_item(call_id, call) for call_id, call in answer.calls())
    return items


def _reasoning_item(answer: Answer, text: str) -> dict[str, Any]:
    reasoning = {"id": f"rs_{answer.id}", "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
    if answer.signature is not None:
        reasoning["encrypted_content"] = answer.signature
    return reasoning


def _message_item(answer: Answer, text: str) -> dict[str, Any]:
    return {"id": f"msg_{answer.id}", "type": "message", "status": "completed", "role": "assistant",
            "content": [_output_text(text)]}


def _function_call_item(call_id: str, call: ToolCall) -> dict[str, Any]:
    item = {"id": f"fc_{call_id}", "type": "function_call", "status": "completed", "call_id": call_id,
            "name": call.name, "arguments": call.arguments_json()}
    namespace, _, name = call.name.rpartition("__")
    if namespace.startswith(MCP_NAMESPACE) and name:
        item.update(namespace=namespace, name=name)
    return item


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _text_message(role: str, text: str, hint: str) -> Message:
    return Message(role, (Part("text", text=text),), {HINTS: {hint: True}})


def _offered_tools(body: dict[str, Any], items: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """`tools`, then those of `additional_tools` input items (where Codex 0.171 sends its tools)."""
    tools = list(dict_list(body.get("tools")) or [])
    for item in items or []:
        if item.get("type") == "additional_tools":
            tools.extend(dict_list(item.get("tools")) or [])
    return tools


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    kind = tool.get("type")
    definition = {key: value for key, value in tool.items() if key != "type"}
    if kind == "function":
        return tool_spec(definition)
    return tool_spec(definition if "name" in definition else {"name": kind, **definition}, kind)


# -- items -> messages ----------------------------------------------------------

def _read_items(items: list[dict[str, Any]], blobs: dict[str, bytes]) -> list[Message]:
    messages: list[Message] = []
    turn: list[Part] = []
    layout: list[dict[str, Any]] = []

    def end_turn() -> None:
        if layout:
            messages.append(Message("assistant", tuple(turn), {HINTS: {"items": list(layout)}}))
            turn.clear()
            layout.clear()

    for item in items:
        kind = item.get("type")
        if kind in ("message", None) and item.get("role") in _ROLES:
            role, parts, leftover, hints = split_message(item, _ROLES, "user", _content_reader(item["role"], blobs))
            if role == "assistant":
                turn.extend(parts)
                entry: dict[str, Any] = {"kind": "message", "parts": len(parts)}
                if leftover:
                    entry["keys"] = leftover
                if hints:
                    entry["hints"] = hints
                layout.append(entry)
                continue
            end_turn()
            messages.append(Message(role, tuple(parts), message_extra(leftover, hints)))
        elif isinstance(kind, str) and kind.endswith("_output"):
            end_turn()
            messages.append(Message("tool", (_result_part(item, blobs),)))
        else:
            turn.append(_item_part(item))
            layout.append({"kind": "item"})
    end_turn()
    return messages


def _content_reader(role: str, blobs: dict[str, bytes]) -> PartOf:
    default = _text_type(role)

    def part_of(wire: dict[str, Any]) -> Part:
        rest = dict(wire)
        kind = rest.get("type")
        if kind in ("input_text", "output_text"):
            if kind == default:
                del rest["type"]
            return Part("text", text=take(rest, "text", str), extra=rest or None)
        if kind == "input_image":
            del rest["type"]
            return image_part(take(rest, "image_url", str), blobs, rest)
        return Part("other", extra=dict(wire))

    return part_of


def _text_type(role: str) -> str:
    return "output_text" if role == "assistant" else "input_text"


def _result_part(item: dict[str, Any], blobs: dict[str, bytes]) -> Part:
    rest = dict(item)
    if rest["type"] == "function_call_output":
        del rest["type"]
    call_id = take(rest, _CALL_ID_KEY.get(item["type"], "call_id"), str)
    text = take(rest, "output", str)
    nested = dict_list(rest.get("output"), empty_ok=True) if text is None else None
    content = None
    if nested is not None:
        del rest["output"]
        content = tuple(map(_content_reader("tool", blobs), nested))
    return Part("tool_result", call_id=call_id, text=text, content=content, extra=rest or None)


def _item_part(item: dict[str, Any]) -> Part:
    rest = dict(item)
    kind = rest.get("type")
    if not isinstance(kind, str):
        return Part("other", extra=dict(item))
    if kind == "reasoning":
        del rest["type"]
        text = _joined_texts(rest.get("content")) or _joined_texts(rest.get("summary"))
        return Part("reasoning", text=text, signature=take(rest, "encrypted_content", str), extra=rest or None)
    spec = _CALLS.get(kind)
    if spec is None:
        return Part("other", extra=dict(item))
    if kind == "function_call":
        del rest["type"]
    arguments = take(rest, spec.arguments, dict if spec.as_json else str)
    if spec.as_json and arguments is not None:
        arguments = dump_arguments(arguments)
    name = take(rest, spec.name, str) if spec.name else kind.removesuffix("_call")
    return Part("tool_call", tool_name=name, call_id=take(rest, "call_id", str), arguments=arguments,
                extra=rest or None)


def _joined_texts(entries: Any) -> str | None:
    texts = [entry["text"] for entry in dict_list(entries) or [] if isinstance(entry.get("text"), str)]
    return "\n\n".join(texts) if texts else None


# -- messages -> items ----------------------------------------------------------

def _write_items(message: Message, blobs: Mapping[str, bytes]) -> list[dict[str, Any]]:
    leftover, hints = split_extra(message.extra)
    if message.role == "tool":
        return [_result_item(part, blobs) for part in message.parts]
    writer = _content_writer(message.role, blobs)
    if message.role != "assistant":
        return [join_message(message.role, list(message.parts), leftover, hints, writer)]
    parts = iter(message.parts)
    items = []
    for entry in hints.get("items") or _default_layout(message.parts):
        if entry["kind"] == "message":
            content = [next(parts) for _ in range(entry["parts"])]
            items.append(join_message("assistant", content, entry.get("keys") or {}, entry.get("hints") or {}, writer))
        else:
            items.append(_call_item(next(parts)))
    return items


def _default_layout(parts: tuple[Part, ...]) -> list[dict[str, Any]]:
    """The layout of an assistant message this codec did not read: text runs become message items."""
    layout: list[dict[str, Any]] = []
    for part in parts:
        if part.type in ("reasoning", "tool_call"):
            layout.append({"kind": "item"})
        elif layout and layout[-1]["kind"] == "message":
            layout[-1]["parts"] += 1
        else:
            layout.append({"kind": "message", "parts": 1, "keys": {"type": "message"}})
    return layout


def _content_writer(role: str, blobs: Mapping[str, bytes]) -> BlockOf:
    default = _text_type(role)

    def block_of(part: Part) -> dict[str, Any]:
        if part.type == "text":
            return block(part.extra, type=default, text=part.text)
        if part.type == "image":
            return block(part.extra, type="input_image", image_url=image_url(part, blobs))
        return dict(part.extra or {})

    return block_of


def _result_item(part: Part, blobs: Mapping[str, bytes]) -> dict[str, Any]:
    kind = (part.extra or {}).get("type", "function_call_output")
    writer = _content_writer("tool", blobs)
    output = part.text if part.content is None else [writer(entry) for entry in part.content]
    return block(part.extra, type=kind, **{_CALL_ID_KEY.get(kind, "call_id"): part.call_id}, output=output)


def _call_item(part: Part) -> dict[str, Any]:
    if part.type == "reasoning":
        return block(part.extra, type="reasoning", encrypted_content=part.signature)
    if part.type != "tool_call":
        return dict(part.extra or {})
    kind = (part.extra or {}).get("type", "function_call")
    spec = _CALLS.get(kind, _CALLS["function_call"])
    arguments = json.loads(part.arguments) if spec.as_json and part.arguments is not None else part.arguments
    fields = {"type": kind, "call_id": part.call_id, spec.arguments: arguments}
    if spec.name:
        fields[spec.name] = part.tool_name
    return block(part.extra, **fields)


# -- streams --------------------------------------------------------------------

# event-type stem -> (where its text goes in the item: key, index field of the event, part key; or a top-level
# item key; the key holding the full text in the `.done` event; the type of a part the stream never announced)
_STREAMED: dict[str, tuple[tuple[str, ...], str, str | None]] = {
    "response.output_text": (("content", "content_index", "text"), "text", "output_text"),
    "response.refusal": (("content", "content_index", "refusal"), "refusal", "refusal"),
    "response.reasoning_text": (("content", "content_index", "text"), "text", "reasoning_text"),
    "response.reasoning_summary_text": (("summary", "summary_index", "text"), "text", "summary_text"),
    "response.function_call_arguments": (("arguments",), "arguments", None),
    "response.custom_tool_call_input": (("input",), "input", None),
    "response.mcp_call_arguments": (("arguments",), "arguments", None),
}
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


class ResponsesStream(StreamState):
    """Reassembles a Responses stream into the response object the non-streaming call returns.

    The terminal event's `response` is the answer when it has one; otherwise
    (a partial stream, or a server that leaves the final output empty) the
    output is rebuilt from the items: `output_item.done` is authoritative for
    its item, deltas and `.done` texts fill the items still streaming.
    """

    def __init__(self) -> None:
        super().__init__()
        self._response: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None
        self._items: dict[int, dict[str, Any]] = {}
        self._finished: set[int] = set()
        self._text: dict[int, Fragments] = {}
        self._error: dict[str, Any] | None = None

    def feed(self, event: SSEEvent) -> None:
        data = self.load(event)
        if data is None:
            return
        kind = data.get("type") or event.event or ""
        stem, _, suffix = kind.rpartition(".")
        if stem in _STREAMED and suffix in ("delta", "done"):
            self._on_text(data, _STREAMED[stem], suffix)
        elif kind in ("response.created", "response.in_progress", "response.queued"):
            if isinstance(data.get("response"), dict):
                self._response = data["response"]
        elif kind in _TERMINAL:
            self._on_terminal(kind, data)
        elif kind == "response.output_item.added" or kind == "response.output_item.done":
            self._on_item(data, finished=suffix == "done")
        elif kind == "response.content_part.added":
            self._on_part(data, "content", "content_index")
        elif kind == "response.reasoning_summary_part.added":
            self._on_part(data, "summary", "summary_index")
        elif kind == "response.output_text.annotation.added":
            self._on_annotation(data)
        elif kind == "error":
            self._error = data["error"] if isinstance(data.get("error"), dict) else {
                key: data[key] for key in ("code", "message", "param") if key in data}
            self.note_error(describe_error(self._error))

    def _on_item(self, data: dict[str, Any], finished: bool) -> None:
        index, item = data.get("output_index"), data.get("item")
        if isinstance(index, int) and isinstance(item, dict):
            self._items[index] = item
            if finished:
                self._finished.add(index)

    def _streaming_item(self, data: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        index = data.get("output_index")
        if index not in self._items:
            self.note_error(f"{data.get('type')} for unknown output item {index!r}")
            return None
        return index, self._items[index]

    def _on_part(self, data: dict[str, Any], key: str, index_field: str) -> None:
        found = self._streaming_item(data)
        position, part = data.get(index_field), data.get("part")
        if found and isinstance(position, int) and isinstance(part, dict):
            _slot(found[1], key, position, part.get("type")).update(part)

    def _on_annotation(self, data: dict[str, Any]) -> None:
        found = self._streaming_item(data)
        position = data.get("content_index")
        if found and isinstance(position, int):
            part = _slot(found[1], "content", position, "output_text")
            part["annotations"] = [*(part.get("annotations") or []), data.get("annotation")]

    def _on_text(self, data: dict[str, Any], spec: tuple[tuple[str, ...], str, str | None], suffix: str) -> None:
        found = self._streaming_item(data)
        if found is None:
            return
        path: tuple[Any, ...] = spec[0]
        done_key, part_type = spec[1], spec[2]
        if len(path) == 3:
            position = data.get(path[1])
            if not isinstance(position, int):
                return
            path = (path[0], position, path[2])
        fragments = self._text.setdefault(found[0], Fragments())
        if suffix == "delta":
            fragments.add((path, part_type), data.get("delta"))
            self.first_token_seen = True
        else:
            fragments.set((path, part_type), data.get(done_key))

    def _on_terminal(self, kind: str, data: dict[str, Any]) -> None:
        self.done = True
        response = data.get("response")
        if isinstance(response, dict):
            self._final = response
        if kind == "response.failed":
            error = response.get("error") if isinstance(response, dict) else None
            self.note_error(describe_error(error) if error else "response.failed")

    def result(self) -> dict[str, Any]:
        if self._final is not None:
            final = dict(self._final)
            if not final.get("output") and self._items:
                final["output"] = self._built_items()
            return final
        if self._response is None and not self._items:
            return {"error": dict(self._error)} if self._error else {}
        body = dict(self._response or {"object": "response", "status": "in_progress"})
        body["output"] = self._built_items()
        if self._error and not body.get("error"):
            body["error"] = dict(self._error)
        return body

    def _built_items(self) -> list[dict[str, Any]]:
        built = []
        for index in sorted(self._items):
            item = copy.deepcopy(self._items[index])
            fragments = self._text.get(index)
            if fragments is not None and index not in self._finished:
                for path, part_type in fragments:
                    text = fragments.get((path, part_type))
                    if len(path) == 1:
                        item[path[0]] = text
                    else:
                        _slot(item, path[0], path[1], part_type)[path[2]] = text
            built.append(item)
        return built


def _slot(item: dict[str, Any], key: str, position: int, part_type: str | None) -> dict[str, Any]:
    """The part at `item[key][position]`, created (typed `part_type`) if the stream skipped announcing it."""
    if not isinstance(item.get(key), list):
        item[key] = []
    parts = item[key]
    while len(parts) <= position:
        parts.append(None)
    if not isinstance(parts[position], dict):
        parts[position] = {"type": part_type} if part_type else {}
    return parts[position]


CODEC = ResponsesCodec()
