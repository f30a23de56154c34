"""A rollout's recorded conversation as ClawEval's trace: `TraceMessage`s and `ToolDispatch`es for its graders.

ClawEval's own loop talks to the model in Anthropic-style messages and calls
each tool over HTTP itself (`claw_eval.runner.dispatcher`), logging one
`ToolDispatch` per call. Here the harness called the tools through our MCP
server (`claweval_mcp.py`), so both come from the recording: the canonical
messages of the main thread's last call (`GradeInput.messages`), with

* harness-made MCP tool names mapped back to the task's (`mcp__claweval__x`,
  `claweval__x`, `claweval_x`, `claweval.x` → `x`);
* each call to a task tool paired with its tool result: the request body is
  the call's arguments, the response body the result's JSON (what the MCP
  server passed on: the service's JSON answer, as ClawEval's dispatcher
  formats it), the status 200, or 500 for an error result (the recording
  holds the error flag, not the HTTP status; graders compare with 400);
* tool results as `ToolResultBlock`s in user messages, as in ClawEval's traces;
  system and developer messages left out;
* user turns as the user (or a simulated user) wrote them, so a grader that
  looks for `[user_agent]` at the start of one finds it: a text part that is
  a harness's `<system-reminder>` alone (Claude Code, Qwen Code) is left out,
  and OpenClaw's timestamp envelope (`[Fri 2026-12-04 03:04 UTC] `) comes off.
"""

from __future__ import annotations

import json
import re
from typing import Any

from claw_eval.models.content import TextBlock, ToolResultBlock, ToolUseBlock
from claw_eval.models.message import Message as ClawMessage
from claw_eval.models.task import TaskDefinition
from claw_eval.models.trace import ToolDispatch, TraceMessage

from forgerl.schema.messages import Message, Part

SERVER_NAME = "claweval"  # the MCP server's name in every harness's config
ERROR_STATUS = 500
CODEX_PREAMBLE = "Wall time:"
UNTRUSTED = ("<untrusted_context>", "</untrusted_context>")
REMINDER = re.compile(r"(?:\s*<system-reminder>(?:(?!</system-reminder>).)*</system-reminder>)+\s*", re.DOTALL)
OPENCLAW_ENVELOPE = re.compile(r"\[\w{3} \d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})? [^\]\n]+\] ")


def task_tool_name(name: str, tools: set[str]) -> str:
    """The task's tool a harness-made name refers to (the name itself when it is no MCP name of ours)."""
    if name in tools:
        return name
    for tool in tools:
        prefix = name[:-len(tool)] if name.endswith(tool) else ""
        if prefix and SERVER_NAME in prefix and prefix[-1] in "_.-/":
            return tool
    return name


def _arguments(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_value": value}


def _result_text(part: Part) -> str:
    """A tool result's text as the MCP server gave it, without what harnesses wrap around it: an MCP content list
    passed on as JSON, the `Wall time: ... Output:` part Codex puts first, the `{"output": ...}` object and the
    `<untrusted_context>` tags of Gemini CLI."""
    texts = [p.text or "" for p in part.content or () if p.type == "text"]
    if len(texts) > 1 and texts[0].startswith(CODEX_PREAMBLE):
        texts = texts[1:]
    text = part.text if part.text is not None else "".join(texts)
    try:
        wrapped = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
    if isinstance(wrapped, list) and wrapped and all(isinstance(b, dict) and b.get("type") == "text" for b in wrapped):
        return "".join(b.get("text", "") for b in wrapped)
    if isinstance(wrapped, dict) and list(wrapped) == ["output"] and isinstance(wrapped["output"], str):
        inner = wrapped["output"].strip()
        return inner.removeprefix(UNTRUSTED[0]).removesuffix(UNTRUSTED[1]).strip()
    return text


def _user_text(text: str) -> str:
    """A user turn's text part as its author wrote it ("" for a harness's reminder part)."""
    if REMINDER.fullmatch(text):
        return ""
    envelope = OPENCLAW_ENVELOPE.match(text)
    return text[envelope.end():] if envelope else text


def _body(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def trace(messages: list[Message], task: TaskDefinition,
          trace_id: str = "forgerl") -> tuple[list[TraceMessage], list[ToolDispatch]]:
    """ClawEval's messages and tool dispatches for the recorded conversation `messages`."""
    tools = {t.name for t in task.tools}
    endpoints = task.get_endpoint_map()
    out: list[TraceMessage] = []
    calls: dict[str, tuple[str, dict]] = {}  # call id -> (task tool name, arguments)
    dispatches: list[ToolDispatch] = []
    for message in messages:
        if message.role in ("system", "developer"):
            continue
        blocks: list = []
        reasoning: list[str] = []
        for part in message.parts:
            if part.type == "text":
                text = _user_text(part.text or "") if message.role == "user" else part.text
                if text:
                    blocks.append(TextBlock(text=text))
            elif part.type == "reasoning" and part.text:
                reasoning.append(part.text)
            elif part.type == "tool_call":
                name, args = task_tool_name(part.tool_name or "", tools), _arguments(part.arguments)
                calls[part.call_id or ""] = (name, args)
                blocks.append(ToolUseBlock(id=part.call_id or "", name=name, input=args))
            elif part.type == "tool_result":
                text = _result_text(part)
                blocks.append(ToolResultBlock(tool_use_id=part.call_id or "", content=[TextBlock(text=text)],
                                              is_error=bool(part.is_error)))
                name, args = calls.get(part.call_id or "", ("", {}))
                if name in endpoints:
                    dispatches.append(ToolDispatch(
                        trace_id=trace_id, tool_use_id=part.call_id or "", tool_name=name,
                        endpoint_url=endpoints[name].url, request_body=args,
                        response_status=ERROR_STATUS if part.is_error else 200, response_body=_body(text)))
        if blocks or reasoning:
            role = "assistant" if message.role == "assistant" else "user"
            out.append(TraceMessage(trace_id=trace_id, message=ClawMessage(
                role=role, content=blocks, reasoning_content="\n".join(reasoning) or None)))
    return out, dispatches
