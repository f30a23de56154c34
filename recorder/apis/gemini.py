"""Google Gemini API (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`).

Gemini CLI speaks it. The model is named in the path, not the body
(`model_of`). `contents[]` map one to one onto messages (role `user` → user,
`model` → assistant, `function` → tool; a content without a role gets the
hint `no_role`), and `systemInstruction` becomes one leading "system" message
(a bare string: hint `string_content`). Parts map as follows; keys a part
field does not hold (`thoughtSignature` beside a call, `videoMetadata`, ...)
stay in `Part.extra`:

- text → text; text with `thought: true` → reasoning (`thoughtSignature` →
  `signature`)
- functionCall → tool_call: `id` → call_id (Gemini often sends none), `name`,
  `args` as compact JSON; other keys of the call in extra["functionCall"]
- functionResponse → tool_result: `id` → call_id, `name` → tool_name, the
  `response` object as compact JSON text; other keys in extra["functionResponse"]
- inlineData with an image MIME type → image (bytes to blobs); fileData with
  one → image by `fileUri`
- anything else (executableCode, codeExecutionResult, other inlineData) → other

`tools[].functionDeclarations` become one `Exchange.tools` entry each, the
declaration verbatim except that `parametersJsonSchema` is renamed
`parameters` in place; other tools (`googleSearch`, `codeExecution`) become
`{"type": key, "name": key, **config}`. Usage comes from `usageMetadata`:
`promptTokenCount` includes cached content, `candidatesTokenCount` excludes
thoughts (output = candidates + thoughts).

Streams are a JSON `GenerateContentResponse` per SSE `data:` frame with no
terminal event: a candidate's `finishReason` ends it. Each frame's parts
append to its candidate; a text part continues the text part before it when
both are (or both are not) thoughts and the earlier one carries no
`thoughtSignature` yet.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

from forgerl.recorder.apis.answer import Answer, Frame, Pieces, chunks, replay
from forgerl.recorder.apis.common import (HINTS, BlockOf, Fragments, PartOf, StreamState, block, blob_from_base64,
                                          base64_of, dict_list, dump_arguments, keep_latest, message_extra,
                                          params_without, split_extra, take, tool_spec)
from forgerl.recorder.policy_tokens import TOKENS_KEY, read_token_extension, token_extension
from forgerl.recorder.sse import SSEEvent
from forgerl.schema.messages import Exchange, Message, Part, Usage
from forgerl.schema.toolcalls import ToolCall

_ROLES = {"user": "user", "model": "assistant", "function": "tool"}
_WIRE_ROLES = {canonical: wire for wire, canonical in _ROLES.items()}
_METHODS = ("generateContent", "streamGenerateContent")
_VERSIONS = ("/v1beta/", "/v1alpha/", "/v1beta?", "/v1alpha?")
_MODEL = re.compile(r"/models/([^/:?]+):(?:stream)?[gG]enerateContent")


def is_gemini_path(path: str) -> bool:
    """A `models/{model}:generateContent` or `:streamGenerateContent` path (any prefix, query ignored)."""
    head = path.split("?", 1)[0]
    return ":" in head and head.rsplit(":", 1)[1] in _METHODS


def is_gemini_api(path: str) -> bool:
    """Any Gemini API path (the model calls, `:countTokens`, model listings): where a Gemini upstream serves."""
    return path.startswith(_VERSIONS) or is_gemini_path(path)


def model_of(path: str) -> str | None:
    """The model a Gemini path names (`/v1beta/models/gemini-2.5-pro:generateContent` → gemini-2.5-pro)."""
    match = _MODEL.search(path.split("?", 1)[0])
    return unquote(match.group(1)) if match else None


class GeminiCodec:
    name = "gemini"

    def parse_request(self, body: dict[str, Any]) -> Exchange:
        exchange = Exchange(model_requested=body.get("model") if isinstance(body.get("model"), str) else None)
        part_of = _part_reader(exchange.blobs)
        moved = []
        system = _read_system(body.get("systemInstruction"), part_of)
        if system is not None:
            moved.append("systemInstruction")
            exchange.input.append(system)
        contents = dict_list(body.get("contents"))
        if contents is not None:
            moved.append("contents")
            exchange.input.extend(_read_content(content, part_of) for content in contents)
        exchange.params = params_without(body, moved)
        exchange.tools = [spec for tool in dict_list(body.get("tools")) or [] for spec in _tools(tool)]
        return exchange

    def render_request(self, exchange: Exchange, blobs: Mapping[str, bytes]) -> dict[str, Any]:
        body = dict(exchange.params)
        block_of = _block_writer(blobs)
        contents = []
        for message in exchange.input:
            if message.role == "system" and "systemInstruction" not in body:
                body["systemInstruction"] = _write_system(message, block_of)
            else:
                contents.append(_write_content(message, block_of))
        if contents:
            body["contents"] = contents
        return body

    def new_stream(self) -> GeminiStream:
        return GeminiStream()

    def parse_response(self, body: dict[str, Any], exchange: Exchange) -> None:
        error = body.get("error")
        exchange.error = _describe(error) if error else None
        exchange.model_returned = body.get("modelVersion")
        exchange.usage = _usage(body.get("usageMetadata"))
        candidates = sorted(dict_list(body.get("candidates")) or [], key=lambda c: c.get("index") or 0)
        part_of = _part_reader(exchange.blobs)
        exchange.output = []
        for candidate in candidates:
            content = candidate.get("content")
            parts = dict_list(content.get("parts")) if isinstance(content, dict) else None
            exchange.output.append(Message("assistant", tuple(part_of(part) for part in parts or [])))
        exchange.stop_reason = candidates[0].get("finishReason") if candidates else None
        read_token_extension(body, exchange)

    def render_response(self, answer: Answer, request: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of `parse_response`: one candidate (a served policy's token ids in the `forge` extension)."""
        candidate = {"content": {"role": "model", "parts": _answer_parts(answer)},
                     "finishReason": "MAX_TOKENS" if answer.truncated else "STOP", "index": 0}
        body = {"candidates": [candidate], "usageMetadata": _render_usage(answer.usage),
                "modelVersion": answer.model, "responseId": answer.id}
        if answer.completion_token_ids is not None:
            body[TOKENS_KEY] = token_extension(answer.prompt_token_ids, answer.completion_token_ids,
                                               answer.completion_logprobs, answer.turn.malformed)
        return body

    def render_stream(self, answer: Answer, request: Mapping[str, Any], pieces: Pieces = chunks) -> Iterator[Frame]:
        """The inverse of `GeminiStream` (see `GeminiWriter`)."""
        return replay(self.stream_writer(answer, request), answer, pieces)

    def stream_writer(self, head: Answer, request: Mapping[str, Any]) -> GeminiWriter:
        return GeminiWriter(head, request)


