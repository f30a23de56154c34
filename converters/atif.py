"""One ATIF trajectory per session (Harbor RFC 0001, validated with PyPI `atif`).

Steps follow the main line of segments (start, then compaction / tools_changed
/ edited_history continuations, whose inherited input is marked
`is_copied_context`); subagent segments become `subagent_trajectories`. Each
agent step carries the call's usage and, where recorded, engine token ids and
logprobs; tool results become the observation of the step that called them.
"""

from __future__ import annotations

import json
from typing import Any

import atif

from forgerl.schema.chat import to_chat_messages
from forgerl.schema.messages import Message

from .source import Session
from .threads import Segment

SCHEMA_VERSION = "ATIF-v1.7"
_SOURCE = {"system": "system", "user": "user", "tool": "user", "assistant": "agent"}


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {"raw": raw}
    return value if isinstance(value, dict) else {"value": value}


def _steps(segment: Segment, steps: list[dict[str, Any]], copied_until: int) -> None:
    generated = segment.generated()
    messages: list[Message] = segment.messages()
    by_call: dict[str, dict[str, Any]] = {}
    for i, message in enumerate(messages):
        for chat in to_chat_messages([message]):
            if chat["role"] == "tool":
                step = by_call.get(chat.get("tool_call_id") or "")
                if step is not None:
                    step.setdefault("observation", {"results": []})["results"].append(
                        {"source_call_id": chat.get("tool_call_id"), "content": chat["content"]})
                    continue
            step: dict[str, Any] = {"step_id": len(steps) + 1, "source": _SOURCE[chat["role"]],
                                    "message": chat.get("content") or ""}
            if i < copied_until:
                step["is_copied_context"] = True
            if chat["role"] == "assistant":
                if chat.get("reasoning_content"):
                    step["reasoning_content"] = chat["reasoning_content"]
                calls = chat.get("tool_calls") or []
                if calls:
                    step["tool_calls"] = [{"tool_call_id": c.get("id") or f"call_{step['step_id']}_{n}",
                                           "function_name": c["function"]["name"],
                                           "arguments": _arguments(c["function"]["arguments"])}
                                          for n, c in enumerate(calls)]
                    for c in step["tool_calls"]:
                        by_call[c["tool_call_id"]] = step
                if i in generated:
                    row = segment.calls[generated[i]].row
                    step["model_name"] = row.get("model_returned") or row.get("model_requested")
                    step["timestamp"] = row["t_start"].isoformat() if row.get("t_start") else None
                    step["metrics"] = _metrics(row)
                    step["extra"] = {"call_id": row["call_id"], "stop_reason": row.get("stop_reason")}
            steps.append(step)


def _metrics(row: dict[str, Any]) -> dict[str, Any]:
    cached = row.get("cache_read_tokens")
    prompt = row.get("input_tokens")
    metrics = {"prompt_tokens": None if prompt is None else prompt + (cached or 0),
               "completion_tokens": row.get("output_tokens"), "cached_tokens": cached}
    for column, key in (("prompt_token_ids", "prompt_token_ids"), ("completion_token_ids", "completion_token_ids"),
                        ("completion_logprobs", "logprobs")):
        values = row.get(column)
        if values is not None and len(values):
            metrics[key] = [None if v != v else v for v in values.tolist()]  # NaN: a logprob not recorded
    return metrics


def _trajectory(session: Session, segments: list[Segment], agent: str, trajectory_id: str) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for n, seg in enumerate(segments):
        _steps(seg, steps, len(seg.calls[0].input) if n else 0)
    first = segments[0].calls[0]
    tools = first.tools
    agent_info = {"name": agent, "version": "unknown",
                  "model_name": first.row.get("model_returned") or first.row.get("model_requested"),
                  "tool_definitions": tools or None}
    totals = [s["metrics"] for s in steps if s.get("metrics")]
    return {"schema_version": SCHEMA_VERSION, "session_id": session.session_id, "trajectory_id": trajectory_id,
            "agent": agent_info, "steps": steps,
            "final_metrics": {"total_prompt_tokens": sum(m.get("prompt_tokens") or 0 for m in totals),
                              "total_completion_tokens": sum(m.get("completion_tokens") or 0 for m in totals),
                              "total_cached_tokens": sum(m.get("cached_tokens") or 0 for m in totals),
                              "total_steps": len(steps)},
            "extra": {"segments": [s.info() for s in segments], "reward": session.reward,
                      "outcome": {k: session.outcome.get(k) for k in ("task_id", "status", "reward", "passed")}
                      if session.outcome else None}}


def session_trajectory(session: Session, segments: list[Segment]) -> dict[str, Any]:
    """The session's ATIF document, validated."""
    main = [s for s in segments if s.reason != "subagent"]
    subs = [s for s in segments if s.reason == "subagent"]
    agent = session.harness or "unknown"
    doc = _trajectory(session, main or segments[:1], agent, f"{session.session_id}:main")
    doc["extra"]["segments"] = [s.info() for s in segments]  # the whole tree, subagents included
    if subs:
        doc["subagent_trajectories"] = [_trajectory(session, [s], agent, s.segment_id) for s in subs]
    return atif.Trajectory.model_validate(doc).model_dump(mode="json", exclude_none=True)
