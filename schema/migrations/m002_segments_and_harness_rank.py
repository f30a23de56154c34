"""m002_segments_and_harness_rank (v1 -> v2): every trainable call gets its place in its session's threads,
and every `sessions` row the rank of the evidence that named its harness.

Frozen: the placement below is a copy of `schema/segments.py`'s `SessionThreads.place` (and what it calls) as it
stood when this migration was frozen (after schema v4, commit 3d48f63), not an import of it, so a change to the
live segmenter cannot change what upgrading an old dataset produces (`duplicates` pairs the two on purpose). The
subagent tool names are frozen with it. What it still shares with the live code is the stored format itself: how
a row's message forms are read (`records.call_forms`, `MessageMemo`) and a message's chat form and hash
(`chat.to_chat_messages`, `messages.canonical_json`); `tests/test_migration_golden.py` upgrades a stored v1 dataset
and compares every table with the committed result, so a change there shows too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import duckdb
import pyarrow as pa

from ..chat import to_chat_messages
from ..conform import conform, open_parquet, read_files
from ..files import atomic_write_table, data_files
from ..messages import Message, canonical_json, sha256_hex
from ..records import MessageMemo, call_forms
from ..tables import TABLES

SUBAGENT_TOOLS = frozenset({"Agent", "Task", "agent", "delegate", "invoke_agent", "sessions_spawn", "spawn_agent",
                            "task"})
MessageOf = Callable[[tuple], Message]
_Ids = tuple[Sequence[int], Sequence[int]]

ANSWER_HEADER = "x-forge-answer"  # serve mode: this answer's id
CONTINUES_HEADER = "x-forge-continues"  # serve mode: the answer whose ids this prompt extends ("" if none)
_MIN_SUMMARY = 20  # characters: shorter answers are too common to prove a compaction



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


# ------------------------------------------------------------------ the migration

# The harness names v1's User-Agent table gave SDKs and runtimes rather than harnesses.
_V1_GENERIC = frozenset({"anthropic-python", "anthropic-js", "openai-python", "openai-js"})
# What placing a v1 call reads (v1 files have no placement yet).
_PLACE_COLUMNS = ["call_id", "session_id", "seq", "t_start", "status", "error", "complete", "tools", "response_headers",
                  "input_refs", "input_msg", "input_roles", "input_extra", "output_refs", "output_msg", "output_roles",
                  "output_extra", "prompt_token_ids", "completion_token_ids"]


def _v1_rank(harness: str | None) -> int:
    return 0 if harness in (None, "unknown") else 1 if harness in _V1_GENERIC else 2


def _placements(root: str) -> dict[str, dict[str, Any]]:
    """call id -> segment columns, each session's calls placed in recording order."""
    calls, parts = data_files(root, "calls"), data_files(root, "messages")
    if not calls:
        return {}
    con = duckdb.connect()
    con.register("calls", read_files("calls", calls).select(_PLACE_COLUMNS))
    rows = con.sql("SELECT * FROM calls ORDER BY session_id, t_start, seq, call_id").to_arrow_table().to_pylist()
    by_session: dict[str, dict[str, str]] = {}
    if parts:
        con.register("parts", read_files("messages", parts).select(["session_id", "part_hash", "part"]))
        for sid, digest, part in con.sql("SELECT DISTINCT session_id, part_hash, part FROM parts").fetchall():
            by_session.setdefault(sid, {})[digest] = part
    out: dict[str, dict[str, Any]] = {}
    threads, memo, current = SessionThreads(), MessageMemo(), None
    for row in rows:
        if row["session_id"] != current:
            threads, memo, current = SessionThreads(), MessageMemo(), row["session_id"]
        parts_of = by_session.get(current, {})
        placement = threads.place(row, lambda form: memo.message(form, parts_of))
        out[row["call_id"]] = placement.columns() if placement else NO_PLACE
    return out


def apply(root: str) -> None:
    placed = _placements(root)
    for path in data_files(root, "calls"):
        with open_parquet(path) as parquet:
            table = conform(parquet.read(), TABLES["calls"])
        ids = table.column("call_id").to_pylist()
        for name in NO_PLACE:
            values = [placed.get(i, NO_PLACE)[name] for i in ids]
            table = table.set_column(table.schema.get_field_index(name), name,
                                     pa.array(values, TABLES["calls"].field(name).type))
        atomic_write_table(path, table, "calls", 2)
    for path in data_files(root, "sessions"):
        with open_parquet(path) as parquet:
            table = conform(parquet.read(), TABLES["sessions"])
        ranks = pa.array([_v1_rank(h) for h in table.column("harness").to_pylist()], pa.int32())
        table = table.set_column(table.schema.get_field_index("harness_rank"), "harness_rank", ranks)
        atomic_write_table(path, table, "sessions", 2)
