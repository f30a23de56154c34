"""What the four codecs share: the round-trip conventions and the stream plumbing.

Round trip. `render_request(parse_request(body))` must give back `body`, so
every codec follows the same rules:

1. A wire key moves into a `Part` field only when its value has the type that
   field holds (`take`); a null, an odd shape or a key no field holds stays
   verbatim in `Part.extra` (block-level keys) or `Message.extra`
   (message-level keys), and render writes it back as it was. Message-bearing
   body keys (messages, system, input, prompt) move only when they have a
   shape the codec takes apart, never as an empty list; otherwise they stay
   in `params`.
2. Facts about the wire's *layout* rather than its content go in
   `Message.extra["forge"]` (`HINTS`): content sent as a bare string
   (`string_content`), Anthropic-style `cache_control` markers keyed by block
   index, and codec-specific hints documented in each codec. Part hashes (the
   store's deduplication key) therefore do not change when Claude Code moves
   its cache breakpoint to the newest message.

Errors. A codec never raises on a JSON object, whatever its shape (rule 1),
nor an assembler on any frame: what the upstream sent wrong is noted as the
call's error (`StreamState.note_error`, `error_of`). So the recorder takes a
codec that raises for a bug in forgerl, not bad input (`capture.CodecBug`):
the call fails its rollout's flush barrier instead of being stored quietly.

Streams. `StreamState` holds the flags every assembler exposes and reads
frames tolerantly; `Fragments` joins streamed text once, not per delta
(`+=` on a growing string is quadratic); `ChoiceStream` is the `choices`-keyed
chunk stream that Chat Completions and legacy Completions share.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping
from typing import Any

from forgerl.recorder.apis.answer import Answer, Frame
from forgerl.recorder.policy_tokens import TOKENS_KEY, read_token_extension
from forgerl.recorder.sse import SSEEvent
from forgerl.schema.messages import Exchange, Message, Part, Role, Usage, canonical_json, sha256_hex

HINTS = "forge"
"""The `Message.extra` key under which codecs keep their layout hints."""

PartOf = Callable[[dict[str, Any]], Part]
BlockOf = Callable[[Part], dict[str, Any]]


# -- round-trip helpers -------------------------------------------------------

def take(obj: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """Pop `obj[key]` if it is a `kind`, else leave it in `obj` (to ride in extra) and return None."""
    value = obj.get(key)
    if isinstance(value, kind):
        return obj.pop(key)
    return None


def take_role(obj: dict[str, Any], roles: Collection[str], fallback: Role) -> Role:
    """Pop a known role; an unknown one stays in `obj`, whose keys render after (and over) the role."""
    value = obj.get("role")
    if value in roles:
        return obj.pop("role")
    return fallback


def dict_list(value: Any, empty_ok: bool = False) -> list[dict[str, Any]] | None:
    """`value` if it is a list of objects: the only list shape the codecs take apart.

    Empty lists are refused unless `empty_ok`: where render could not tell an
    empty list from an absent key (a message's content), they stay verbatim.
    """
    if isinstance(value, list) and (value or empty_ok) and all(isinstance(item, dict) for item in value):
        return value
    return None


def block(extra: Mapping[str, Any] | None, **fields: Any) -> dict[str, Any]:
    """A wire object rebuilt from a part: the fields that are set, then the verbatim extra."""
    out = {key: value for key, value in fields.items() if value is not None}
    if extra:
        out.update(extra)
    return out


def parse_content(content: Any, part_of: PartOf) -> tuple[list[Part], dict[str, Any]] | None:
    """A message's content as parts plus layout hints, or None when it has no shape we take apart."""
    if isinstance(content, str):
        return [Part("text", text=content)], {"string_content": True}
    blocks = dict_list(content)
    if blocks is None:
        return None
    parts: list[Part] = []
    marks: dict[str, Any] = {}
    for index, item in enumerate(blocks):
        if "cache_control" in item:
            item = dict(item)
            marks[str(index)] = item.pop("cache_control")
        parts.append(part_of(item))
    return parts, ({"cache_control": marks} if marks else {})


def render_content(parts: Iterable[Part], hints: Mapping[str, Any], block_of: BlockOf) -> str | list[dict[str, Any]]:
    """Inverse of `parse_content`."""
    parts = list(parts)
    if hints.get("string_content") and len(parts) == 1 and parts[0].type == "text" and parts[0].text is not None:
        return parts[0].text
    marks = hints.get("cache_control") or {}
    blocks = []
    for index, part in enumerate(parts):
        item = block_of(part)
        if str(index) in marks:
            item["cache_control"] = marks[str(index)]
        blocks.append(item)
    return blocks


def message_extra(leftover: Mapping[str, Any], hints: Mapping[str, Any]) -> dict[str, Any] | None:
    """`Message.extra`: the wire message's leftover keys, plus the layout hints under `HINTS`."""
    extra = dict(leftover)
    if hints:
        extra[HINTS] = dict(hints)
    return extra or None


def split_extra(extra: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Inverse of `message_extra`: (leftover keys, hints)."""
    leftover = dict(extra or {})
    return leftover, leftover.pop(HINTS, None) or {}


def split_message(wire: dict[str, Any], roles: Collection[str], fallback: Role,
                  part_of: PartOf) -> tuple[Role, list[Part], dict[str, Any], dict[str, Any]]:
    """A wire message with `role` and `content`: (role, content parts, leftover keys, hints)."""
    rest = dict(wire)
    role = take_role(rest, roles, fallback)
    parsed = parse_content(rest.get("content"), part_of)
    if parsed is None:
        return role, [], rest, {}
    del rest["content"]
    return role, parsed[0], rest, parsed[1]


def join_message(role: str, content: list[Part], leftover: Mapping[str, Any], hints: Mapping[str, Any],
                 block_of: BlockOf) -> dict[str, Any]:
    """Inverse of `split_message`: content is written back only if parsing took it (it has parts)."""
    out: dict[str, Any] = {"role": role}
    if content:
        out["content"] = render_content(content, hints, block_of)
    out.update(leftover)
    return out


def params_without(body: Mapping[str, Any], moved: Iterable[str]) -> dict[str, Any]:
    moved = set(moved)
    return {key: value for key, value in body.items() if key not in moved}


def dump_arguments(value: Any) -> str:
    """Tool input sent as a JSON object (Anthropic, shell actions) as the string a Part carries."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def tool_spec(definition: Mapping[str, Any], kind: str | None = None) -> dict[str, Any]:
    """One entry of `Exchange.tools`: the tool's definition with every key the harness sent, in its order (the
    chat template prints them all); `kind` is the wire type of tools that are not plain functions."""
    spec = dict(definition)
    if kind is not None:
        spec["type"] = kind
    return spec


# -- blobs --------------------------------------------------------------------

_DATA_URL = re.compile(r"data:([^;,]+);base64,(.*)", re.DOTALL)


def blob_from_base64(data: Any, blobs: dict[str, bytes]) -> str | None:
    """Store decoded bytes and return their hash; None unless `data` is base64 that re-encodes to itself."""
    if not isinstance(data, str):
        return None
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
    if base64.b64encode(raw).decode("ascii") != data:
        return None
    digest = sha256_hex(raw)
    blobs[digest] = raw
    return digest


def base64_of(blobs: Mapping[str, bytes], digest: str) -> str:
    try:
        raw = blobs[digest]
    except KeyError:
        raise KeyError(f"blob {digest} is missing from the blobs passed to render_request") from None
    return base64.b64encode(raw).decode("ascii")


def image_part(url: Any, blobs: dict[str, bytes], extra: dict[str, Any] | None) -> Part:
    """An image given by URL (OpenAI APIs): `data:` URLs go to blobs, others stay URLs."""
    match = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
    if match is not None:
        digest = blob_from_base64(match.group(2), blobs)
        if digest is not None:
            return Part("image", blob_hash=digest, media_type=match.group(1), extra=extra or None)
    return Part("image", url=url, extra=extra or None)


def image_url(part: Part, blobs: Mapping[str, bytes]) -> str | None:
    """Inverse of `image_part`."""
    if part.blob_hash is not None:
        return f"data:{part.media_type};base64,{base64_of(blobs, part.blob_hash)}"
    return part.url


# -- responses ----------------------------------------------------------------

def describe_error(error: Any) -> str:
    """One line for an API error object: "type: message"."""
    if isinstance(error, dict):
        kind = error.get("type") or error.get("code")
        message = error.get("message")
        if message:
            return f"{kind}: {message}" if kind else str(message)
        return canonical_json(error)
    return str(error)


def error_of(body: Mapping[str, Any]) -> str | None:
    """The error a body carries: Anthropic `{"type": "error", "error": ...}` or OpenAI `{"error": ...}`."""
    error = body.get("error")
    if error:
        return describe_error(error)
    if body.get("type") == "error":
        return describe_error(body)
    return None


def _detail(usage: Mapping[str, Any], key: str, name: str) -> Any:
    details = usage.get(key)
    return details.get(name) if isinstance(details, dict) else None


def openai_usage(usage: Any, prompt_key: str, completion_key: str) -> Usage | None:
    """OpenAI usage (prompt count includes cached tokens) in the `Usage` convention (uncached input)."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get(prompt_key)
    cached = _detail(usage, f"{prompt_key}_details", "cached_tokens")
    uncached = prompt - cached if isinstance(prompt, int) and isinstance(cached, int) else prompt
    return Usage(input_tokens=uncached, output_tokens=usage.get(completion_key), cache_read_tokens=cached,
                 reasoning_tokens=_detail(usage, f"{completion_key}_details", "reasoning_tokens"))


def fill_from_choices(body: Mapping[str, Any], exchange: Exchange,
                      message_of: Callable[[dict[str, Any]], Message],
                      logprobs_of: Callable[[Any], list[float] | None]) -> None:
    """`parse_response` for the `choices` APIs (chat, completions), including vLLM's token ids.

    One output message per choice, by index; stop reason, token ids and
    logprobs are those of the first choice (the Exchange holds one sequence);
    the `forge` extension a forgerl gateway adds (`policy_tokens.py`) is read too.
    """
    exchange.error = error_of(body)
    exchange.model_returned = body.get("model")
    exchange.usage = openai_usage(body.get("usage"), "prompt_tokens", "completion_tokens")
    choices = sorted(dict_list(body.get("choices")) or [], key=lambda choice: choice.get("index") or 0)
    exchange.output = [message_of(choice) for choice in choices]
    first = choices[0] if choices else {}
    exchange.stop_reason = first.get("finish_reason")
    exchange.completion_token_ids = first.get("token_ids")
    exchange.completion_logprobs = logprobs_of(first.get("logprobs"))
    exchange.prompt_token_ids = (body.get("prompt_token_ids") or first.get("prompt_token_ids")
                                 or exchange.prompt_token_ids)
    read_token_extension(body, exchange)  # a forgerl gateway's count of malformed tool calls


# -- streams ------------------------------------------------------------------

class StreamState:
    """The flags every assembler exposes, and the tolerant read every frame starts with."""

    error: str | None
    done: bool
    first_token_seen: bool

    def __init__(self) -> None:
        self.error: str | None = None
        self.done = False
        self.first_token_seen = False
        self._frames = 0

    def note_error(self, message: str) -> None:
        """Keep the first problem: later ones are usually its consequences."""
        if self.error is None:
            self.error = message

    def load(self, event: SSEEvent) -> dict[str, Any] | None:
        """The frame's JSON object, or None (noted in `error`) when it is not one.

        The note names the frame by number, not content: error strings are
        stored unredacted, the raw stream (redacted) has the frame itself.
        """
        self._frames += 1
        try:
            data = json.loads(event.data)
        except json.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            self.note_error(f"malformed SSE frame #{self._frames}: not a JSON object")
            return None
        return data


class Fragments:
    """Strings that arrive in pieces, keyed by where they belong; joined when read."""

    def __init__(self) -> None:
        self._pieces: dict[Hashable, list[str]] = {}

    def add(self, key: Hashable, piece: Any) -> None:
        if isinstance(piece, str):
            self._pieces.setdefault(key, []).append(piece)

    def set(self, key: Hashable, text: Any) -> None:
        """The full value (a `.done` event): it replaces the pieces so far."""
        if isinstance(text, str):
            self._pieces[key] = [text]

    def get(self, key: Hashable) -> str | None:
        pieces = self._pieces.get(key)
        if pieces is None:
            return None
        if len(pieces) > 1:
            pieces[:] = ["".join(pieces)]
        return pieces[0]

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._pieces))


def keep_latest(target: dict[str, Any], key: str, value: Any) -> None:
    """Stream fields repeat or arrive once; a later null (vLLM's `"usage": null`) never erases a value."""
    if value is not None or key not in target:
        target[key] = value


def extend(acc: Any, items: list[Any]) -> list[Any]:
    """Append streamed list items to an accumulator this stream owns."""
    if not isinstance(acc, list):
        acc = []
    acc.extend(items)
    return acc


def merge_logprobs(acc: Any, delta: Any) -> Any:
    """Per-chunk logprobs objects into one: their lists concatenate (chat `content`, completions `tokens`, ...)."""
    if not isinstance(delta, dict):
        return delta if acc is None else acc
    acc = acc if isinstance(acc, dict) else {}
    for key, value in delta.items():
        if isinstance(value, list):
            acc[key] = extend(acc.get(key), value)
        else:
            keep_latest(acc, key, value)
    return acc


class ChoiceStream(StreamState):
    """Chat and legacy completions streams: `data:` chunks of `choices` keyed by index,
    an optional usage chunk with `choices: []`, an `{"error": ...}` chunk on failure, `data: [DONE]`.

    Top-level and per-choice fields keep their latest non-null value; vLLM's
    per-chunk `token_ids` and the logprobs lists concatenate. Subclasses
    accumulate what a choice's `delta_key` carries and rebuild the choice.
    """

    body_object: str
    delta_key: str

    def __init__(self) -> None:
        super().__init__()
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._error_body: dict[str, Any] | None = None

    def feed(self, event: SSEEvent) -> None:
        if event.data.strip() == "[DONE]":
            self.done = True
            return
        chunk = self.load(event)
        if chunk is None:
            return
        if chunk.get("error") is not None:
            self._error_body = chunk
            self.note_error(describe_error(chunk["error"]))
            return
        for key, value in chunk.items():
            if key != "choices":
                keep_latest(self._head, key, value)
        for choice in dict_list(chunk.get("choices")) or ():
            self._feed_choice(choice)

    def _feed_choice(self, choice: dict[str, Any]) -> None:
        index = choice.get("index")
        index = index if isinstance(index, int) else 0
        fields = self._choices.setdefault(index, {})
        for key, value in choice.items():
            if key == self.delta_key:
                self.feed_delta(index, value)
            elif key == "token_ids" and isinstance(value, list):
                fields[key] = extend(fields.get(key), value)
            elif key == "logprobs":
                fields[key] = merge_logprobs(fields.get(key), value)
            else:
                keep_latest(fields, key, value)

    def feed_delta(self, index: int, delta: Any) -> None:
        raise NotImplementedError

    def built_choice(self, index: int, fields: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def result(self) -> dict[str, Any]:
        if not self._head and not self._choices:
            return dict(self._error_body) if self._error_body else {}
        body = {**self._head, "object": self.body_object}
        body["choices"] = [self.built_choice(index, _copied(self._choices[index]))
                           for index in sorted(self._choices)]
        return body


def _copied(fields: dict[str, Any]) -> dict[str, Any]:
    """A choice's fields with the accumulators copied, so a result does not change as the stream goes on."""
    out = dict(fields)
    if isinstance(out.get("token_ids"), list):
        out["token_ids"] = list(out["token_ids"])
    if isinstance(out.get("logprobs"), dict):
        out["logprobs"] = {k: list(v) if isinstance(v, list) else v for k, v in out["logprobs"].items()}
    return out


# -- answers ------------------------------------------------------------------

def render_openai_usage(usage: Usage, prompt_key: str, completion_key: str) -> dict[str, Any]:
    """Inverse of `openai_usage`. The prompt count includes cached input and cache writes (OpenAI does
    not count writes apart, so they read back as uncached input); details only where counted."""
    prompt = (usage.input_tokens or 0) + (usage.cache_read_tokens or 0) + (usage.cache_write_tokens or 0)
    completion = usage.output_tokens or 0
    out: dict[str, Any] = {prompt_key: prompt, completion_key: completion, "total_tokens": prompt + completion}
    if usage.cache_read_tokens is not None:
        out[f"{prompt_key}_details"] = {"cached_tokens": usage.cache_read_tokens}
    if usage.reasoning_tokens is not None:
        out[f"{completion_key}_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out


class ChoiceWriter:
    """The inverse of `ChoiceStream`: an answer as one choice of a chat or legacy completions body, or chunks.

    vLLM's token fields ride as vLLM sends them: the prompt's ids once (on the
    body, or on the choice for completions), the completion's ids and logprobs
    with the finishing choice; what vLLM has no field for (the malformed tool
    call count) in the `forge` extension beside them (`policy_tokens.py`). A
    stream ends with a usage chunk when the request asked for one (`stream_options.include_usage`), then ``[DONE]``.
    """

    def __init__(self, answer: Answer, request: Mapping[str, Any], id_prefix: str, objects: tuple[str, str],
                 finish: str, logprobs: dict[str, Any] | None, prompt_on_choice: bool = False) -> None:
        self.answer, self.finish, self.logprobs = answer, finish, logprobs
        self._id, self._objects = id_prefix + answer.id, objects
        self._prompt_on_choice = prompt_on_choice
        self._prompt_sent = answer.prompt_token_ids is None
        options = request.get("stream_options")
        self._include_usage = isinstance(options, dict) and options.get("include_usage") is True

    def body(self, **fields: Any) -> dict[str, Any]:
        return self._envelope(False, [self._choice(fields, True)], usage=self._usage(), **self._extension())

    def ends(self, answer: Answer, finish: str, logprobs: dict[str, Any] | None) -> None:
        """A streamed answer is whole: its last chunks say how it ended (the stream was begun from its head)."""
        self.answer, self.finish, self.logprobs = answer, finish, logprobs

    def chunk(self, tokens: bool = False, **fields: Any) -> Frame:
        """A chunk of one choice's `fields`; `tokens`: they carry generated text."""
        return Frame(None, self._envelope(True, [self._choice(fields, False)]), tokens)

    def end(self, **fields: Any) -> Iterator[Frame]:
        """The finishing chunk, the usage chunk if asked for, ``[DONE]``."""
        yield Frame(None, self._envelope(True, [self._choice(fields, True)], **self._extension()))
        if self._include_usage:
            yield Frame(None, self._envelope(True, [], usage=self._usage()))
        yield Frame(None, "[DONE]")

    def _envelope(self, chunk: bool, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        head = {"id": self._id, "object": self._objects[chunk], "created": self.answer.created,
                "model": self.answer.model}
        if not self._prompt_sent and not self._prompt_on_choice:
            head["prompt_token_ids"] = self._prompt_ids()
        return {**head, "choices": choices, **extra}

    def _choice(self, fields: dict[str, Any], final: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, **fields, "logprobs": self.logprobs if final else None,
                                  "finish_reason": self.finish if final else None}
        if final and self.answer.completion_token_ids is not None:
            choice["token_ids"] = list(self.answer.completion_token_ids)
        if not self._prompt_sent and self._prompt_on_choice:
            choice["prompt_token_ids"] = self._prompt_ids()
        return choice

    def _extension(self) -> dict[str, Any]:
        if self.answer.completion_token_ids is None:
            return {}
        return {TOKENS_KEY: {"malformed_tool_calls": self.answer.turn.malformed}}

    def _prompt_ids(self) -> list[int]:
        self._prompt_sent = True
        return list(self.answer.prompt_token_ids or [])

    def _usage(self) -> dict[str, Any]:
        return render_openai_usage(self.answer.usage, "prompt_tokens", "completion_tokens")
