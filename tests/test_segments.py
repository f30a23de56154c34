"""Where the segmenter puts calls the end-to-end tests do not reach: served forks, token breaks, tool changes."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from forgerl.schema.messages import Exchange, Message, Part
from forgerl.schema.records import CallRecord, call_rows
from forgerl.schema.segments import ANSWER_HEADER, CONTINUES_HEADER, SessionThreads
from forgerl.schema.store import place_call

SYSTEM = Message("system", (Part("text", text="you are a test"),))
USER = Message("user", (Part("text", text="do the task"),))


def _say(i: int) -> Message:
    return Message("assistant", (Part("text", text=f"answer number {i}"),))


def _result(i: int) -> Message:
    return Message("user", (Part("text", text=f"next step {i}"),))


def place(threads: SessionThreads, i: int, history: list[Message], *, tools: list | None = None,
          ids: tuple[list[int], list[int]] | None = None, served: tuple[str, str] | None = None) -> dict:
    ex = Exchange(input=list(history), output=[_say(i)], tools=tools)
    if ids:
        ex.prompt_token_ids, ex.completion_token_ids = ids
    record = CallRecord(call_id=f"c{i}", session_id="s", api="anthropic", method="POST", path="/v1/messages",
                        t_start=datetime.now(timezone.utc), complete=True, status=200, exchange=ex,
                        response_headers={ANSWER_HEADER: served[0], CONTINUES_HEADER: served[1]} if served else None)
    row = call_rows(record, set(), set())[0]
    return place_call(threads, row, record)


def test_served_calls_follow_the_answer_they_continue_and_a_second_continuation_forks():
    t = SessionThreads()
    assert place(t, 0, [SYSTEM, USER], served=("a0", ""))["segment_reason"] == "start"
    one = place(t, 1, [SYSTEM, USER, _say(0), _result(0)], served=("a1", "a0"))
    assert (one["segment_index"], one["continues_call"]) == (0, "c0")
    # the harness retried from answer a0: serve mode says so, and the call forks off segment 0
    fork = place(t, 2, [SYSTEM, USER, _say(0), _result(9)], served=("a2", "a0"))
    assert (fork["segment_index"], fork["segment_reason"], fork["parent_segment"]) == (1, "edited_history", 0)
    # serve mode rendered afresh: a new segment even though the messages would continue segment 0
    fresh = place(t, 3, [SYSTEM, USER, _say(0), _result(0), _say(1), _result(1)], served=("a3", ""))
    assert fresh["segment_index"] == 2 and fresh["continues_call"] is None


def test_messages_that_continue_with_ids_that_do_not_is_a_token_break():
    t = SessionThreads()
    place(t, 0, [SYSTEM, USER], ids=([1, 2, 3], [4, 5]))
    same = place(t, 1, [SYSTEM, USER, _say(0), _result(0)], ids=([1, 2, 3, 4, 5, 6], [7]))
    assert (same["segment_index"], same["continues_call"]) == (0, "c0")
    broke = place(t, 2, [SYSTEM, USER, _say(0), _result(0), _say(1), _result(1)], ids=([1, 2, 3, 6, 7, 8], [9]))
    assert (broke["segment_index"], broke["segment_reason"], broke["parent_segment"]) == (1, "token_break", 0)


def test_other_tools_on_the_same_history_start_a_linked_segment():
    t = SessionThreads()
    tool = {"name": "run", "description": "x", "parameters": {"type": "object"}}
    place(t, 0, [SYSTEM, USER], tools=[tool])
    changed = place(t, 1, [SYSTEM, USER, _say(0), _result(0)], tools=[tool, {**tool, "name": "other"}])
    assert (changed["segment_reason"], changed["parent_segment"], changed["parent_position"]) == ("tools_changed", 0, 1)
    assert json.dumps(changed)  # plain columns, ready for the calls table
