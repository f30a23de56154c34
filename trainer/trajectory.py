"""Recorded served calls to one veRL sample: prompt ids, response ids, response mask, logprobs.

In serve mode every call carries the exact prompt ids the policy saw and the
ids it generated (`recorder/serve.py`). Calls are stitched in order: a call
continues a segment when its prompt ids start with everything that segment
holds (its prompt, then model and tool/user tokens so far); the new prompt
tokens between are tool results or user turns (mask 0, logprob 0), the
completion is the model's (mask 1, its logprobs). A call that does not
continue starts a new segment (compaction, a subagent, edited history).

veRL 0.9.1's agent loop returns exactly one `AgentLoopOutput` per prompt row
(`AgentLoopWorker._run_agent_loop`; `_compute_score` takes a list but is only
ever called with one), so one segment is the sample: the one holding the
rollout's last call, which produced the final answer the reward grades. The
others are counted in the output's metrics, never silently merged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Segment:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    calls: int = 0

    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add(self, prompt_ids: list[int], completion_ids: list[int], logprobs: list[float] | None) -> None:
        gap = prompt_ids[len(self.prompt_ids) + len(self.response_ids):]
        self.response_ids += gap + completion_ids
        self.response_mask += [0] * len(gap) + [1] * len(completion_ids)
        self.response_logprobs += [0.0] * len(gap) + list(logprobs or [0.0] * len(completion_ids))
        self.calls += 1

    @property
    def model_tokens(self) -> int:
        return sum(self.response_mask)


def served_calls(calls: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The calls that carry token ids, in the order they were made."""
    kept = [c for c in calls if c.get("prompt_token_ids") and c.get("completion_token_ids")]
    return sorted(kept, key=lambda c: (c["t_start"], c.get("seq") or 0))


def segments(calls: Iterable[Mapping[str, Any]]) -> list[Segment]:
    out: list[Segment] = []
    for call in served_calls(calls):
        prompt, completion = list(call["prompt_token_ids"]), list(call["completion_token_ids"])
        logprobs = call.get("completion_logprobs")
        if logprobs is not None and len(logprobs) != len(completion):
            raise ValueError(f"call {call.get('call_id')}: {len(logprobs)} logprobs for {len(completion)} tokens")
        current = next((s for s in reversed(out) if _continues(s, prompt)), None)
        if current is None:
            current = Segment(prompt_ids=prompt)
        else:
            out.remove(current)
        current.add(prompt, completion, logprobs)  # a new segment's gap is empty
        out.append(current)  # the most recently extended segment is last
    return out


def _continues(segment: Segment, prompt: list[int]) -> bool:
    held = segment.tokens()
    return len(prompt) >= len(held) and prompt[:len(held)] == held
