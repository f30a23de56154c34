"""Anthropic Messages (`POST /v1/messages`): requests to canonical messages and back, and streams.

Blocks map to parts as follows; keys a part field does not hold stay in
`Part.extra`, and `cache_control` markers are layout hints (see common):

- text → text (`citations` ride in extra)
- image → image: base64 source → `blob_hash` + `media_type`, url source → `url`
- tool_use → tool_call; `arguments` is the input object as compact JSON
- tool_result → tool_result: string content → `text`, block list → `content`
  (nested parts), `is_error` as sent (None when absent)
- thinking → reasoning (`text`, `signature`);
  redacted_thinking → reasoning with `redacted=True` and the opaque `data` in `signature`
- anything else (server_tool_use, web_search_tool_result, document, ...) → other,
  the whole block in extra

`system` (a string or text blocks) becomes one leading "system" message.
tool_result blocks stay in the "user" message that carries them, as on the
wire: Claude Code mixes them with text in one turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from forgerl.recorder.apis.answer import Answer, Frame, Pieces, chunks, replay
from forgerl.recorder.apis.common import (BlockOf, Fragments, PartOf, StreamState, block, blob_from_base64, base64_of,
                                          describe_error,
                                          dict_list, dump_arguments, error_of, join_message, message_extra,
                                          params_without, parse_content, render_content, split_extra,
                                          split_message, take, tool_spec)
from forgerl.recorder.policy_tokens import TOKENS_KEY, read_token_extension, token_extension
from forgerl.recorder.sse import SSEEvent
from forgerl.schema.messages import Exchange, Message, Part, Usage
from forgerl.schema.toolcalls import ToolCall


class AnthropicCodec:
    name = "anthropic"

    def parse_request(self, body: dict[str, Any]) -> Exchange:
        exchange = Exchange(model_requested=body.get("model"))
        part_of = _part_reader(exchange.blobs)
        moved = []
        system = parse_content(body.get("system"), part_of)
        if system is not None:
            moved.append("system")
            exchange.input.append(Message("system", tuple(system[0]), message_extra({}, system[1])))
        messages = dict_list(body.get("messages"))
        if messages is not None:
            moved.append("messages")
            for wire in messages:
                role, parts, leftover, hints = split_message(wire, ("user", "assistant"), "user", part_of)
                exchange.input.append(Message(role, tuple(parts), message_extra(leftover, hints)))
        exchange.params = params_without(body, moved)
        exchange.tools = [_tool(tool) for tool in dict_list(body.get("tools")) or []]
        return exchange

    def render_request(self, exchange: Exchange, blobs: Mapping[str, bytes]) -> dict[str, Any]:
        body = dict(exchange.params)
        block_of = _block_writer(blobs)
        messages = []
        for message in exchange.input:
            leftover, hints = split_extra(message.extra)
            if message.role == "system" and "system" not in body:
                body["system"] = render_content(message.parts, hints, block_of)
            else:
                messages.append(join_message(message.role, list(message.parts), leftover, hints, block_of))
        if messages:
            body["messages"] = messages
        return body

    def new_stream(self) -> AnthropicStream:
        return AnthropicStream()

    def parse_response(self, body: dict[str, Any], exchange: Exchange) -> None:
        exchange.error = error_of(body)
        exchange.model_returned = body.get("model")
        exchange.stop_reason = body.get("stop_reason")
        exchange.usage = _usage(body.get("usage"))
        exchange.output = []
        if isinstance(body.get("content"), list):
            parts, hints = parse_content(body["content"], _part_reader(exchange.blobs)) or ([], {})
            exchange.output.append(Message("assistant", tuple(parts), message_extra({}, hints)))
        read_token_extension(body, exchange)

    def render_response(self, answer: Answer, request: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of `parse_response`: the answer as a Messages `message` (a served policy's
        token ids in the `forge` extension)."""
        body = {"id": f"msg_{answer.id}", "type": "message", "role": "assistant", "model": answer.model,
                "content": _answer_blocks(answer), "stop_reason": _stop_reason(answer), "stop_sequence": None,
                "usage": _render_usage(answer.usage)}
        if answer.completion_token_ids is not None:
            body[TOKENS_KEY] = token_extension(answer.prompt_token_ids, answer.completion_token_ids,
                                               answer.completion_logprobs, answer.turn.malformed)
        return body

    def render_stream(self, answer: Answer, request: Mapping[str, Any], pieces: Pieces = chunks) -> Iterator[Frame]:
        """The inverse of `AnthropicStream` (see `AnthropicWriter`)."""
        return replay(self.stream_writer(answer, request), answer, pieces)

    def stream_writer(self, head: Answer, request: Mapping[str, Any]) -> AnthropicWriter:
        return AnthropicWriter(head, request)


