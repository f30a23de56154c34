"""A recorded session as OpenTelemetry GenAI spans: the one mapping both exports use.

`forge-convert --to otel` (offline, `converters/otel.py`) and `--otlp URL`
(live, `recorder/otlp.py`) feed a `SessionTrace` the same call rows in the
order the writer wrote them, so they build the same spans with the same ids.
Conventions followed: open-telemetry/semantic-conventions-genai, registry and
`gen-ai-spans.md` / `gen-ai-agent-spans.md` as of commit 002c8a6 (Development
status). Message content (`gen_ai.input.messages`, ...) is opt-in there, and
here (`--otel-content`, `otel_content.py`); without it spans carry metadata,
ids, timings and usage only.

| span | name | parent | time | attributes |
|---|---|---|---|---|
| root: the main agent | `invoke_agent {harness}` | none | first call's start .. last call's end | `gen_ai.operation.name=invoke_agent`, `gen_ai.agent.name`, `gen_ai.conversation.id`; with an outcome: `forgerl.task.id`, `forgerl.attempt`, `forgerl.outcome.status`, `forgerl.reward`, `forgerl.passed`, `forgerl.policy_version`, and a `gen_ai.evaluation.result` event (`gen_ai.evaluation.name=reward`) |
| a subagent (a `subagent` segment and the segments carrying it on) | `invoke_agent {harness} subagent` | the `execute_tool` span of the call that started it (else the root) | its calls | as the root, without the outcome |
| a model call (api `raw` requests are left out) | `{operation} {requested model}` | its agent (calls holding no model turn: the root) | request start .. response end | see `call_attributes` |
| a tool the harness ran | `execute_tool {tool}` | the asking call's agent | the asking call's end .. the start of the call that carried its result | `gen_ai.tool.name`, `gen_ai.tool.call.id`, `error.type=tool_error` when the result is an error |

Where the outcome comes from: the `outcomes` row of the session (offline: the
last one written; live: the row forge-run, or the RL agent loop, writes, which
then sends the agent and root spans itself through `replay`, the offline
export's per-session step, from the session's stored calls: `otlp.py`).
A session ended without a runner (idle, or the recorder stopped) has no
outcome on its root.

Compaction, edited-history and other non-subagent segments stay inside their
agent. Ids: the trace id is the first 16 bytes of sha256 of the session id;
a span id the first 8 bytes of sha256 of what names it (session + call id, +
tool call id). Usage: the recorder stores input tokens *without* cache reads
and writes for every API (Anthropic's own convention; OpenAI's and Gemini's
prompt counts had their cached part taken out), while the conventions count
cached tokens inside `gen_ai.usage.input_tokens`, so that attribute is
input + cache read + cache write: Anthropic's `input_tokens +
cache_read_input_tokens + cache_creation_input_tokens`, OpenAI's
`prompt_tokens` / `input_tokens`, Gemini's `promptTokenCount` as the API sent
them. Output tokens include reasoning for every API (Gemini's
candidates + thoughts). Provider: `anthropic`, `openai`, `gcp.gen_ai` (the
Gemini API), `vllm` for a call a forgerl policy answered (serve mode).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from forgerl.harnesses import SUBAGENT_TOOLS
from forgerl.schema.messages import Message
from forgerl.schema.segments import placed, served_link

from .otel_content import content_attributes, value_limit

SCOPE = InstrumentationScope(name="forgerl", version="0.1.0")
SEMCONV = "open-telemetry/semantic-conventions-genai@002c8a6"
OPERATIONS = {"anthropic": "chat", "chat": "chat", "responses": "chat", "gemini": "generate_content",
              "completions": "text_completion"}
PROVIDERS = {"anthropic": "anthropic", "chat": "openai", "responses": "openai", "completions": "openai",
             "gemini": "gcp.gen_ai"}
MAIN = ""  # the main agent's key
PART_COLUMNS = ("part_hash", "part_type", "tool_call_id", "tool_name", "is_error")  # `messages` columns (`Parts`)
CALL_COLUMNS = ("call_id", "session_id", "seq", "api", "status", "error", "complete", "streamed", "t_start",
                "t_first_byte", "t_end", "model_requested", "model_returned", "stop_reason", "input_tokens",
                "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "response_headers",
                "response", "policy_version", "segment_index", "segment_reason", "parent_segment", "parent_position",
                "tools")


@dataclass(frozen=True)
class ToolUses:
    """A call's tool traffic: the tool calls its answer asked for (id, name) and the results its input carries
    (tool call id, tool name, is_error), in message order. The Gemini API names no call (the id is empty): such
    a call is matched to the first later result for a tool of its name."""

    asked: tuple[tuple[str, str], ...] = ()
    answered: tuple[tuple[str, str, bool], ...] = ()


def trace_id(session_id: str) -> bytes:
    return hashlib.sha256(f"forgerl-trace\0{session_id}".encode()).digest()[:16]


def span_id(*names: str) -> bytes:
    return hashlib.sha256("\0".join(("forgerl-span", *names)).encode()).digest()[:8]


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _nanos(t: datetime | None) -> int:
    """Nanoseconds since the epoch, exactly (the stored times are whole microseconds)."""
    return (t - _EPOCH) // _MICROSECOND * 1000 if t is not None else 0


def _value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[_value(x) for x in v]))
    return AnyValue(string_value=str(v))


def attributes(values: Mapping[str, Any]) -> list[KeyValue]:
    """OTLP attributes from a dict, None values left out."""
    return [KeyValue(key=k, value=_value(v)) for k, v in values.items() if v is not None]


def provider(row: Mapping[str, Any]) -> str:
    return "vllm" if served_link(row) else PROVIDERS.get(row.get("api") or "", row.get("api") or "unknown")


def _response_id(row: Mapping[str, Any]) -> str | None:
    try:
        body = json.loads(row.get("response") or "null")
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    found = body.get("id") or body.get("responseId")
    return found if isinstance(found, str) else None


def error_type(row: Mapping[str, Any]) -> str | None:
    """`error.type`: the HTTP status of a failed response, `incomplete` for a call cut short, `_OTHER` else."""
    status = row.get("status")
    if status is not None and status >= 400:
        return str(status)
    if row.get("error"):
        return "_OTHER" if row.get("complete") else "incomplete"
    return None if row.get("complete", True) else "incomplete"


def call_attributes(row: Mapping[str, Any]) -> dict[str, Any]:
    """A call span's attributes (usage per the module docstring's mapping)."""
    cached = [row.get("cache_read_tokens"), row.get("cache_write_tokens")]
    inputs = row.get("input_tokens")
    first, start = row.get("t_first_byte"), row.get("t_start")
    return {
        "gen_ai.operation.name": OPERATIONS[row["api"]],
        "gen_ai.provider.name": provider(row),
        "gen_ai.request.model": row.get("model_requested"),
        "gen_ai.response.model": row.get("model_returned"),
        "gen_ai.response.id": _response_id(row),
        "gen_ai.response.finish_reasons": [row["stop_reason"]] if row.get("stop_reason") else None,
        "gen_ai.conversation.id": row["session_id"],
        "gen_ai.request.stream": row.get("streamed"),
        "gen_ai.response.time_to_first_chunk": ((first - start).total_seconds()
                                                if row.get("streamed") and first and start else None),
        "gen_ai.usage.input_tokens": (inputs + sum(c or 0 for c in cached)) if inputs is not None else None,
        "gen_ai.usage.output_tokens": row.get("output_tokens"),
        "gen_ai.usage.cache_read.input_tokens": row.get("cache_read_tokens"),
        "gen_ai.usage.cache_creation.input_tokens": row.get("cache_write_tokens"),
        "gen_ai.usage.reasoning.output_tokens": row.get("reasoning_tokens"),
        "http.response.status_code": row.get("status"),
        "error.type": error_type(row),
        "forgerl.call.id": row["call_id"],
        "forgerl.segment.index": row.get("segment_index"),
        "forgerl.segment.reason": row.get("segment_reason"),
        "forgerl.policy_version": row.get("policy_version"),
    }


@dataclass
class _Agent:
    key: str
    span_id: bytes
    parent: bytes | None
    start: int = 0
    end: int = 0


@dataclass
class _Asked:
    name: str
    end: int  # the asking call's end
    started_subagent: bool = False


@dataclass
class SessionTrace:
    """One session's spans, built call by call in writing order; `add` returns the spans finished by a call
    (its own, the tools it carried results of), `finish` the agents' spans, the root with the outcome last."""

    session_id: str
    trace: bytes = field(init=False)
    agents: dict[str, _Agent] = field(default_factory=dict)
    segment_agent: dict[int, str] = field(default_factory=dict)
    segment_calls: dict[int, list[str]] = field(default_factory=dict)
    asked: dict[str, dict[str, _Asked]] = field(default_factory=dict)  # call id -> tool call id -> asked
    pending: dict[str, tuple[str, str]] = field(default_factory=dict)  # tool call id -> (asking call, agent)
    carried: set[str] = field(default_factory=set)  # tool call ids of the results seen
    said: dict[int, int] = field(default_factory=dict)  # segment -> messages its last call's input + output held
    limit: int = field(default_factory=value_limit)  # content attributes' length limit (`otel_content`)
    last_end: int = 0

    def __post_init__(self) -> None:
        self.trace = trace_id(self.session_id)
        self.agents[MAIN] = _Agent(MAIN, span_id(self.session_id), None)

    def add(self, row: Mapping[str, Any], tools: ToolUses,
            content: tuple[Sequence[Message], Sequence[Message]] | None = None) -> list[Span]:
        """A call's spans; with `content` (its input and output messages: `--otel-content`) its span carries
        them (`otel_content`: only the messages its segment's previous call did not hold)."""
        if row.get("api") not in OPERATIONS:
            return []  # not a model call (api `raw`: a harness's probe or other request through the recorder)
        start, end = _nanos(row.get("t_start")), _nanos(row.get("t_end") or row.get("t_start"))
        agent = self._agent_of(row) if placed(row) else self.agents[MAIN]
        for a in {agent.key: agent, MAIN: self.agents[MAIN]}.values():
            a.start = min(a.start, start) if a.start else start
            a.end = max(a.end, end)
        self.last_end = max(self.last_end, end)
        values = call_attributes(row)
        if content is not None:
            values.update(self._content(row, *content))
        call_span = self._span(span_id(self.session_id, row["call_id"]), agent.span_id,
                               f"{OPERATIONS[row['api']]} {row.get('model_requested') or ''}"
                               .strip(), Span.SPAN_KIND_CLIENT, start, end, values, row.get("error"))
        spans = [call_span]
        for tool_call, name, is_error in tools.answered:
            if tool_call in self.carried:  # history: a result an earlier call carried already
                continue
            self.carried.add(tool_call)
            spans += self._ran(tool_call if tool_call in self.pending else f"#{name}", is_error, start)
        mine = self.asked.setdefault(row["call_id"], {})
        for tool_call, name in tools.asked:
            tool_call = tool_call or f"#{name}"  # unnamed (Gemini API): its name stands for it until answered
            if tool_call not in self.pending:
                mine[tool_call] = _Asked(name, end)
                self.pending[tool_call] = (row["call_id"], agent.key)
        return spans

    def finish(self, outcome: Mapping[str, Any] | None = None, harness: str | None = None) -> list[Span]:
        """The spans still open: tools that started a subagent and never carried a result back, each agent, and
        the root last (with the outcome, if one was written); nothing for a session without model calls."""
        if not self.last_end:
            return []
        spans = []
        for tool_call, (asking, _) in list(self.pending.items()):
            if self.asked[asking][tool_call].started_subagent:
                spans += self._ran(tool_call, False, self.last_end)
        name = harness or "agent"
        for key, agent in self.agents.items():
            if key == MAIN:
                continue
            spans.append(self._span(agent.span_id, agent.parent, f"invoke_agent {name} subagent",
                                    Span.SPAN_KIND_INTERNAL, agent.start, agent.end,
                                    self._agent_attributes(f"{name} subagent", key), None))
        root = self.agents[MAIN]
        values = self._agent_attributes(name, self.session_id)
        reward = None
        if outcome:
            reward = outcome.get("reward")
            values.update({"forgerl.task.id": outcome.get("task_id"), "forgerl.attempt": outcome.get("attempt"),
                           "forgerl.outcome.status": outcome.get("status"), "forgerl.reward": reward,
                           "forgerl.passed": outcome.get("passed"),
                           "forgerl.policy_version": outcome.get("policy_version")})
        span = self._span(root.span_id, None, f"invoke_agent {name}", Span.SPAN_KIND_INTERNAL, root.start,
                          root.end, values, outcome.get("error") if outcome else None)
        if reward is not None:
            passed = outcome.get("passed")
            span.events.add(time_unix_nano=root.end, name="gen_ai.evaluation.result", attributes=attributes({
                "gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": float(reward),
                "gen_ai.evaluation.score.label": None if passed is None else ("pass" if passed else "fail")}))
        return [*spans, span]

    def _content(self, row: Mapping[str, Any], inputs: Sequence[Message],
                 outputs: Sequence[Message]) -> dict[str, Any]:
        segment = row.get("segment_index")
        held = self.said.get(segment, 0) if segment is not None else 0
        if segment is not None:
            self.said[segment] = len(inputs) + len(outputs)
        return content_attributes(inputs, outputs, held if held <= len(inputs) else 0, row, self.limit)

    def _agent_attributes(self, name: str, agent_id: str) -> dict[str, Any]:
        return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name, "gen_ai.agent.id": agent_id,
                "gen_ai.conversation.id": self.session_id}

    def _agent_of(self, row: Mapping[str, Any]) -> _Agent:
        index = row["segment_index"]
        self.segment_calls.setdefault(index, []).append(row["call_id"])
        key = self.segment_agent.get(index)
        if key is None:
            parent = row.get("parent_segment")
            if row.get("segment_reason") == "subagent" and parent is not None:
                key = row["call_id"]
                self.agents[key] = _Agent(key, span_id(self.session_id, "agent", key), self._subagent_parent(row))
            else:
                key = self.segment_agent.get(parent, MAIN) if parent is not None else MAIN
            self.segment_agent[index] = key
        return self.agents[key]

    def _subagent_parent(self, row: Mapping[str, Any]) -> bytes:
        """The `execute_tool` span of the subagent tool call the parent segment's last call before this segment
        made (the first one no other subagent claimed), else the parent's agent span."""
        before = self.segment_calls.get(row["parent_segment"], [])[: row.get("parent_position") or 0]
        asking = before[-1] if before else ""
        for tool_call, asked in self.asked.get(asking, {}).items():
            if asked.name in SUBAGENT_TOOLS and not asked.started_subagent:
                asked.started_subagent = True
                return span_id(self.session_id, asking, tool_call)
        return self.agents[self.segment_agent.get(row["parent_segment"], MAIN)].span_id

    def _ran(self, tool_call: str, is_error: bool, end: int) -> list[Span]:
        if tool_call not in self.pending:
            return []
        asking, agent = self.pending.pop(tool_call)
        asked = self.asked[asking][tool_call]
        return [self._span(span_id(self.session_id, asking, tool_call), self.agents[agent].span_id,
                           f"execute_tool {asked.name}", Span.SPAN_KIND_INTERNAL, asked.end, max(end, asked.end),
                           {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": asked.name,
                            "gen_ai.tool.call.id": None if tool_call.startswith("#") else tool_call,
                            "gen_ai.conversation.id": self.session_id,
                            "error.type": "tool_error" if is_error else None},
                           "the tool's result is an error" if is_error else None)]

    def _span(self, sid: bytes, parent: bytes | None, name: str, kind: int, start: int, end: int,
              values: Mapping[str, Any], error: str | None) -> Span:
        return Span(trace_id=self.trace, span_id=sid, parent_span_id=parent or b"", name=name, kind=kind,
                    start_time_unix_nano=start, end_time_unix_nano=end, attributes=attributes(values),
                    status=Status(code=Status.STATUS_CODE_ERROR, message=error) if error
                    else Status(code=Status.STATUS_CODE_UNSET))


