"""Rebuilding conversation threads from a session's calls.

Harnesses resend the whole history on every call, so a call *continues* a
segment when its input starts with that segment's last input + last output
(followed by new tool results / user turns) and it offers the same tools.
Anything else starts a new segment, linked to the segment it came from:

- `compaction`: a user message of the new input quotes an earlier segment's
  last answer (the summary the model wrote), as Claude Code does;
- `subagent`: a fresh conversation while another segment waits on a call to
  a subagent tool (Claude Code's `Agent`, formerly `Task`), interleaved;
- `tools_changed`: the history continues but the offered tools differ;
- `edited_history`: the input shares a prefix with a segment, then differs,
  or (a resumed harness rewriting its first messages) shares at least two
  messages with it;
- `new_conversation` / `start`: nothing in common with what came before.

Messages are compared by their chat-template form without reasoning (some
harnesses drop earlier reasoning when resending, which does not change the
conversation) and without vendor hints (cache_control moves every call).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forgerl.schema.chat import to_chat_messages
from forgerl.schema.messages import Message, canonical_json, sha256_hex

from .source import Call, Session

SUBAGENT_TOOLS = frozenset({"Agent", "Task"})
_MIN_SUMMARY = 20  # characters: shorter answers are too common to prove a compaction


def message_key(message: Message) -> str:
    chat = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in to_chat_messages([message])]
    return sha256_hex(canonical_json([message.role, chat]))


@dataclass
class Segment:
    """A run of calls that each extend the previous one's conversation."""

    session_id: str
    index: int
    reason: str
    parent: int | None
    parent_position: int | None  # how many of the parent's calls preceded this segment's first call
    calls: list[Call] = field(default_factory=list)
    forms: list[tuple] = field(default_factory=list)  # stored forms of last input + last output
    tools_key: str = ""

    @property
    def segment_id(self) -> str:
        return f"{self.session_id}:{self.index}"

    @property
    def last(self) -> Call:
        return self.calls[-1]

    def messages(self) -> list[Message]:
        """The whole conversation: the last call's input and output."""
        return [*self.last.input, *self.last.output]

    def generated(self) -> dict[int, int]:
        """Message index in `messages()` -> index of the call (in this segment) that generated it."""
        out: dict[int, int] = {}
        for k, call in enumerate(self.calls):
            start = len(call.row["input_roles"])
            for j in range(len(call.row["output_roles"])):
                out[start + j] = k
        return out

    def info(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "segment_id": self.segment_id, "segment_index": self.index,
                "segment_reason": self.reason, "parent_segment": None if self.parent is None
                else f"{self.session_id}:{self.parent}", "parent_position": self.parent_position}


def trainable(call: Call) -> bool:
    """Calls that hold a model turn: finished without error, with input and an assistant output."""
    return call.ok and bool(call.row["input_roles"]) and any(
        form[0] == "assistant" and len(form) > 2 for form in call.output_forms)


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _answer_text(call: Call) -> str:
    return "".join(m.text() for m in call.output if m.role == "assistant").strip()


def _quotes(call: Call, summary: str) -> bool:
    return any(summary in "".join(p.text or "" for p in m.parts if p.type == "text")
               for m in call.input if m.role == "user")


def _waits_on_subagent(segment: Segment) -> bool:
    return any(p.type == "tool_call" and p.tool_name in SUBAGENT_TOOLS
               for m in segment.last.output for p in m.parts)


def _new_segment(segments: list[Segment], call: Call, tools_key: str, keys_of: _Keys) -> Segment:
    index = len(segments)
    if not segments:
        return Segment(call.row["session_id"], index, "start", None, None)
    keys = keys_of(call.input_forms, call)
    shared = [(_common_prefix(keys, keys_of(s.forms, call)), s) for s in segments]
    best_len, best = max(shared, key=lambda x: (x[0], x[1].index))

    def child(reason: str, parent: Segment) -> Segment:
        return Segment(call.row["session_id"], index, reason, parent.index, len(parent.calls))

    if best_len >= len(best.forms) and best.tools_key != tools_key:
        return child("tools_changed", best)
    for seg in reversed(segments):
        summary = _answer_text(seg.last)
        if len(summary) >= _MIN_SUMMARY and _quotes(call, summary):
            return child("compaction", seg)
    system = sum(1 for m in call.input if m.role in ("system", "developer"))
    if best_len <= system:
        waiting = [s for s in segments if _waits_on_subagent(s)]
        if waiting:
            return child("subagent", waiting[-1])
        # a resumed harness may rewrite early messages (fresh reminders): shared messages still link it
        shared_set = [(len(set(keys[system:]) & set(keys_of(s.forms, call))), s) for s in segments]
        overlap, best = max(shared_set, key=lambda x: (x[0], x[1].index))
        if overlap < 2:
            return Segment(call.row["session_id"], index, "new_conversation", None, None)
    return child("edited_history", best)


class _Keys:
    """Message keys memoised by stored form: harnesses resend the same messages."""

    def __init__(self) -> None:
        self.memo: dict[tuple, str] = {}

    def __call__(self, forms: list[tuple], call: Call) -> list[str]:
        """The keys of `forms` (stored forms of `call`'s session)."""
        out = []
        for form in forms:
            key = self.memo.get(form)
            if key is None:
                key = self.memo[form] = message_key(call.message(form))
            out.append(key)
        return out


def _continued(segments: list[Segment], call: Call, tools_key: str, keys_of: _Keys) -> Segment | None:
    """The longest segment (the first, on ties) whose conversation `call`'s input extends. Equal stored
    forms settle most calls; message keys are computed only for segments whose forms differ."""
    forms = call.input_forms
    keys: list[str] | None = None
    fits = [s for s in segments if s.tools_key == tools_key and len(s.forms) <= len(forms)]
    for seg in sorted(fits, key=lambda s: -len(s.forms)):
        n = len(seg.forms)
        if forms[:n] == seg.forms:
            return seg
        if keys is None:
            keys = keys_of(forms, call)
        if keys[:n] == keys_of(seg.forms, call):
            return seg
    return None


def segment_session(session: Session) -> list[Segment]:
    """Split a session's trainable calls into segments, in order of their first call."""
    segments: list[Segment] = []
    keys_of = _Keys()
    for call in session.calls:
        if not trainable(call):
            continue
        tools_key = call.tools_key
        target = _continued(segments, call, tools_key, keys_of)
        if target is None:
            target = _new_segment(segments, call, tools_key, keys_of)
            target.tools_key = tools_key
            segments.append(target)
        target.calls.append(call)
        target.forms = call.input_forms + call.output_forms
    return segments