class AnthropicWriter:
    """A Messages stream in the documented order: message_start (output_tokens 1), each block's start, deltas
    and stop, with one ping after the first block's start, then message_delta (stop reason, cumulative usage,
    the `forge` extension) and message_stop. A failure is the API's `error` event."""

    def __init__(self, head: Answer, request: Mapping[str, Any]):
        self.head, self.request = head, request
        self._index = -1
        self._open: str | None = None  # the type of the block being written
        self._pinged = False

    def start(self) -> list[Frame]:
        usage = {**_render_usage(self.head.usage), "output_tokens": 1}
        return [_frame("message_start", message={
            "id": f"msg_{self.head.id}", "type": "message", "role": "assistant", "model": self.head.model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage})]

    def reasoning(self, piece: str) -> list[Frame]:
        frames = [] if self._open == "thinking" else self._start_block(
            {"type": "thinking", "thinking": "", "signature": ""})
        if piece:
            frames.append(self._delta(True, type="thinking_delta", thinking=piece))
        return frames

    def text(self, piece: str) -> list[Frame]:
        if not piece:
            return []
        frames = [] if self._open == "text" else self._start_block({"type": "text", "text": ""})
        frames.append(self._delta(True, type="text_delta", text=piece))
        return frames

    def tool_call(self, call_id: str, call: ToolCall, pieces: Pieces) -> list[Frame]:
        """Tool input starts with an empty partial_json, as the API sends it."""
        frames = self._start_block({"type": "tool_use", "id": call_id, "name": call.name, "input": {}})
        frames.append(self._delta(False, type="input_json_delta", partial_json=""))
        frames.extend(self._delta(True, type="input_json_delta", partial_json=piece)
                      for piece in pieces(call.arguments_json()))
        return frames + self._stop_block()

    def finish(self, answer: Answer) -> list[Frame]:
        frames = self._stop_block()
        if not self._pinged:
            frames.append(_PING)
        whole = CODEC.render_response(answer, self.request)
        delta = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
        if TOKENS_KEY in whole:
            delta[TOKENS_KEY] = whole[TOKENS_KEY]
        return frames + [_frame("message_delta", delta=delta, usage=whole["usage"]), _frame("message_stop")]

    def fail(self, message: str) -> list[Frame]:
        return [_frame("error", error={"type": "api_error", "message": message})]

    def _start_block(self, block: dict[str, Any]) -> list[Frame]:
        frames = self._stop_block()
        self._index += 1
        self._open = block["type"]
        frames.append(_frame("content_block_start", index=self._index, content_block=block))
        if not self._pinged:
            frames.append(_PING)
            self._pinged = True
        return frames

    def _stop_block(self) -> list[Frame]:
        if self._open is None:
            return []
        frames = []
        if self._open == "thinking":
            frames.append(self._delta(False, type="signature_delta", signature=self.head.signature or ""))
        frames.append(_frame("content_block_stop", index=self._index))
        self._open = None
        return frames

    def _delta(self, tokens: bool, **fields: Any) -> Frame:
        return Frame("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": fields},
                     tokens)


def _stop_reason(answer: Answer) -> str:
    return "max_tokens" if answer.truncated else "tool_use" if answer.call_ids else "end_turn"


def _render_usage(usage: Usage) -> dict[str, int]:
    """Inverse of `_usage`; Anthropic always reports the cache counts."""
    return {"input_tokens": usage.input_tokens or 0, "cache_creation_input_tokens": usage.cache_write_tokens or 0,
            "cache_read_input_tokens": usage.cache_read_tokens or 0, "output_tokens": usage.output_tokens or 0}


def _answer_blocks(answer: Answer) -> list[dict[str, Any]]:
    turn = answer.turn
    blocks: list[dict[str, Any]] = []
    if turn.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": turn.reasoning, "signature": answer.signature or ""})
    if turn.text:
        blocks.append({"type": "text", "text": turn.text})
    blocks.extend({"type": "tool_use", "id": call_id, "name": call.name, "input": call.arguments}
                  for call_id, call in answer.calls())
    return blocks