class GeminiWriter:
    """Chunks as the API streams them: text and thoughts in pieces (the thought signature on a thought's last
    piece), each function call whole, every chunk with the model version and response id; the last carries
    the finish reason, usage (and the `forge` extension). The last chunk also carries the last part, so each
    part is held until the next one arrives. A failure is an `{"error": ...}` chunk."""

    def __init__(self, head: Answer, request: Mapping[str, Any]):
        self.head, self.request = head, request
        self._held: tuple[dict[str, Any], bool] | None = None  # a part not sent yet, and whether it is generated

    def start(self) -> list[Frame]:
        return []

    def reasoning(self, piece: str) -> list[Frame]:
        return self._send({"text": piece, "thought": True}, bool(piece))

    def text(self, piece: str) -> list[Frame]:
        return self._send({"text": piece}, True) if piece else []

    def tool_call(self, call_id: str, call: ToolCall, pieces: Pieces) -> list[Frame]:
        return self._send({"functionCall": _function_call(call_id, call)}, True)

    def finish(self, answer: Answer) -> list[Frame]:
        whole = CODEC.render_response(answer, self.request)
        part, delta = self._held if self._held is not None else (None, False)
        self._held = None
        return [self._chunk(self._signed(part), delta, whole)]

    def fail(self, message: str) -> list[Frame]:
        frames = self._send(None, False)
        return frames + [Frame(None, {"error": {"code": 500, "message": message, "status": "INTERNAL"}})]

    def _send(self, part: dict[str, Any] | None, delta: bool) -> list[Frame]:
        """Send the held part and hold this one; a thought's last piece gets the signature."""
        frames = []
        if self._held is not None:
            held, held_delta = self._held
            frames.append(self._chunk(held if part is not None and part.get("thought") and held.get("thought")
                                      else self._signed(held), held_delta))
        self._held = None if part is None else (part, delta)
        return frames

    def _signed(self, part: dict[str, Any] | None) -> dict[str, Any] | None:
        if part is not None and part.get("thought") and self.head.signature is not None:
            return {**part, "thoughtSignature": self.head.signature}
        return part

    def _chunk(self, part: dict[str, Any] | None, delta: bool, whole: dict[str, Any] | None = None) -> Frame:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part] if part else []}, "index": 0}
        data: dict[str, Any] = {"candidates": [candidate]}
        if whole is not None:
            candidate["finishReason"] = whole["candidates"][0]["finishReason"]
            data["usageMetadata"] = whole["usageMetadata"]
            if TOKENS_KEY in whole:
                data[TOKENS_KEY] = whole[TOKENS_KEY]
        return Frame(None, {**data, "modelVersion": self.head.model, "responseId": self.head.id}, delta)


