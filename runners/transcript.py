"""The OpenClaw-style transcript a QwenClawBench `grade()` reads, built from a rollout's recorded calls.

Harnesses resend the whole history on every call, so the main thread's last
call (`forgerl.schema.segments.main_thread`: not a subagent's, nor the one
Qwen Code's memory extractor makes after the final answer), its full input
plus its output, is the conversation as the main agent last saw it. Its
messages come back through the schema's canonical model
(`call_messages`) and are written out as OpenClaw session events:

    {"type": "message", "message": {"role": "user" | "assistant" | "toolResult", "content": [...]}}

with content parts `{"type": "text"}`, `{"type": "thinking"}` and
`{"type": "toolCall", "id", "name", "arguments"}`; each tool result is its own
`toolResult` message (`toolCallId`, `isError`). System and developer
messages are not part of an OpenClaw transcript and are left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forgerl.schema.messages import Message, Part
from forgerl.schema.records import call_messages
from forgerl.schema.segments import main_thread, placed, recorded_order
from forgerl.schema.sessions import session_rows


def _arguments(raw: str | None) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return raw  # a model's malformed arguments are kept as it sent them


def _result_text(part: Part) -> str:
    if part.text is not None:
        return part.text
    return "".join(p.text or "" for p in part.content or () if p.type == "text")


def _event(role: str, content: list[dict], **extra: Any) -> dict:
    return {"type": "message", "message": {"role": role, "content": content, **extra}}


def openclaw_events(messages: list[Message]) -> list[dict]:
    """Canonical messages as OpenClaw session events."""
    events: list[dict] = []
    for message in messages:
        if message.role in ("system", "developer"):
            continue
        content: list[dict] = []
        for part in message.parts:
            if part.type == "tool_result":
                events.append(_event("toolResult", [{"type": "text", "text": _result_text(part)}],
                                     toolCallId=part.call_id, isError=bool(part.is_error)))
            elif part.type == "text":
                content.append({"type": "text", "text": part.text or ""})
            elif part.type == "reasoning":
                content.append({"type": "thinking", "thinking": part.text or ""})
            elif part.type == "tool_call":
                content.append({"type": "toolCall", "id": part.call_id, "name": part.tool_name,
                                "arguments": _arguments(part.arguments)})
            elif part.type == "image":
                content.append({"type": "image", "mimeType": part.media_type})
        if content:
            role = "assistant" if message.role == "assistant" else "user"
            events.append(_event(role, content))
    return events


def model_turns(root: str | Path, session: str) -> tuple[list[dict], dict[str, str]]:
    """The session's calls that hold a model turn (`placed`), in recording order, and their parts by hash."""
    calls = session_rows(root, "calls", session, ["call_id", "session_id", "t_start", "seq", "segment_index",
                                                  "segment_reason", "parent_segment", "parent_position",
                                                  "input_refs", "input_msg", "input_roles", "input_extra",
                                                  "output_refs", "output_msg", "output_roles", "output_extra"])
    calls = sorted((c for c in calls.to_pylist() if placed(c)), key=recorded_order)
    if not calls:
        return [], {}
    parts = session_rows(root, "messages", session, ["session_id", "part_hash", "part"])
    return calls, dict(zip(parts.column("part_hash").to_pylist(), parts.column("part").to_pylist()))


def recorded_turns(root: str | Path, session: str) -> list[list[Message]]:
    """What the model answered in each of its turns, in order. A harness that rebuilds its prompt at every
    step (browser-use) keeps no earlier answer in its last call's input: only these hold them all."""
    calls, parts = model_turns(root, session)
    return [call_messages(call, parts, "output") for call in calls]


def rollout_messages(root: str | Path, session: str) -> list[Message]:
    """The conversation as the main agent last saw it: the main thread's last call's input and output ([] if
    the session holds no model turn)."""
    calls, parts = model_turns(root, session)
    call = main_thread(calls)
    if call is None:
        return []
    return call_messages(call, parts, "input") + call_messages(call, parts, "output")

