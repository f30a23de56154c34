"""Recorded served calls to veRL samples: prompt ids, response ids, response mask, logprobs.

In serve mode every call carries the exact prompt ids the policy saw and the
ids it generated (`recorder/serve.py`), and its stored segment
(`forgerl.schema.segments`: serve mode itself says which answer a prompt
continues). A segment is its first call's prompt, then per call the new
prompt tokens (tool results or user turns: mask 0, logprob 0) and the
completion (the model's: mask 1, its logprobs) -- the same cut as
`forge-convert --to tokens` (both join the ids with `joined_ids`).

Per-call mode (`per_call`) cuts one sample per call instead: the call's whole
prompt, then its completion -- `forge-convert --to tokens --mode per-call`'s
cut. Either list ends with the sample holding the call grading read (the
main thread's last call, `main_thread`: not a subagent's or a memory
extractor's that came after it); `forgerl.rows` decides whether the agent
loop returns all of them (`segment_manager.py`) or that one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from forgerl.schema.segments import (engine_ids, joined_ids, main_thread, placed, recorded_order, segment_id,
                                     stored_segments)

# What a sample is built from: the token columns and the stored placement.
CALL_COLUMNS = ["call_id", "session_id", "seq", "t_start", "prompt_token_ids", "completion_token_ids",
                "completion_logprobs", "segment_index", "segment_reason", "parent_segment", "parent_position",
                "continues_call", "malformed_tool_calls"]


@dataclass
class Segment:
    """One training sample of a rollout: a stored segment's calls (or one call) as veRL's ids and masks."""

    index: int
    reason: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    calls: int = 0
    position: int | None = None  # per-call samples: the call's place in its segment
    last_call: str = ""  # the id of its last call

    @property
    def model_tokens(self) -> int:
        return sum(self.response_mask)

    def sample_id(self, session: str) -> str:
        """The id `forge-convert` gives the same sample (`session:segment`, per call `session:segment/k`)."""
        return segment_id(session, self.index, self.position)


def served_calls(calls: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The placed calls that carry token ids, in the order they were made."""
    kept = [c for c in calls if placed(c) and engine_ids(c) is not None]
    return sorted(kept, key=recorded_order)


def _ids(call: Mapping[str, Any]) -> tuple[list[int], list[int], list[float] | None]:
    prompt, completion = list(call["prompt_token_ids"]), list(call["completion_token_ids"])
    logprobs = call.get("completion_logprobs")
    if logprobs is not None and len(logprobs) != len(completion):
        raise ValueError(f"call {call.get('call_id')}: {len(logprobs)} logprobs for {len(completion)} tokens")
    return prompt, completion, logprobs


def _sample(calls: list[Mapping[str, Any]], position: int | None = None) -> Segment:
    """One sample of calls of one segment: the first prompt, then per call the new context and the completion."""
    first = calls[0]
    index = first["segment_index"]
    ids = [_ids(call) for call in calls]
    joined = joined_ids(((c["call_id"], p, q) for c, (p, q, _) in zip(calls, ids)),
                        segment_id(first["session_id"], index))
    sample = Segment(index, first["segment_reason"], prompt_ids=[], position=position, calls=len(calls),
                     last_call=calls[-1]["call_id"])
    for k, ((context, completion), (_, _, logprobs)) in enumerate(zip(joined, ids)):
        if k == 0:
            sample.prompt_ids = context
        else:
            sample.response_ids += context
            sample.response_mask += [0] * len(context)
            sample.response_logprobs += [0.0] * len(context)
        sample.response_ids += completion
        sample.response_mask += [1] * len(completion)
        sample.response_logprobs += list(logprobs if logprobs is not None else [0.0] * len(completion))
    return sample


def _graded_last(samples: list[Segment], calls: Iterable[Mapping[str, Any]]) -> list[Segment]:
    """`samples` with the one holding the call grading read moved to the end."""
    graded = main_thread(calls)
    held = [s for s in samples if graded is not None and s.last_call == graded["call_id"]]
    return [s for s in samples if s not in held] + held


def per_call(calls: Iterable[Mapping[str, Any]]) -> list[Segment]:
    """One sample per served call, in call order, the graded call's last: its prompt, then its completion."""
    calls = list(calls)
    positions: dict[int, int] = {}
    out = []
    for call in served_calls(calls):
        index = call["segment_index"]
        positions[index] = positions.get(index, -1) + 1
        out.append(_sample([call], positions[index]))
    return _graded_last(out, calls)


def segments(calls: Iterable[Mapping[str, Any]]) -> list[Segment]:
    """The rollout's stored segments as token samples, in order of their last call, the main thread's last
    (it holds the call grading read)."""
    calls = list(calls)
    served = served_calls(calls)
    order = {c["call_id"]: n for n, c in enumerate(served)}
    found = sorted((_sample(seg.calls) for seg in stored_segments(served)), key=lambda s: order[s.last_call])
    return _graded_last(found, calls)