def _describe(error: Any) -> str:
    """A Gemini error object, `{"code": 429, "message": ..., "status": "RESOURCE_EXHAUSTED"}`, as one line."""
    if isinstance(error, dict) and error.get("message"):
        kind = error.get("status") or error.get("code")
        return f"{kind}: {error['message']}" if kind else str(error["message"])
    return json.dumps(error, ensure_ascii=False, sort_keys=True)


def _answer_parts(answer: Answer) -> list[dict[str, Any]]:
    turn = answer.turn
    parts: list[dict[str, Any]] = []
    if turn.reasoning is not None:
        parts.append(block(None, text=turn.reasoning, thought=True, thoughtSignature=answer.signature))
    if turn.text:
        parts.append({"text": turn.text})
    parts.extend({"functionCall": _function_call(call_id, call)} for call_id, call in answer.calls())
    return parts


def _function_call(call_id: str, call: ToolCall) -> dict[str, Any]:
    """A call as the API writes it; an empty id is left out (the Gemini API names no call)."""
    return block(None, id=call_id or None, name=call.name, args=call.arguments)


def _usage(usage: Any) -> Usage | None:
    if not isinstance(usage, dict):
        return None
    prompt, cached = usage.get("promptTokenCount"), usage.get("cachedContentTokenCount")
    candidates, thoughts = usage.get("candidatesTokenCount"), usage.get("thoughtsTokenCount")
    uncached = prompt - cached if isinstance(prompt, int) and isinstance(cached, int) else prompt
    output = candidates + thoughts if isinstance(candidates, int) and isinstance(thoughts, int) else candidates
    return Usage(input_tokens=uncached, output_tokens=output, cache_read_tokens=cached, reasoning_tokens=thoughts)


def _render_usage(usage: Usage) -> dict[str, int]:
    """Inverse of `_usage`. Gemini does not count cache writes apart: they read back as uncached input."""
    prompt = (usage.input_tokens or 0) + (usage.cache_read_tokens or 0) + (usage.cache_write_tokens or 0)
    thoughts = usage.reasoning_tokens
    candidates = (usage.output_tokens or 0) - (thoughts or 0)
    out = {"promptTokenCount": prompt, "candidatesTokenCount": candidates,
           "totalTokenCount": prompt + (usage.output_tokens or 0)}
    if usage.cache_read_tokens is not None:
        out["cachedContentTokenCount"] = usage.cache_read_tokens
    if thoughts is not None:
        out["thoughtsTokenCount"] = thoughts
    return out


