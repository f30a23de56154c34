"""OpenAI Chat Completions (`POST /v1/chat/completions`), as OpenAI, vLLM and most compatible servers speak it.

Messages map one to one (keys no part field holds, such as `name`, `refusal`
or a null `content`, stay in `Message.extra`):

- system / developer / user: string content → one text part (hint
  `string_content`); parts: text → text, image_url → image (data URL to
  blobs; `detail` and other image_url keys in extra["image_url"]), anything
  else (input_audio, file, ...) → other.
- assistant: parts in the order reasoning (`reasoning_content`, or
  `reasoning` as newer vLLM and OpenRouter name it: hint `reasoning_key`),
  content parts, tool calls (id → call_id; function.name / .arguments, or
  custom.name / .input; the rest of the call, `type` included, in extra).
- tool: one tool_result part (tool_call_id → call_id; string content →
  text, list → content; is_error None).

`parse_response` gives one assistant message per choice. vLLM's token-in /
token-out extensions are kept: `prompt_token_ids`, each choice's
`token_ids`, and per-token logprobs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from forgerl.recorder.apis.answer import Answer, Frame, Pieces, chunks, replay
from forgerl.recorder.apis.common import (BlockOf, ChoiceStream, ChoiceWriter, Fragments, PartOf, block, dict_list,
                                          fill_from_choices, image_part, image_url, join_message, keep_latest,
                                          message_extra, params_without, render_content, split_extra, split_message,
                                          take, tool_spec)
from forgerl.schema.messages import Exchange, Message, Part
from forgerl.schema.toolcalls import ToolCall

_ROLES = ("system", "developer", "user", "assistant", "tool")
_REASONING_KEYS = ("reasoning_content", "reasoning")
_STREAMED_TEXT = ("content", "reasoning_content", "reasoning", "refusal")


class ChatCodec:
    name = "chat"

    def parse_request(self, body: dict[str, Any]) -> Exchange:
        exchange = Exchange(model_requested=body.get("model"))
        messages = dict_list(body.get("messages"))
        if messages is not None:
            exchange.input = [_read_message(wire, exchange.blobs) for wire in messages]
        exchange.params = params_without(body, ["messages"] if messages is not None else [])
        exchange.tools = [_tool(tool) for tool in dict_list(body.get("tools")) or []]
        return exchange

    def render_request(self, exchange: Exchange, blobs: Mapping[str, bytes]) -> dict[str, Any]:
        body = dict(exchange.params)
        if exchange.input:
            body["messages"] = [_write_message(message, blobs) for message in exchange.input]
        return body

    def new_stream(self) -> ChatStream:
        return ChatStream()

    def parse_response(self, body: dict[str, Any], exchange: Exchange) -> None:
        def message_of(choice: dict[str, Any]) -> Message:
            wire = choice.get("message")
            return _read_message(wire, exchange.blobs) if isinstance(wire, dict) else Message("assistant", ())

        fill_from_choices(body, exchange, message_of, _logprobs)

    def render_response(self, answer: Answer, request: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of `parse_response`: the answer as a `chat.completion`."""
        turn = answer.turn
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or (None if answer.call_ids else "")}
        if turn.reasoning is not None:
            message["reasoning_content"] = turn.reasoning
        if answer.call_ids:
            message["tool_calls"] = [{"id": call_id, "type": "function",
                                      "function": {"name": call.name, "arguments": call.arguments_json()}}
                                     for call_id, call in answer.calls()]
        return _writer(answer, request).body(message=message)

    def render_stream(self, answer: Answer, request: Mapping[str, Any], pieces: Pieces = chunks) -> Iterator[Frame]:
        """The inverse of `ChatStream` (see `ChatWriter`)."""
        return replay(self.stream_writer(answer, request), answer, pieces)

    def stream_writer(self, head: Answer, request: Mapping[str, Any]) -> ChatWriter:
        return ChatWriter(head, request)