def _frame(kind: str, **data: Any) -> Frame:
    return Frame(kind, {"type": kind, **data})


_PING = _frame("ping")


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    kind = tool.get("type")
    plain = kind in (None, "custom")
    definition = {("parameters" if key == "input_schema" else key): value for key, value in tool.items()
                  if key not in ("type", "cache_control")}  # cache_control: a caching directive, not the tool
    return tool_spec(definition, None if plain else kind)


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    details = usage.get("output_tokens_details")
    return Usage(input_tokens=usage.get("input_tokens"), output_tokens=usage.get("output_tokens"),
                 cache_read_tokens=usage.get("cache_read_input_tokens"),
                 cache_write_tokens=usage.get("cache_creation_input_tokens"),
                 reasoning_tokens=details.get("thinking_tokens") if isinstance(details, dict) else None)


def _part_reader(blobs: dict[str, bytes]) -> PartOf:
    def part_of(wire: dict[str, Any]) -> Part:
        rest = dict(wire)
        kind = rest.pop("type", None)
        if kind == "text":
            return Part("text", text=take(rest, "text", str), extra=rest or None)
        if kind == "image":
            return _image(rest, blobs)
        if kind == "tool_use":
            arguments = take(rest, "input", dict)
            return Part("tool_call", tool_name=take(rest, "name", str), call_id=take(rest, "id", str),
                        arguments=None if arguments is None else dump_arguments(arguments), extra=rest or None)
        if kind == "tool_result":
            text = take(rest, "content", str)
            nested = dict_list(rest.get("content"), empty_ok=True) if text is None else None
            if nested is not None:
                del rest["content"]
            return Part("tool_result", call_id=take(rest, "tool_use_id", str), is_error=take(rest, "is_error", bool),
                        text=text, content=None if nested is None else tuple(part_of(item) for item in nested),
                        extra=rest or None)
        if kind == "thinking":
            return Part("reasoning", text=take(rest, "thinking", str), signature=take(rest, "signature", str),
                        extra=rest or None)
        if kind == "redacted_thinking":
            return Part("reasoning", redacted=True, signature=take(rest, "data", str), extra=rest or None)
        return Part("other", extra=dict(wire))

    return part_of


def _image(rest: dict[str, Any], blobs: dict[str, bytes]) -> Part:
    source = rest.get("source")
    if isinstance(source, dict) and source.get("type") == "base64" and source.keys() == {"type", "media_type", "data"}:
        digest = blob_from_base64(source["data"], blobs)
        if digest is not None and isinstance(source["media_type"], str):
            del rest["source"]
            return Part("image", blob_hash=digest, media_type=source["media_type"], extra=rest or None)
    if isinstance(source, dict) and source.get("type") == "url" and source.keys() == {"type", "url"}:
        del rest["source"]
        return Part("image", url=source["url"], extra=rest or None)
    return Part("image", extra=rest or None)


def _block_writer(blobs: Mapping[str, bytes]) -> BlockOf:
    def block_of(part: Part) -> dict[str, Any]:
        if part.type == "text":
            return block(part.extra, type="text", text=part.text)
        if part.type == "image":
            return block(part.extra, type="image", source=_source(part, blobs))
        if part.type == "tool_call":
            arguments = None if part.arguments is None else json.loads(part.arguments)
            return block(part.extra, type="tool_use", id=part.call_id, name=part.tool_name, input=arguments)
        if part.type == "tool_result":
            content = part.text if part.content is None else [block_of(item) for item in part.content]
            return block(part.extra, type="tool_result", tool_use_id=part.call_id, content=content,
                         is_error=part.is_error)
        if part.type == "reasoning" and part.redacted:
            return block(part.extra, type="redacted_thinking", data=part.signature)
        if part.type == "reasoning":
            return block(part.extra, type="thinking", thinking=part.text, signature=part.signature)
        return dict(part.extra or {})

    return block_of


def _source(part: Part, blobs: Mapping[str, bytes]) -> dict[str, Any] | None:
    if part.blob_hash is not None:
        return {"type": "base64", "media_type": part.media_type, "data": base64_of(blobs, part.blob_hash)}
    if part.url is not None:
        return {"type": "url", "url": part.url}
    return None


