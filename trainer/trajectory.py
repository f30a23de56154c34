"""Recorded served calls to veRL samples: prompt ids, response ids, response mask, logprobs.

In serve mode every call carries the exact prompt ids the policy saw and the
ids it generated (`recorder/serve.py`), and its stored segment
(`forgerl.schema.segments`: serve mode itself says which answer a prompt
continues). A segment is its first call's prompt, then per call the new
prompt tokens (tool results or user turns: mask 0, logprob 0) and the
completion (the model's: mask 1, its logprobs) -- the same cut as
`forge-convert --to tokens`.

Per-call mode (`per_call`) cuts one sample per call instead: the call's whole
prompt, then its completion -- `forge-convert --to tokens --mode per-call`'s
cut. Either list ends with the sample holding the rollout's last call, which
produced the final answer the reward grades; `forgerl.rows` decides whether
the agent loop returns all of them (`segment_manager.py`) or that one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# What a sample is built from: the token columns and the stored placement.
CALL_COLUMNS = ["call_id", "session_id", "seq", "t_start", "prompt_token_ids", "completion_token_ids",
                "completion_logprobs", "segment_index", "segment_reason", "continues_call", "malformed_tool_calls"]


@dataclass
class Segment:
    index: int
    reason: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    calls: int = 0
    position: int | None = None  # per-call samples: the call's place in its segment

    def add(self, prompt_ids: list[int], completion_ids: list[int], logprobs: list[float] | None) -> None:
        held = len(self.prompt_ids) + len(self.response_ids)
        if len(prompt_ids) < held:
            raise RuntimeError(f"segment {self.index}: a call's prompt is shorter than the ids before it; "
                               "the stored segment contradicts its token ids")
        gap = prompt_ids[held:]
        self.response_ids += gap + completion_ids
        self.response_mask += [0] * len(gap) + [1] * len(completion_ids)
        self.response_logprobs += [0.0] * len(gap) + list(logprobs or [0.0] * len(completion_ids))
        self.calls += 1

    @property
    def model_tokens(self) -> int:
        return sum(self.response_mask)

    def sample_id(self, session: str) -> str:
        """The id `forge-convert` gives the same sample (`session:segment`, per call `session:segment/k`)."""
        return f"{session}:{self.index}" + ("" if self.position is None else f"/{self.position}")


def served_calls(calls: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The placed calls that carry token ids, in the order they were made."""
    kept = [c for c in calls if c.get("prompt_token_ids") and c.get("completion_token_ids")
            and c.get("segment_index") is not None]
    return sorted(kept, key=lambda c: (c["t_start"], c.get("seq") or 0, c["call_id"]))


def _ids(call: Mapping[str, Any]) -> tuple[list[int], list[int], list[float] | None]:
    prompt, completion = list(call["prompt_token_ids"]), list(call["completion_token_ids"])
    logprobs = call.get("completion_logprobs")
    if logprobs is not None and len(logprobs) != len(completion):
        raise ValueError(f"call {call.get('call_id')}: {len(logprobs)} logprobs for {len(completion)} tokens")
    return prompt, completion, logprobs


def per_call(calls: Iterable[Mapping[str, Any]]) -> list[Segment]:
    """One sample per served call, in call order: its prompt, then its completion."""
    out = []
    positions: dict[int, int] = {}
    for call in served_calls(calls):
        prompt, completion, logprobs = _ids(call)
        index = call["segment_index"]
        sample = Segment(index, call["segment_reason"], prompt_ids=prompt, position=positions.get(index, 0))
        positions[index] = sample.position + 1
        sample.add(prompt, completion, logprobs)
        out.append(sample)
    return out


def segments(calls: Iterable[Mapping[str, Any]]) -> list[Segment]:
    """The rollout's stored segments as token samples, in order of their last call (the last holds the
    rollout's final call)."""
    by_index: dict[int, Segment] = {}
    order: list[int] = []
    for call in served_calls(calls):
        prompt, completion, logprobs = _ids(call)
        index = call["segment_index"]
        seg = by_index.get(index)
        if seg is None:
            seg = by_index[index] = Segment(index, call["segment_reason"], prompt_ids=prompt)
        seg.add(prompt, completion, logprobs)  # a new segment's gap is empty
        if index in order:
            order.remove(index)
        order.append(index)
    return [by_index[i] for i in order]