class ChatWriter:
    """`chat.completion.chunk`s. Tool calls come as OpenAI sends them: id, type and name in the first fragment
    (arguments empty), then argument pieces. A failure is an `{"error": ...}` chunk, then ``[DONE]``, as vLLM
    sends it."""

    def __init__(self, head: Answer, request: Mapping[str, Any]):
        self._writer = _writer(head, request)
        self._calls = 0

    def start(self) -> list[Frame]:
        return [self._writer.chunk(delta={"role": "assistant", "content": ""})]

    def reasoning(self, piece: str) -> list[Frame]:
        return [self._writer.chunk(bool(piece), delta={"reasoning_content": piece})]

    def text(self, piece: str) -> list[Frame]:
        return [self._writer.chunk(True, delta={"content": piece})] if piece else []

    def tool_call(self, call_id: str, call: ToolCall, pieces: Pieces) -> list[Frame]:
        index, self._calls = self._calls, self._calls + 1
        frames = [self._writer.chunk(delta={"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                                            "function": {"name": call.name, "arguments": ""}}]})]
        frames.extend(self._writer.chunk(True, delta={"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                      for piece in pieces(call.arguments_json()))
        return frames

    def finish(self, answer: Answer) -> list[Frame]:
        self._writer.ends(answer, *_ending(answer))
        return list(self._writer.end(delta={}))

    def fail(self, message: str) -> list[Frame]:
        return [Frame(None, {"error": {"message": message, "type": "server_error", "code": 502}}),
                Frame(None, "[DONE]")]


def _writer(answer: Answer, request: Mapping[str, Any]) -> ChoiceWriter:
    return ChoiceWriter(answer, request, "chatcmpl-", ("chat.completion", "chat.completion.chunk"), *_ending(answer))


def _ending(answer: Answer) -> tuple[str, dict[str, Any] | None]:
    """The finish reason and logprobs object (vLLM's form for token-id answers) the last choice carries."""
    finish = "length" if answer.truncated else "tool_calls" if answer.call_ids else "stop"
    logprobs = None
    if answer.completion_logprobs is not None:  # vLLM's form for token-id answers (return_tokens_as_token_ids)
        logprobs = {"content": [{"token": f"token_id:{token}", "logprob": value, "bytes": None, "top_logprobs": []}
                                for token, value in zip(answer.completion_token_ids or (), answer.completion_logprobs)]}
    return finish, logprobs


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    kind = tool.get("type")
    inner: dict[str, Any] = tool[kind] if isinstance(kind, str) and isinstance(tool.get(kind), dict) else {}
    return tool_spec(inner, None if kind == "function" else kind)


def _logprobs(logprobs: Any) -> list[float] | None:
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list):
        return None
    return [entry["logprob"] for entry in entries
            if isinstance(entry, dict) and isinstance(entry.get("logprob"), (int, float))]


# -- messages -------------------------------------------------------------------

def _read_message(wire: dict[str, Any], blobs: dict[str, bytes]) -> Message:
    role, content, leftover, hints = split_message(wire, _ROLES, "user", _part_reader(blobs))
    if role == "tool":
        string = hints.pop("string_content", False)
        result = Part("tool_result", call_id=take(leftover, "tool_call_id", str),
                      text=content[0].text if string else None,
                      content=tuple(content) if content and not string else None)
        return Message("tool", (result,), message_extra(leftover, hints))
    if role != "assistant":
        return Message(role, tuple(content), message_extra(leftover, hints))
    parts = []
    for key in _REASONING_KEYS:
        reasoning = take(leftover, key, str)
        if reasoning is not None:
            parts.append(Part("reasoning", text=reasoning))
            if key != _REASONING_KEYS[0]:
                hints["reasoning_key"] = key
            break
    parts.extend(content)
    calls = dict_list(leftover.get("tool_calls"))
    if calls is not None:
        del leftover["tool_calls"]
        parts.extend(_call_part(call) for call in calls)
    return Message("assistant", tuple(parts), message_extra(leftover, hints))


def _write_message(message: Message, blobs: Mapping[str, bytes]) -> dict[str, Any]:
    leftover, hints = split_extra(message.extra)
    block_of = _block_writer(blobs)
    if message.role == "tool" and len(message.parts) == 1 and message.parts[0].type == "tool_result":
        result = message.parts[0]
        content = result.text if result.content is None else render_content(result.content, hints, block_of)
        return block(leftover, role="tool", tool_call_id=result.call_id, content=content)
    reasoning = [part for part in message.parts if part.type == "reasoning"]
    calls = [part for part in message.parts if part.type == "tool_call"]
    content = [part for part in message.parts if part.type not in ("reasoning", "tool_call")]
    out = join_message(message.role, content, leftover, hints, block_of)
    if reasoning:
        out[hints.get("reasoning_key", _REASONING_KEYS[0])] = "".join(part.text or "" for part in reasoning)
    if calls:
        out["tool_calls"] = [_call_block(part) for part in calls]
    return out


def _call_part(call: dict[str, Any]) -> Part:
    rest = dict(call)
    inner_key, arguments_key = _call_keys(rest.get("type"))
    name = arguments = None
    if isinstance(rest.get(inner_key), dict):
        inner = dict(rest.pop(inner_key))
        name, arguments = take(inner, "name", str), take(inner, arguments_key, str)
        if inner:
            rest[inner_key] = inner
    return Part("tool_call", tool_name=name, call_id=take(rest, "id", str), arguments=arguments, extra=rest or None)


def _call_block(part: Part) -> dict[str, Any]:
    rest = dict(part.extra or {})
    inner_key, arguments_key = _call_keys(rest.get("type"))
    inner = block(rest.pop(inner_key, None), name=part.tool_name, **{arguments_key: part.arguments})
    return block(rest, id=part.call_id, **{inner_key: inner})


def _call_keys(kind: Any) -> tuple[str, str]:
    """(the key holding name and arguments, the arguments key) for a tool call of `kind`."""
    return ("custom", "input") if kind == "custom" else ("function", "arguments")


def _part_reader(blobs: dict[str, bytes]) -> PartOf:
    def part_of(wire: dict[str, Any]) -> Part:
        rest = dict(wire)
        kind = rest.pop("type", None)
        if kind == "text":
            return Part("text", text=take(rest, "text", str), extra=rest or None)
        if kind == "image_url" and isinstance(rest.get("image_url"), dict):
            inner = dict(rest.pop("image_url"))
            url = take(inner, "url", str)
            if inner:
                rest["image_url"] = inner
            return image_part(url, blobs, rest)
        return Part("other", extra=dict(wire))

    return part_of


def _block_writer(blobs: Mapping[str, bytes]) -> BlockOf:
    def block_of(part: Part) -> dict[str, Any]:
        if part.type == "text":
            return block(part.extra, type="text", text=part.text)
        if part.type == "image":
            rest = dict(part.extra or {})
            inner = block(rest.pop("image_url", None), url=image_url(part, blobs))
            return block(rest, type="image_url", image_url=inner)
        return dict(part.extra or {})

    return block_of


# -- streams --------------------------------------------------------------------

def _keep_first(target: dict[str, Any], key: str, value: Any) -> None:
    """Tool-call ids, types and names come once; servers that repeat them must not double them."""
    if target.get(key) in (None, ""):
        target[key] = value


class ChatStream(ChoiceStream):
    """Reassembles `chat.completion.chunk`s into the `chat.completion` the non-streaming call returns.

    Content, reasoning and refusal deltas concatenate; tool-call fragments
    are keyed by their `index` (by id, for servers that omit it), take id,
    type and name from the first fragment that has them, and concatenate
    arguments.
    """

    body_object = "chat.completion"
    delta_key = "delta"

    def __init__(self) -> None:
        super().__init__()
        self._messages: dict[int, dict[str, Any]] = {}
        self._calls: dict[int, dict[int, dict[str, Any]]] = {}
        self._text = Fragments()

    def feed_delta(self, index: int, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        message = self._messages.setdefault(index, {})
        for key, value in delta.items():
            if key in _STREAMED_TEXT and isinstance(value, str):
                self._text.add((index, key), value)
                if value:
                    self.first_token_seen = True
            elif key == "tool_calls" and isinstance(value, list):
                self._feed_calls(index, value)
            else:
                keep_latest(message, key, value)

    def _feed_calls(self, index: int, fragments: list[Any]) -> None:
        calls = self._calls.setdefault(index, {})
        for fragment in fragments:
            if not isinstance(fragment, dict):
                continue
            position = _position(calls, fragment)
            call = calls.setdefault(position, {})
            for key, value in fragment.items():
                if key in ("function", "custom") and isinstance(value, dict):
                    if not isinstance(call.get(key), dict):
                        call[key] = {}
                    inner = call[key]
                    for name, piece in value.items():
                        if name in ("arguments", "input") and isinstance(piece, str):
                            self._text.add((index, position, name), piece)
                            self.first_token_seen = True
                        else:
                            _keep_first(inner, name, piece)
                elif key != "index":
                    _keep_first(call, key, value)

    def built_choice(self, index: int, fields: dict[str, Any]) -> dict[str, Any]:
        message = dict(self._messages.get(index, {}))
        message.setdefault("role", "assistant")
        for key in _STREAMED_TEXT:
            text = self._text.get((index, key))
            if text is not None:
                message[key] = text
        message.setdefault("content", None)
        calls = self._calls.get(index)
        if calls:
            message["tool_calls"] = [self._built_call(index, position, calls[position]) for position in sorted(calls)]
        return {**fields, "message": message}

    def _built_call(self, index: int, position: int, call: dict[str, Any]) -> dict[str, Any]:
        built = {key: dict(value) if isinstance(value, dict) else value for key, value in call.items()}
        inner_key, arguments_key = _call_keys(built.get("type"))
        if not built.get("type"):
            built["type"] = inner_key
        if not isinstance(built.get(inner_key), dict):
            built[inner_key] = {}
        built[inner_key][arguments_key] = self._text.get((index, position, arguments_key)) or ""
        return built


def _position(calls: dict[int, dict[str, Any]], fragment: dict[str, Any]) -> int:
    """Which tool call a fragment continues: its `index`, else the call with its id, else a new or the last one."""
    if isinstance(fragment.get("index"), int):
        return fragment["index"]
    call_id = fragment.get("id")
    for position, call in calls.items():
        if call_id and call.get("id") == call_id:
            return position
    return len(calls) if call_id or not calls else max(calls)


CODEC = ChatCodec()