def _tools(tool: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key, value in tool.items():
        if key == "functionDeclarations":
            for declaration in dict_list(value) or []:
                yield tool_spec({("parameters" if name == "parametersJsonSchema" else name): item
                                 for name, item in declaration.items()})
        else:
            yield tool_spec({"name": key, **(value if isinstance(value, dict) else {})}, key)


# -- messages -------------------------------------------------------------------

def _read_system(value: Any, part_of: PartOf) -> Message | None:
    if isinstance(value, str):
        return Message("system", (Part("text", text=value),), {HINTS: {"string_content": True}})
    if isinstance(value, dict) and dict_list(value.get("parts")) is not None:
        rest = dict(value)
        parts = tuple(part_of(part) for part in rest.pop("parts"))
        return Message("system", parts, rest or None)
    return None


def _write_system(message: Message, block_of: BlockOf) -> Any:
    leftover, hints = split_extra(message.extra)
    if hints.get("string_content") and len(message.parts) == 1 and message.parts[0].text is not None:
        return message.parts[0].text
    return {**leftover, "parts": [block_of(part) for part in message.parts]}


def _read_content(wire: dict[str, Any], part_of: PartOf) -> Message:
    rest = dict(wire)
    hints: dict[str, Any] = {}
    if "role" not in rest:
        role, hints["no_role"] = "user", True
    elif rest["role"] in _ROLES:
        role = _ROLES[rest.pop("role")]
    else:
        role = "user"  # the unknown role stays in extra and renders over this one
    parts = dict_list(rest.get("parts"))
    if parts is None:
        return Message(role, (), message_extra(rest, hints))  # type: ignore[arg-type]
    del rest["parts"]
    return Message(role, tuple(part_of(part) for part in parts), message_extra(rest, hints))  # type: ignore[arg-type]


def _write_content(message: Message, block_of: BlockOf) -> dict[str, Any]:
    leftover, hints = split_extra(message.extra)
    out: dict[str, Any] = {} if hints.get("no_role") else {"role": _WIRE_ROLES.get(message.role, message.role)}
    if message.parts:
        out["parts"] = [block_of(part) for part in message.parts]
    out.update(leftover)
    return out


# wire key -> (part type, the object's payload key, the Part field holding it as compact JSON)
_FUNCTION_PARTS = {"functionCall": ("tool_call", "args", "arguments"),
                   "functionResponse": ("tool_result", "response", "text")}


def _part_reader(blobs: dict[str, bytes]) -> PartOf:
    def part_of(wire: dict[str, Any]) -> Part:
        rest = dict(wire)
        if isinstance(rest.get("text"), str):
            if rest.get("thought") is True:
                del rest["thought"]
                return Part("reasoning", text=rest.pop("text"), signature=take(rest, "thoughtSignature", str),
                            extra=rest or None)
            return Part("text", text=rest.pop("text"), extra=rest or None)
        for key, (kind, payload, field) in _FUNCTION_PARTS.items():
            if isinstance(rest.get(key), dict):
                inner = dict(rest.pop(key))
                value = take(inner, payload, dict)
                return Part(kind, tool_name=take(inner, "name", str), call_id=take(inner, "id", str),
                            **{field: None if value is None else dump_arguments(value)}, extra=_with(rest, key, inner))
        image = _image(rest, blobs)
        return image if image is not None else Part("other", extra=dict(wire))

    return part_of


def _with(rest: dict[str, Any], key: str, inner: dict[str, Any]) -> dict[str, Any] | None:
    """A part's extra: its leftover keys, and what is left of its inner object under `key`."""
    if inner:
        rest[key] = inner
    return rest or None


def _image(rest: dict[str, Any], blobs: dict[str, bytes]) -> Part | None:
    inline, file = rest.get("inlineData"), rest.get("fileData")
    if isinstance(inline, dict) and inline.keys() == {"mimeType", "data"} and _is_image(inline["mimeType"]):
        digest = blob_from_base64(inline["data"], blobs)
        if digest is not None:
            del rest["inlineData"]
            return Part("image", blob_hash=digest, media_type=inline["mimeType"], extra=rest or None)
    if isinstance(file, dict) and file.keys() == {"mimeType", "fileUri"} and _is_image(file["mimeType"]) \
            and isinstance(file["fileUri"], str):
        del rest["fileData"]
        return Part("image", url=file["fileUri"], media_type=file["mimeType"], extra=rest or None)
    return None


def _is_image(mime: Any) -> bool:
    return isinstance(mime, str) and mime.startswith("image/")


def _block_writer(blobs: Mapping[str, bytes]) -> BlockOf:
    def block_of(part: Part) -> dict[str, Any]:
        rest = dict(part.extra or {})
        if part.type == "text":
            return {"text": part.text, **rest}
        if part.type == "reasoning":
            return block(rest, text=part.text, thought=True, thoughtSignature=part.signature)
        for key, (kind, payload, field) in _FUNCTION_PARTS.items():
            if part.type == kind:
                value = getattr(part, field)
                inner = block(rest.pop(key, None), id=part.call_id, name=part.tool_name,
                              **{payload: None if value is None else json.loads(value)})
                return {key: inner, **rest}
        if part.type == "image" and part.blob_hash is not None:
            return {"inlineData": {"mimeType": part.media_type, "data": base64_of(blobs, part.blob_hash)}, **rest}
        if part.type == "image":
            return {"fileData": {"mimeType": part.media_type, "fileUri": part.url}, **rest}
        return rest

    return block_of


# -- streams --------------------------------------------------------------------

class GeminiStream(StreamState):
    """Reassembles `streamGenerateContent` chunks into the `GenerateContentResponse` the plain call returns.

    Top-level fields and each candidate's fields keep their latest non-null
    value (usage is cumulative); parts append, text continuing text as the
    module docstring says. An `{"error": ...}` frame is the stream's failure.
    """

    def __init__(self) -> None:
        super().__init__()
        self._head: dict[str, Any] = {}
        self._candidates: dict[int, dict[str, Any]] = {}
        self._parts: dict[int, list[dict[str, Any]]] = {}
        self._text = Fragments()  # (candidate, part position) -> a text part's pieces
        self._error_body: dict[str, Any] | None = None

    def feed(self, event: SSEEvent) -> None:
        data = self.load(event)
        if data is None:
            return
        if data.get("error") is not None:
            self._error_body = data
            self.note_error(_describe(data["error"]))
            return
        for key, value in data.items():
            if key != "candidates":
                keep_latest(self._head, key, value)
        for candidate in dict_list(data.get("candidates")) or ():
            self._feed_candidate(candidate)

    def _feed_candidate(self, candidate: dict[str, Any]) -> None:
        index = candidate.get("index") if isinstance(candidate.get("index"), int) else 0
        fields = self._candidates.setdefault(index, {})
        for key, value in candidate.items():
            if key == "content" and isinstance(value, dict):
                content = fields.setdefault("content", {})
                for name, item in value.items():
                    if name == "parts" and isinstance(item, list):
                        self._add_parts(index, item)
                    else:
                        keep_latest(content, name, item)
            else:
                keep_latest(fields, key, value)
        if fields.get("finishReason"):
            self.done = True

    def _add_parts(self, index: int, parts: list[Any]) -> None:
        built = self._parts.setdefault(index, [])
        for part in parts:
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("text"), str):
                if part["text"]:
                    self.first_token_seen = True
                last = built[-1] if built else None
                if (last is not None and isinstance(last.get("text"), str) and "thoughtSignature" not in last
                        and last.get("thought") is part.get("thought")):
                    self._text.add((index, len(built) - 1), part["text"])
                    last.update((key, value) for key, value in part.items() if key != "text")
                    continue
                self._text.add((index, len(built)), part["text"])
            elif "functionCall" in part:
                self.first_token_seen = True
            built.append(dict(part))

    def result(self) -> dict[str, Any]:
        if not self._head and not self._candidates:
            return dict(self._error_body) if self._error_body else {}
        body = dict(self._head)
        body["candidates"] = [self._built(index) for index in sorted(self._candidates)]
        return body

    def _built(self, index: int) -> dict[str, Any]:
        candidate = dict(self._candidates[index])
        content = dict(candidate.get("content") or {})
        content["parts"] = [self._built_part(index, position, part)
                            for position, part in enumerate(self._parts.get(index, []))]
        candidate["content"] = content
        return candidate

    def _built_part(self, index: int, position: int, part: dict[str, Any]) -> dict[str, Any]:
        built = dict(part)
        text = self._text.get((index, position))
        if text is not None:
            built["text"] = text
        return built


CODEC = GeminiCodec()
