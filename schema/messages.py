"""The canonical message model every API normalises into.

Anthropic Messages, OpenAI Responses and OpenAI Chat Completions all become a
list of `Message`s, each an ordered tuple of `Part`s. A part is the unit the
store deduplicates: harnesses resend the whole history on every call, so a part
is written once per session (keyed by `Part.hash`) and calls reference it.

Vendor details a chat template does not need but a faithful re-render does
(cache_control, item ids, citations, server-tool blocks) ride in `Part.extra`
and `Message.extra` as plain JSON-able dicts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "developer", "user", "assistant", "tool"]
PartType = Literal["text", "reasoning", "tool_call", "tool_result", "image", "other"]
PART_TYPES: tuple[str, ...] = ("text", "reasoning", "tool_call", "tool_result", "image", "other")


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the form every hash is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Part:
    """One content part of a message.

    - text:        `text`
    - reasoning:   `text` (may be empty), `signature` (Anthropic signature,
                   Responses encrypted_content), `redacted` for redacted_thinking
    - tool_call:   `tool_name`, `call_id`, `arguments` (the JSON string as sent)
    - tool_result: `call_id`, `text` (string content) or `content` (list of
                   nested parts for rich results), `is_error`
    - image:       `blob_hash`, `media_type` (bytes live in the blobs table)
                   or `url` for images passed by reference; `width` and `height`
                   in pixels when the recorder read them (they stay when
                   `forge-record --images hash-only` leaves the bytes out)
    - other:       anything unknown, kept whole in `extra`
    """

    type: PartType
    text: str | None = None
    signature: str | None = None
    redacted: bool = False
    tool_name: str | None = None
    call_id: str | None = None
    arguments: str | None = None
    is_error: bool | None = None
    content: tuple[Part, ...] | None = None
    blob_hash: str | None = None
    media_type: str | None = None
    url: str | None = None
    width: int | None = None
    height: int | None = None
    extra: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that are set, so hashes do not change as fields are added."""
        out: dict[str, Any] = {"type": self.type}
        for name in ("text", "signature", "tool_name", "call_id", "arguments", "is_error",
                     "blob_hash", "media_type", "url", "width", "height", "extra"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.redacted:
            out["redacted"] = True
        if self.content is not None:
            out["content"] = [p.to_dict() for p in self.content]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Part:
        kwargs = dict(data)
        if kwargs.get("content") is not None:
            kwargs["content"] = tuple(cls.from_dict(p) for p in kwargs["content"])
        return cls(**kwargs)

    def hash(self, role: str) -> str:
        """Content hash of this part in a message of `role`."""
        return sha256_hex(canonical_json({"role": role, **self.to_dict()}))


@dataclass(frozen=True)
class Message:
    role: Role
    parts: tuple[Part, ...]
    extra: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "parts": [p.to_dict() for p in self.parts]}
        if self.extra:
            out["extra"] = self.extra
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        return cls(role=data["role"], parts=tuple(Part.from_dict(p) for p in data["parts"]),
                   extra=data.get("extra"))

    def text(self) -> str:
        """Concatenated text parts: what a reader of the transcript sees."""
        return "".join(p.text or "" for p in self.parts if p.type == "text")


@dataclass
class Exchange:
    """One model call, normalised: what was asked and what came back.

    `params` is the request body minus its messages/system/input (model, tools,
    max_tokens, sampling, stream, ...), so `params` + `input` re-renders the
    request. `tools` is the tool list offered, each definition with every key
    the harness sent in its order (`name`, `description`, `parameters` as the
    JSON schema, `strict`, ...; `type` for tools that are not plain functions),
    for coverage analysis and chat templates (`schema.chat.chat_tools`). `blobs` holds the
    bytes of images met while parsing, keyed by the hash their parts carry.
    """

    input: list[Message] = field(default_factory=list)
    output: list[Message] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    model_requested: str | None = None
    model_returned: str | None = None
    stop_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    malformed_tool_calls: int | None = None  # serve mode: call-shaped text the policy's format could not read
    blobs: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Usage:
    """Token counts in one convention whatever the API.

    `input_tokens` counts uncached input only (Anthropic's convention; OpenAI's
    prompt_tokens minus cached_tokens), so total input is
    input + cache_read + cache_write.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
