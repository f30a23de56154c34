"""Message content on call spans (`--otel-content`): the GenAI conventions' opt-in content attributes.

Off by default, as the conventions ask. When on, a call span carries
`gen_ai.input.messages` (only the messages this call adds to its segment's
conversation: the harness resends the whole history on every call, the
previous calls' spans already hold the rest), `gen_ai.output.messages` (with
the finish reason), and on a segment's first call `gen_ai.system_instructions`
and `gen_ai.tool.definitions` (the harness's definitions as it sent them).
Everything comes from the recorded rows, which the recorder redacted before
writing (keys, tokens, `--redact-rules`). Images are references, never bytes:
`{"type": "uri", "modality": "image", "uri": "forgerl-blob:sha256:<hex>"}` (the
dataset's `blobs`), or the URL the harness sent. Values are JSON text, each cut
at `OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT` / `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`
characters (default 32768: the size many backends index); the keys cut are
listed in `forgerl.content.truncated`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from forgerl.errors import UserError
from forgerl.schema.messages import Message, Part

LIMIT_ENVS = ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")  # first set wins
DEFAULT_LIMIT = 32768
INSTRUCTIONS = ("system", "developer")


def value_limit(env: Mapping[str, str] | None = None) -> int:
    """The content attributes' length limit, from the standard variables (characters). The environment is read
    when called (`os.environ` as it is then: a library may have replaced the object since import)."""
    env = os.environ if env is None else env
    for var in LIMIT_ENVS:
        if env.get(var):
            if not env[var].isdigit() or int(env[var]) < 1:
                raise UserError(f"${var}={env[var]!r}: give the attribute length limit as a positive integer")
            return int(env[var])
    return DEFAULT_LIMIT


def _arguments(text: str | None) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return text


def part_json(part: Part) -> dict[str, Any]:
    """A part in the conventions' form."""
    if part.type in ("text", "reasoning"):
        return {"type": part.type, "content": part.text or ""}
    if part.type == "tool_call":
        return {"type": "tool_call", "id": part.call_id, "name": part.tool_name,
                "arguments": _arguments(part.arguments)}
    if part.type == "tool_result":
        response: Any = part.text if part.content is None else [part_json(p) for p in part.content]
        return {"type": "tool_call_response", "id": part.call_id, "response": response}
    if part.type == "image":
        uri = f"forgerl-blob:sha256:{part.blob_hash}" if part.blob_hash else part.url
        return {"type": "uri", "modality": "image", "mime_type": part.media_type, "uri": uri}
    return {"type": part.type}


def message_json(message: Message, finish_reason: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "parts": [part_json(p) for p in message.parts]}
    if finish_reason is not None:
        out["finish_reason"] = finish_reason
    return out


def content_attributes(inputs: Sequence[Message], outputs: Sequence[Message], new_from: int,
                       row: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """The content attributes of one call: its new input messages (from `new_from` on), its output, and, on a
    segment's first call (`new_from` 0), the instructions and tool definitions."""
    lead = 0
    while lead < len(inputs) and inputs[lead].role in INSTRUCTIONS:
        lead += 1
    values: dict[str, Any] = {
        "gen_ai.input.messages": [message_json(m) for m in inputs[max(new_from, lead):]],
        "gen_ai.output.messages": [message_json(m, row.get("stop_reason")) for m in outputs],
    }
    if new_from == 0 and lead:
        values["gen_ai.system_instructions"] = [part_json(p) for m in inputs[:lead] for p in m.parts]
    if new_from == 0 and row.get("tools"):
        values["gen_ai.tool.definitions"] = json.loads(row["tools"])
    out: dict[str, Any] = {}
    cut = []
    for key, value in values.items():
        text = json.dumps(value, ensure_ascii=False)
        if len(text) > limit:
            text = text[:limit]
            cut.append(key)
        out[key] = text
    if cut:
        out["forgerl.content.truncated"] = cut
    return out
