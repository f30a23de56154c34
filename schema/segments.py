"""Where each call sits in its session's threads: decided once, as the call is written, and stored.

Harnesses resend the whole history on every call, so a call *continues* a
segment when its input starts with that segment's last input + last output
(followed by new tool results / user turns) and it offers the same tools.
Anything else starts a new segment, linked to the segment it came from:

- `compaction`: a user message of the new input quotes an earlier segment's
  last answer (the summary the model wrote), as Claude Code does;
- `subagent`: a fresh conversation while another segment waits on a call to
  a subagent tool (`SUBAGENT_TOOLS`), interleaved; or one that quotes the
  prompt such a call wrote, even when it starts as the waiting conversation
  did (Claude Code's subagent calling `Agent` again with its own prompt); or
  another agent's (no part of its system prompt in common, other tool names)
  given a segment's conversation (Qwen Code's memory extractor after the
  final answer);
- `tools_changed`: the history continues but the offered tools differ;
- `token_break`: the messages continue, but the engine's prompt ids do not
  start with the previous call's prompt + completion ids (the template
  re-rendered history), so one token sequence cannot hold both;
- `edited_history`: the input shares a prefix with a segment, then differs,
  or (a resumed harness rewriting its first messages) shares at least two
  messages with it; also a served call that continues an answer which
  another call already continued (a fork);
- `new_conversation` / `start`: nothing in common with what came before.

Serve mode knows which answer a prompt's token ids continue and says so in
the `X-Forge-Continues` response header (`X-Forge-Answer` names each answer):
for served calls that is the decision, not a guess.

Messages are compared by their stored forms first (equal part hashes), then
by their chat-template form without reasoning (some harnesses drop earlier
reasoning when resending), without vendor hints (cache_control moves) and
without tool call ids (Gemini CLI names the calls the Gemini API left
unnamed when it replays them).
Only calls that hold a model turn are placed (`trainable`); the others get no
segment. Decided at the same time: `tools_absent`, a call whose messages hold
tool calls or results while its request defined no tools. The recorder's
writer, the v1 → v2 migration and nothing else call `SessionThreads.place`;
converters, the agent loop, grading and the analysis views read the stored
columns, through the readers at the end of this module and nowhere else:
which calls are model turns (`placed`, `PLACED_SQL`), a
session's calls grouped by segment (`stored_segments`), a segment's id
(`segment_id`, `SEGMENT_ID_SQL`), one sample's engine ids joined
(`joined_ids`), and the call grading reads (`main_thread`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Generic, TypeVar

from forgerl.harnesses import SUBAGENT_TOOLS

from .chat import to_chat_messages
from .messages import Message, canonical_json, sha256_hex
from .records import call_forms

ANSWER_HEADER = "x-forge-answer"  # serve mode: this answer's id
CONTINUES_HEADER = "x-forge-continues"  # serve mode: the answer whose ids this prompt extends ("" if none)
_MIN_SUMMARY = 20  # characters: shorter answers are too common to prove a compaction

MessageOf = Callable[[tuple], Message]  # a stored form of the session -> its message
_Ids = tuple[Sequence[int], Sequence[int]]  # engine prompt and completion ids


@dataclass(frozen=True)
class Placement:
    """A call's place in its session's threads (the `calls.segment_*` and `continues_call` columns)."""

    index: int
    reason: str
    parent: int | None
    parent_position: int | None
    continues: str | None

    def columns(self) -> dict[str, Any]:
        return {"segment_index": self.index, "segment_reason": self.reason, "parent_segment": self.parent,
                "parent_position": self.parent_position, "continues_call": self.continues}


NO_PLACE: dict[str, Any] = {"segment_index": None, "segment_reason": None, "parent_segment": None,
                            "parent_position": None, "continues_call": None}


def message_key(message: Message) -> str:
    """A message's identity for continuity: its chat form without reasoning and without tool call ids.

    Call ids are the harness's bookkeeping, not the model's words: Gemini CLI
    names each call the Gemini API left unnamed (and marks it with a made-up
    `thoughtSignature`, a part's extra, which the chat form leaves out anyway)
    when it sends the model's turn back, so with ids the replay would not
    continue the answer it repeats.
    """
    chat = []
    for m in to_chat_messages([message]):
        m = {k: v for k, v in m.items() if k not in ("reasoning_content", "tool_call_id")}
        if "tool_calls" in m:
            m["tool_calls"] = [{k: v for k, v in call.items() if k != "id"} for call in m["tool_calls"]]
        chat.append(m)
    return sha256_hex(canonical_json([message.role, chat]))


def succeeded(row: Mapping[str, Any]) -> bool:
    """A call that finished without an error or an HTTP error status."""
    status = row.get("status")
    return bool(row.get("complete")) and not row.get("error") and (status is None or status < 400)


def trainable(row: Mapping[str, Any]) -> bool:
    """Calls that hold a model turn: finished without error, with input and an assistant output (or, when
    served, the ids the policy generated: a turn that parses to nothing is still what it wrote)."""
    if not succeeded(row):
        return False
    generated = row.get("completion_token_ids")
    return bool(row.get("input_roles")) and (
        (generated is not None and len(generated) > 0)
        or any(form[0] == "assistant" and len(form) > 2 for form in call_forms(row, "output")))


@lru_cache(maxsize=64)
def _tool_names(tools_json: str | None) -> frozenset[str]:
    return frozenset(t.get("name") for t in json.loads(tools_json or "[]") if isinstance(t, dict))


@lru_cache(maxsize=64)
def tools_key(tools_json: str | None) -> str:
    """A digest of the offered tools' canonical JSON: equal digests, equal tool sets (a harness sends the
    same text on every call, so each distinct text is parsed once)."""
    return sha256_hex(canonical_json(json.loads(tools_json) if tools_json else []))


TOOL_PARTS = frozenset({"tool_call", "tool_result"})


def tools_absent(tools_json: str | None, part_types: Iterable[str]) -> bool:
    """Tool calls or results among a call's parts while its request defined no tools: a training row would
    teach calls to tools the model was never shown (Codex 0.171 with its own default model keeps its tool
    catalogue server-side)."""
    return tools_key(tools_json) == tools_key(None) and any(t in TOOL_PARTS for t in part_types)


def served_link(row: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """(this answer's id, the answer id it continues or None) for a served call, else None."""
    headers = row.get("response_headers")
    if not headers or ANSWER_HEADER not in headers.lower():
        return None
    parsed = {k.lower(): v for k, v in json.loads(headers).items()}
    answer = parsed.get(ANSWER_HEADER)
    return (answer, parsed.get(CONTINUES_HEADER) or None) if answer else None


@dataclass
class _Segment:
    index: int
    reason: str
    parent: int | None
    parent_position: int | None
    forms: list[tuple] = field(default_factory=list)  # last call's input + output forms
    keys: list[str] = field(default_factory=list)  # message keys of `forms`
    tools_key: str = ""
    calls: int = 0
    last_call: str = ""
    answer: str = ""  # the last call's answer text (a later compaction quotes it)
    waits_on_subagent: bool = False
    briefs: tuple[str, ...] = ()  # the text arguments (the prompt) of the subagent calls it waits on
    instructions: frozenset[str] = frozenset()  # the part hashes of its leading system / developer messages
    tool_names: frozenset[str] = frozenset()  # the names of the tools offered
    ids: _Ids | None = None  # the last call's engine prompt + completion ids


def engine_ids(row: Mapping[str, Any]) -> _Ids | None:
    """The prompt and completion ids the engine reported for a call, if it reported both (serve mode)."""
    prompt, completion = row.get("prompt_token_ids"), row.get("completion_token_ids")
    if prompt is None or completion is None or not len(prompt) or not len(completion):
        return None
    return prompt, completion


def _extends(prompt: Sequence[int], previous: _Ids) -> bool:
    before, completion = previous
    n, m = len(before), len(completion)
    return len(prompt) >= n + m and list(prompt[:n]) == list(before) and list(prompt[n: n + m]) == list(completion)


def _briefs(said: Sequence[Message]) -> tuple[str, ...]:
    """The text arguments of the subagent calls in an answer (the prompt the subagent is given), long enough
    to recognise when the subagent's conversation quotes them."""
    out = []
    for part in (p for m in said for p in m.parts if p.type == "tool_call" and p.tool_name in SUBAGENT_TOOLS):
        try:
            arguments = json.loads(part.arguments or "{}")
        except ValueError:
            continue
        if isinstance(arguments, dict):
            out += [v for v in arguments.values() if isinstance(v, str) and len(v) >= _MIN_SUMMARY]
    return tuple(out)


def _leading_system(forms: Sequence[tuple]) -> int:
    """How many of the stored forms are leading system / developer messages (a form starts with its role)."""
    n = 0
    while n < len(forms) and forms[n][0] in ("system", "developer"):
        n += 1
    return n


def _instructions(forms: Sequence[tuple]) -> frozenset[str]:
    """The part hashes of system messages' stored forms."""
    return frozenset(h for form in forms for h in form[2:])


def _common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class SessionThreads:
    """The segments of one session so far; `place` assigns each new trainable call its segment."""

    def __init__(self) -> None:
        self.segments: list[_Segment] = []
        self._key_memo: dict[tuple, str] = {}
        self._of_call: dict[str, _Segment] = {}
        self._call_of_answer: dict[str, str] = {}

    def _keys(self, forms: Sequence[tuple], message_of: MessageOf) -> list[str]:
        out = []
        for form in forms:
            key = self._key_memo.get(form)
            if key is None:
                key = self._key_memo[form] = message_key(message_of(form))
            out.append(key)
        return out

    def place(self, row: Mapping[str, Any], message_of: MessageOf) -> Placement | None:
        """The call's placement (None if it holds no model turn), remembered for the calls after it."""
        if not trainable(row):
            return None
        inputs, outputs = call_forms(row, "input"), call_forms(row, "output")
        tools = tools_key(row.get("tools"))
        ids = engine_ids(row)
        link = served_link(row)
        target, new = self._served(link) if link else self._continued(inputs, tools, ids, message_of)
        if target is None:
            target = new or self._new_segment(inputs, tools, _tool_names(row.get("tools")), message_of)
            target.tools_key = tools
            self.segments.append(target)
        placement = Placement(target.index, target.reason, target.parent, target.parent_position,
                              target.last_call or None)
        self._extend(target, row, inputs, outputs, message_of, ids)
        if link:
            self._call_of_answer[link[0]] = row["call_id"]
        return placement

    def restore(self, rows: Sequence[Mapping[str, Any]], message_of: MessageOf) -> None:
        """Take up a session where stored calls left it (another writer or an earlier run recorded them),
        following their stored placement rather than deciding it again. `rows` in recording order."""
        for row in rows:
            index = row.get("segment_index")
            if index is None:
                continue
            while len(self.segments) <= index:  # a gap (a segment whose calls are elsewhere) stays a stub
                self.segments.append(_Segment(len(self.segments), "", None, None))
            seg = self.segments[index]
            if not seg.calls:
                seg.reason, seg.parent, seg.parent_position = (row["segment_reason"], row["parent_segment"],
                                                               row["parent_position"])
                seg.tools_key = tools_key(row.get("tools"))
            self._extend(seg, row, call_forms(row, "input"), call_forms(row, "output"), message_of, engine_ids(row))
            link = served_link(row)
            if link:
                self._call_of_answer[link[0]] = row["call_id"]

    def _served(self, link: tuple[str, str | None]) -> tuple[_Segment | None, _Segment | None]:
        """Serve mode's own answer: (the segment whose last call made the continued answer, or None;
        a fork to start when another call already continued that answer)."""
        continued = self._call_of_answer.get(link[1] or "")
        seg = self._of_call.get(continued or "")
        if seg is None:
            return None, None
        if seg.last_call == continued:
            return seg, None
        return None, self._child("edited_history", seg)  # an answer continued twice: a fork

    def _continued(self, inputs: list[tuple], tools: str, ids: _Ids | None,
                   message_of: MessageOf) -> tuple[_Segment | None, _Segment | None]:
        """(the longest segment, the first on ties, whose conversation the input extends, or None;
        the segment to start instead when the messages continue but the token ids do not)."""
        keys: list[str] | None = None
        fits = [s for s in self.segments if s.tools_key == tools and len(s.forms) <= len(inputs)]
        for seg in sorted(fits, key=lambda s: -len(s.forms)):
            n = len(seg.forms)
            if inputs[:n] != seg.forms:
                keys = self._keys(inputs, message_of) if keys is None else keys
                if keys[:n] != seg.keys:
                    continue
            if ids is not None and seg.ids is not None and not _extends(ids[0], seg.ids):
                return None, self._child("token_break", seg)
            return seg, None
        return None, None

    def _child(self, reason: str, parent: _Segment) -> _Segment:
        return _Segment(len(self.segments), reason, parent.index, parent.calls)

    def _new_segment(self, inputs: list[tuple], tools: str, tool_names: frozenset[str],
                     message_of: MessageOf) -> _Segment:
        if not self.segments:
            return _Segment(0, "start", None, None)
        keys = self._keys(inputs, message_of)
        best_len, best = max(((_common_prefix(keys, s.keys), s) for s in self.segments),
                             key=lambda x: (x[0], x[1].index))
        if best_len >= len(best.forms) and best.tools_key != tools:
            return self._child("tools_changed", best)
        messages = [message_of(form) for form in inputs]
        quoted = "\n".join("".join(p.text or "" for p in m.parts if p.type == "text")
                           for m in messages if m.role == "user")
        waiting = [s for s in self.segments if s.waits_on_subagent]
        for seg in reversed(waiting):  # given the prompt a waiting call wrote, even when it repeats the waiting
            if any(brief in quoted for brief in seg.briefs):  # one's own (a nested subagent of the same kind)
                return self._child("subagent", seg)
        for seg in reversed(self.segments):
            if len(seg.answer) >= _MIN_SUMMARY and seg.answer in quoted:
                return self._child("compaction", seg)
        system = _leading_system(inputs)
        if best_len <= system:
            if waiting:
                return self._child("subagent", waiting[-1])
            # a resumed harness may rewrite early messages (fresh reminders): shared messages still link it (on
            # ties, to a segment that shares some of its instructions)
            mine = _instructions(inputs[:system])
            overlap, shared, best = max(((len(set(keys[system:]) & set(s.keys)), bool(mine & s.instructions), s)
                                         for s in self.segments), key=lambda x: (x[0], x[1], x[2].index))
            if overlap < 2:
                return _Segment(len(self.segments), "new_conversation", None, None)
            if not shared and tool_names != best.tool_names:
                # another agent given the conversation: no part of its instructions in common, other tools (a
                # resumed Claude Code rewrites a part of its system prompt and a tool's description, no more).
                # Qwen Code's memory extractor, after the main agent's last answer, is one.
                return self._child("subagent", best)
        return self._child("edited_history", best)

    def _extend(self, seg: _Segment, row: Mapping[str, Any], inputs: list[tuple], outputs: list[tuple],
                message_of: MessageOf, ids: _Ids | None) -> None:
        said = [message_of(form) for form in outputs]
        seg.forms = inputs + outputs
        seg.keys = self._keys(seg.forms, message_of)
        seg.calls += 1
        seg.last_call = row["call_id"]
        seg.answer = "".join(m.text() for m in said if m.role == "assistant").strip()
        seg.waits_on_subagent = any(p.type == "tool_call" and p.tool_name in SUBAGENT_TOOLS
                                    for m in said for p in m.parts)
        seg.briefs = _briefs(said)
        seg.instructions = _instructions(inputs[:_leading_system(inputs)])
        seg.tool_names = _tool_names(row.get("tools"))
        seg.ids = ids
        self._of_call[row["call_id"]] = seg


# -- reading the stored placement ------------------------------------------------------------------------------

PLACED_SQL = "segment_index IS NOT NULL"  # `placed` in SQL
SEGMENT_ID_SQL = "session_id || ':' || segment_index"  # `segment_id` in SQL
_Call = TypeVar("_Call")
_IdList = TypeVar("_IdList", bound=Sequence[int])


def placed(row: Mapping[str, Any]) -> bool:
    """Whether a stored call holds a model turn: the writer placed it (`trainable`, decided once, as it was
    written), so every reader counts the same calls as the model's turns."""
    return row.get("segment_index") is not None


def segment_id(session_id: str, index: int, position: int | None = None) -> str:
    """A segment's id, `session:index` (its call `position` as a sample of its own: `session:index/position`):
    the id every output names the segment by (tokens, verl-sft, ATIF, the RL rows, the analysis views)."""
    return f"{session_id}:{index}" + ("" if position is None else f"/{position}")


@dataclass
class StoredSegment(Generic[_Call]):
    """One stored segment of a session: its placement and its calls in recording order."""

    index: int
    reason: str
    parent: int | None
    parent_position: int | None  # how many of the parent's calls preceded this segment's first call
    calls: list[_Call] = field(default_factory=list)


def _itself(call: Any) -> Mapping[str, Any]:
    return call


def stored_segments(calls: Iterable[_Call],
                    row: Callable[[_Call], Mapping[str, Any]] = _itself) -> list[StoredSegment[_Call]]:
    """A session's calls (in recording order) grouped into the segments stored on them, in segment order;
    calls that hold no model turn are left out. `row` gives a call's columns when the calls are not rows."""
    by_index: dict[int, StoredSegment[_Call]] = {}
    for call in calls:
        columns = row(call)
        if not placed(columns):
            continue
        index = columns["segment_index"]
        seg = by_index.get(index)
        if seg is None:
            seg = by_index[index] = StoredSegment(index, columns["segment_reason"], columns["parent_segment"],
                                                  columns["parent_position"])
        seg.calls.append(call)
    return [by_index[i] for i in sorted(by_index)]


def joined_ids(calls: Iterable[tuple[str, _IdList, _IdList]], segment: str) -> Iterator[tuple[_IdList, _IdList]]:
    """One sample from a segment's calls, each `(call id, engine prompt ids, completion ids)` in order: per call,
    the ids its prompt adds to the ones before it (the first call's whole prompt; later, the tool results and
    user turns: context) and its completion (the model's). A stored segment never holds a call whose prompt
    does not extend the ids before it (`token_break`), so a shorter one is a bug: RuntimeError."""
    held = 0
    for call_id, prompt, completion in calls:
        if len(prompt) < held:
            raise RuntimeError(f"segment {segment}: call {call_id}'s prompt is shorter than the ids before it; "
                               "the stored segment contradicts its token ids")
        yield prompt[held:], completion
        held = len(prompt) + len(completion)


def recorded_order(row: Mapping[str, Any]) -> tuple:
    """A call row's sort key: the order calls were made (start time, the writer's sequence, the call id)."""
    return row["t_start"], row.get("seq") or 0, row["call_id"]


def main_thread(rows: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The call grading reads: the last call of the latest segment (by its last call) reachable from a root
    (segment 0, or a `new_conversation`) without a `subagent` edge; None when no call holds a model turn.

    A session's last call is not always the main agent's: a subagent may answer
    last, and Qwen Code's memory extractor (placed as a `subagent`: another
    agent given the conversation) makes one more call after the final answer.
    Compactions, resumed runs, token breaks and tool changes carry the main
    thread on. A `new_conversation` may carry it too: Qwen Code's first resumed
    round rewrites its first message and shares too little to be linked.
    """
    segments = stored_segments(sorted((r for r in rows if placed(r)), key=recorded_order))
    main: set[int] = set()
    for seg in segments:  # a parent's index is lower than its children's
        if seg.parent is None or (seg.parent in main and seg.reason != "subagent"):
            main.add(seg.index)
    last = [seg.calls[-1] for seg in segments if seg.index in main]
    return max(last, key=recorded_order) if last else None