class AnthropicStream(StreamState):
    """Reassembles a Messages stream into the message the non-streaming call returns.

    Text, thinking and tool-input JSON arrive as fragments per block index;
    `message_delta` carries the stop reason and *cumulative* usage, so its
    values replace those of `message_start`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._text = Fragments()
        self._error_body: dict[str, Any] | None = None

    def feed(self, event: SSEEvent) -> None:
        data = self.load(event)
        if data is None:
            return
        handler = _HANDLERS.get(data.get("type") or event.event)
        if handler is not None:
            handler(self, data)

    def _on_message_start(self, data: dict[str, Any]) -> None:
        if isinstance(data.get("message"), dict):
            self._message = dict(data["message"])

    def _on_block_start(self, data: dict[str, Any]) -> None:
        index, content_block = data.get("index"), data.get("content_block")
        if isinstance(index, int) and isinstance(content_block, dict):
            self._blocks[index] = dict(content_block)

    def _on_block_delta(self, data: dict[str, Any]) -> None:
        index, delta = data.get("index"), data.get("delta")
        current = self._blocks.get(index) if isinstance(index, int) else None
        if current is None or not isinstance(delta, dict):
            self.note_error(f"content_block_delta for unknown block {index!r}")
            return
        kind = delta.get("type")
        if kind in _FRAGMENTS:
            field, key = _FRAGMENTS[kind]
            self._text.add((index, field), delta.get(key))
            self.first_token_seen = True
        elif kind == "signature_delta":
            current["signature"] = delta.get("signature")
        elif kind == "citations_delta":
            current["citations"] = [*(current.get("citations") or []), delta.get("citation")]

    def _on_block_stop(self, data: dict[str, Any]) -> None:
        index = data.get("index")
        if isinstance(index, int) and self._text.get((index, "input")) is not None and self._tool_input(index) is None:
            self.note_error(f"tool input of block {index} is not valid JSON")

    def _on_message_delta(self, data: dict[str, Any]) -> None:
        message = self._message_so_far()
        if isinstance(data.get("delta"), dict):
            message.update(data["delta"])
        if isinstance(data.get("usage"), dict):
            usage = dict(message.get("usage") or {})
            usage.update((key, value) for key, value in data["usage"].items() if value is not None)
            message["usage"] = usage

    def _on_message_stop(self, data: dict[str, Any]) -> None:
        self.done = True

    def _on_error(self, data: dict[str, Any]) -> None:
        self._error_body = data
        self.note_error(describe_error(data.get("error", data)))

    def _message_so_far(self) -> dict[str, Any]:
        if self._message is None:
            self._message = _bare_message()
        return self._message

    def _tool_input(self, index: int) -> Any:
        """The block's input JSON parsed, or None while it is empty or incomplete."""
        text = self._text.get((index, "input"))
        if not text or not text.strip():
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None

    def result(self) -> dict[str, Any]:
        if self._message is None and not self._blocks:
            return dict(self._error_body) if self._error_body else {}
        message = dict(self._message) if self._message is not None else _bare_message()
        message["content"] = [self._built_block(index) for index in sorted(self._blocks)]
        if isinstance(message.get("usage"), dict):
            message["usage"] = dict(message["usage"])
        return message

    def _built_block(self, index: int) -> dict[str, Any]:
        built = dict(self._blocks[index])
        for field in ("text", "thinking"):
            text = self._text.get((index, field))
            if text is not None:
                built[field] = (built.get(field) or "") + text
        tool_input = self._tool_input(index)
        if tool_input is not None:
            built["input"] = tool_input
        if "citations" in built:
            built["citations"] = list(built["citations"])
        return built


def _bare_message() -> dict[str, Any]:
    """What a stream that skipped message_start still gets built on."""
    return {"type": "message", "role": "assistant", "content": []}


# delta type -> (what the fragments build: a block field, or "input" for tool JSON; the delta's key)
_FRAGMENTS = {"text_delta": ("text", "text"), "thinking_delta": ("thinking", "thinking"),
              "input_json_delta": ("input", "partial_json")}

_HANDLERS = {
    "message_start": AnthropicStream._on_message_start,
    "content_block_start": AnthropicStream._on_block_start,
    "content_block_delta": AnthropicStream._on_block_delta,
    "content_block_stop": AnthropicStream._on_block_stop,
    "message_delta": AnthropicStream._on_message_delta,
    "message_stop": AnthropicStream._on_message_stop,
    "error": AnthropicStream._on_error,
}

CODEC = AnthropicCodec()