Parts = Iterable[tuple[str, str | None, str | None, bool | None]]  # (type, tool call id, tool name, is_error)


def tool_uses(output_parts: Parts, input_parts: Parts) -> ToolUses:
    """ToolUses from a call's output and input parts (the `messages` table's `part_type`, `tool_call_id`,
    `tool_name`, `is_error`; `schema.messages.Part`'s `type`, `call_id`, `tool_name`, `is_error`)."""
    return ToolUses(tuple((i or "", n or "") for t, i, n, _ in output_parts if t == "tool_call"),
                    tuple((i or "", n or "", bool(e)) for t, i, n, e in input_parts if t == "tool_result"))


def tool_parts(rows: Iterable[Mapping[str, Any]]) -> dict[str, tuple]:
    """A session's tool calls and results among its `messages` rows (`PART_COLUMNS`), by part hash, as `replay`
    takes them."""
    return {r["part_hash"]: tuple(r[c] for c in PART_COLUMNS[1:]) for r in rows
            if r["part_type"] in ("tool_call", "tool_result")}


def replay(session_id: str, rows: Iterable[Mapping[str, Any]], parts: Mapping[str, tuple],
           messages: Callable[[Mapping[str, Any]], tuple[Sequence[Message], Sequence[Message]]] | None = None
           ) -> tuple[SessionTrace, list[Span]]:
    """A stored session's trace, its calls fed in writing order, and their spans (`finish` it for the rest):
    `rows` its calls (`CALL_COLUMNS` and `input_refs` / `output_refs`), `parts` its tool calls and results by
    part hash (`tool_parts`); `messages`, a call's input and output messages, adds content."""
    trace, spans = SessionTrace(session_id), []
    for row in sorted(rows, key=writing_order):
        found = [parts[h] for h in row["output_refs"] or [] if h in parts]
        given = [parts[h] for h in row["input_refs"] or [] if h in parts]
        spans += trace.add(row, tool_uses(found, given), messages(row) if messages else None)
    return trace, spans


def export_request(spans: Sequence[Span], service: str = "forgerl") -> ExportTraceServiceRequest:
    """One OTLP request holding `spans` under forgerl's resource and scope."""
    resource = Resource(attributes=attributes({"service.name": service, "forgerl.semconv": SEMCONV}))
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=resource, scope_spans=[ScopeSpans(scope=SCOPE, spans=list(spans))])])


def writing_order(row: Mapping[str, Any]) -> tuple:
    """The order the writer wrote a session's calls (it places each call as it finishes): end time, then the
    writer's sequence; a live export sees them in this order, so the offline one feeds them so too."""
    return row.get("t_end") or row["t_start"], row.get("seq") or 0, row["call_id"]
