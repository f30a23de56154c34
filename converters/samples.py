"""Training samples cut from segments: one per call, or one per segment.

- `per-call`: the call's input and output; loss only on that call's output
  (OpenForgeRL style). A thread of n calls yields n samples whose prompts
  overlap, so only token-level outputs (where we own the masks) allow it.
- `thread`: the segment's whole conversation; loss on every assistant message
  a call of this segment generated (inherited history is context only).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator, Literal

from forgerl.schema.chat import image_parts, image_refs
from forgerl.schema.messages import Message, Part
from forgerl.schema.segments import segment_id

from .source import Call, Session
from .threads import Segment

Mode = Literal["per-call", "thread"]


@dataclass
class Sample:
    sample_id: str
    mode: Mode
    segment: Segment
    calls: list[Call]
    trained: dict[int, int]  # message index -> index into `calls` of the call that generated it
    session: Session

    @cached_property
    def messages(self) -> list[Message]:
        """The conversation: the last call's input and output (built on first use; engine ids need none)."""
        return [*self.calls[-1].input, *self.calls[-1].output]

    @property
    def images(self) -> list[str]:
        """Blob hashes (or URLs) of the images, in placeholder order."""
        return image_refs(self.messages) if self.session.has_image_parts else []

    @property
    def image_parts(self) -> list[Part]:
        """The image parts themselves (sizes, hashes), in placeholder order."""
        return image_parts(self.messages) if self.session.has_image_parts else []

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.calls[-1].tools

    @property
    def turns(self) -> int:
        return len(self.calls)

    @property
    def enable_thinking(self) -> bool:
        """What the harness asked the template for (Qwen3 `chat_template_kwargs`); thinking unless turned off."""
        for call in self.calls:
            params = call.row.get("request_params") or ""
            if '"enable_thinking": false' in params or '"enable_thinking":false' in params:
                return False
        return True

    def provenance(self) -> dict[str, Any]:
        first = self.calls[0].row
        return {**self.segment.info(), "sample_id": self.sample_id, "mode": self.mode,
                "call_ids": [c.row["call_id"] for c in self.calls], "harness": self.session.harness,
                "model": first.get("model_returned") or first.get("model_requested"),
                "api": first.get("api"), "policy_version": first.get("policy_version"),
                "reward": self.session.reward}


def samples(session: Session, segments: list[Segment], mode: Mode) -> Iterator[Sample]:
    for seg in segments:
        if mode == "thread":
            yield Sample(seg.segment_id, mode, seg, list(seg.calls), seg.generated(), session)
            continue
        for k, call in enumerate(seg.calls):
            start = len(call.input_forms)
            yield Sample(segment_id(seg.session_id, seg.index, k), mode, seg, [call],
                         {start + j: 0 for j in range(len(call.output_forms))}, session)
