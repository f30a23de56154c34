"""A session's calls grouped into the thread segments the dataset stores.

Where each call continues, and why a segment starts (subagent, compaction,
tools changed, token break, edited history), is decided once as the call is
written (`forgerl.schema.segments`) and stored on the call; this module only
groups the stored placement, so SFT rows, token rows, RL samples and the
analysis views cut a session the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forgerl.schema.messages import Message
from forgerl.schema.segments import segment_id, stored_segments

from .source import Call, Session


@dataclass
class Segment:
    """A run of calls that each extend the previous one's conversation."""

    session_id: str
    index: int
    reason: str
    parent: int | None
    parent_position: int | None  # how many of the parent's calls preceded this segment's first call
    calls: list[Call] = field(default_factory=list)

    @property
    def segment_id(self) -> str:
        return segment_id(self.session_id, self.index)

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
                else segment_id(self.session_id, self.parent), "parent_position": self.parent_position}


def segment_session(session: Session) -> list[Segment]:
    """The session's stored segments, in segment order, each with its calls in order."""
    return [Segment(session.session_id, s.index, s.reason, s.parent, s.parent_position, s.calls)
            for s in stored_segments(session.calls, lambda call: call.row)]
