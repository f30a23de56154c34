"""Turning one call into table rows, and table rows back into messages.

`CallRecord` is what producers (the recorder, runners) hand to the writer;
`call_rows` splits it into a `calls` row plus the `messages` and `blobs` rows
not yet written for its session, so each distinct part is stored once.
`load_messages` is the inverse, used by readers that want whole messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

import zstandard

from .messages import Exchange, Message, Part, canonical_json

_ZSTD_LEVEL = 3


def compress(data: bytes | None) -> bytes | None:
    return None if data is None else zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(data)


def decompress(data: bytes | None) -> bytes | None:
    return None if data is None else zstandard.ZstdDecompressor().decompressobj().decompress(data)


@dataclass
class CallRecord:
    """Everything known about one call; unset fields become nulls."""

    call_id: str
    session_id: str
    api: str
    method: str
    path: str
    t_start: datetime
    upstream: str | None = None
    status: int | None = None
    error: str | None = None
    complete: bool = False
    streamed: bool = False
    t_first_byte: datetime | None = None
    t_end: datetime | None = None
    request_headers: dict[str, str] | None = None
    response_headers: dict[str, str] | None = None
    request_raw: bytes | None = None
    response_raw: bytes | None = None
    response: dict[str, Any] | None = None
    exchange: Exchange | None = None
    policy_version: str | None = None
    seq: int = 0
    writer_id: str = ""


def _refs(messages: Iterable[Message]) -> tuple[list[str], list[int], list[str], list[str | None],
                                                  list[tuple[str, Part]]]:
    refs, msg_index, roles, extras, parts = [], [], [], [], []
    for i, message in enumerate(messages):
        roles.append(message.role)
        extras.append(canonical_json(message.extra) if message.extra else None)
        for part in message.parts:
            refs.append(part.hash(message.role))
            msg_index.append(i)
            parts.append((message.role, part))
    return refs, msg_index, roles, extras, parts


def _message_row(part_hash: str, role: str, part: Part, record: CallRecord, direction: str) -> dict:
    return {
        "part_hash": part_hash,
        "session_id": record.session_id,
        "call_id": record.call_id,
        "direction": direction,
        "role": role,
        "part_type": part.type,
        "text": part.text,
        "tool_name": part.tool_name,
        "tool_call_id": part.call_id,
        "arguments": part.arguments,
        "is_error": part.is_error,
        "blob_hash": part.blob_hash,
        "media_type": part.media_type,
        "signature": part.signature,
        "part": canonical_json(part.to_dict()),
    }


def _nested_blob_parts(part: Part) -> Iterable[Part]:
    yield part
    for inner in part.content or ():
        yield from _nested_blob_parts(inner)


def call_rows(record: CallRecord, seen_parts: set[str], seen_blobs: set[str]) -> tuple[dict, list[dict], list[dict]]:
    """Rows for one call; `seen_*` (this session's already-written hashes) are updated."""
    ex = record.exchange or Exchange()
    usage = ex.usage
    in_refs, in_msg, in_roles, in_extra, in_parts = _refs(ex.input)
    out_refs, out_msg, out_roles, out_extra, out_parts = _refs(ex.output)
    message_rows: list[dict] = []
    blob_rows: list[dict] = []
    media_by_blob: dict[str, str | None] = {}
    # Output first: a part the model generated is "output" even if this very
    # call's input already repeats it (it never does, but later calls will).
    for direction, refs, parts in (("output", out_refs, out_parts), ("input", in_refs, in_parts)):
        for part_hash, (role, part) in zip(refs, parts):
            for p in _nested_blob_parts(part):
                if p.blob_hash:
                    media_by_blob[p.blob_hash] = p.media_type
            if part_hash in seen_parts:
                continue
            seen_parts.add(part_hash)
            message_rows.append(_message_row(part_hash, role, part, record, direction))
    for blob_hash, data in ex.blobs.items():
        if blob_hash in seen_blobs:
            continue
        seen_blobs.add(blob_hash)
        blob_rows.append({"blob_hash": blob_hash, "session_id": record.session_id,
                          "media_type": media_by_blob.get(blob_hash), "size": len(data), "data": data})
    row = {
        "call_id": record.call_id,
        "session_id": record.session_id,
        "seq": record.seq,
        "writer_id": record.writer_id,
        "api": record.api,
        "method": record.method,
        "path": record.path,
        "upstream": record.upstream,
        "status": record.status,
        "error": record.error or ex.error,
        "complete": record.complete,
        "streamed": record.streamed,
        "t_start": record.t_start,
        "t_first_byte": record.t_first_byte,
        "t_end": record.t_end,
        "model_requested": ex.model_requested,
        "model_returned": ex.model_returned,
        "stop_reason": ex.stop_reason,
        "input_tokens": usage.input_tokens if usage else None,
        "output_tokens": usage.output_tokens if usage else None,
        "cache_read_tokens": usage.cache_read_tokens if usage else None,
        "cache_write_tokens": usage.cache_write_tokens if usage else None,
        "reasoning_tokens": usage.reasoning_tokens if usage else None,
        "request_headers": _json_or_none(record.request_headers),
        "response_headers": _json_or_none(record.response_headers),
        "request_params": _json_or_none(ex.params if record.exchange else None),
        "tools": _json_or_none(ex.tools if record.exchange else None),
        "request_raw": compress(record.request_raw),
        "response_raw": compress(record.response_raw),
        "response": _json_or_none(record.response),
        "input_refs": in_refs,
        "input_msg": in_msg,
        "input_roles": in_roles,
        "input_extra": in_extra,
        "output_refs": out_refs,
        "output_msg": out_msg,
        "output_roles": out_roles,
        "output_extra": out_extra,
        "prompt_token_ids": ex.prompt_token_ids,
        "completion_token_ids": ex.completion_token_ids,
        "completion_logprobs": ex.completion_logprobs,
        "malformed_tool_calls": ex.malformed_tool_calls,
        "policy_version": record.policy_version,
    }
    return row, message_rows, blob_rows


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


class MessageMemo:
    """Parts and messages rebuilt once per distinct stored form: a harness resends its history on every call,
    so one memo per session turns rebuilding every call's messages from quadratic into linear work."""

    def __init__(self) -> None:
        self.parts: dict[str, Part] = {}
        self.messages: dict[tuple, Message] = {}

    def part(self, part_hash: str, parts_by_hash: Mapping[str, str]) -> Part:
        part = self.parts.get(part_hash)
        if part is None:
            part = self.parts[part_hash] = Part.from_dict(json.loads(parts_by_hash[part_hash]))
        return part

    def message(self, form: tuple, parts_by_hash: Mapping[str, str]) -> Message:
        """The message of a stored form (see `message_forms`)."""
        message = self.messages.get(form)
        if message is None:
            role, extra, *hashes = form
            parts = tuple(self.part(h, parts_by_hash) for h in hashes)
            message = self.messages[form] = Message(role=role, parts=parts, extra=json.loads(extra) if extra else None)
        return message


def message_forms(refs: list[str], msg_index: list[int], roles: list[str],
                  extras: list[str | None] | None = None) -> list[tuple]:
    """Each message's stored form, `(role, extra JSON, *part hashes)`: equal forms are equal messages, so
    a call's history can be compared with the previous call's without rebuilding either."""
    grouped: list[list[str]] = [[] for _ in roles]
    for part_hash, i in zip(refs, msg_index):
        grouped[i].append(part_hash)
    return [(role, extra, *hashes) for role, extra, hashes in zip(roles, extras or [None] * len(roles), grouped)]


def call_forms(call: Mapping, direction: str = "input") -> list[tuple]:
    """A `calls` row's input or output message forms."""
    return message_forms(call[f"{direction}_refs"], call[f"{direction}_msg"], call[f"{direction}_roles"],
                         call[f"{direction}_extra"])


def messages_from_refs(refs: list[str], msg_index: list[int], roles: list[str],
                       parts_by_hash: Mapping[str, str], extras: list[str | None] | None = None,
                       memo: MessageMemo | None = None) -> list[Message]:
    """Rebuild a call's messages from its refs and a {part_hash: part JSON} map (sharing `memo`'s objects)."""
    memo = memo or MessageMemo()
    return [memo.message(form, parts_by_hash) for form in message_forms(refs, msg_index, roles, extras)]


def call_messages(call: Mapping, parts_by_hash: Mapping[str, str], direction: str = "input",
                  memo: MessageMemo | None = None) -> list[Message]:
    """A `calls` row's input or output messages, whole."""
    return messages_from_refs(call[f"{direction}_refs"], call[f"{direction}_msg"], call[f"{direction}_roles"],
                              parts_by_hash, call[f"{direction}_extra"], memo)
