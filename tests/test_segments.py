"""Where the segmenter puts calls the end-to-end tests do not reach (served forks, token breaks, tool changes,
nested and forked subagents, ids a harness adds when it replays a turn), and what the readers of the stored
placement make of it (the main thread grading reads, grouping, joined token ids); one real Claude Code run
whose subagent calls `Agent` again."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from forgerl.schema.messages import Exchange, Message, Part
from forgerl.schema.records import CallRecord, call_rows
from forgerl.schema.segments import (ANSWER_HEADER, CONTINUES_HEADER, SessionThreads, joined_ids, main_thread,
                                     segment_id, stored_segments)
from forgerl.schema.writer import place_call

from conftest import session_calls
from harness_checks import needs, record_trapped
from scripted_upstream import Request, ToolCall, Turn, saw_tool_result

SYSTEM = Message("system", (Part("text", text="you are a test"),))
USER = Message("user", (Part("text", text="do the task"),))


def _say(i: int) -> Message:
    return Message("assistant", (Part("text", text=f"answer number {i}"),))


def _result(i: int) -> Message:
    return Message("user", (Part("text", text=f"next step {i}"),))


def place(threads: SessionThreads, i: int, history: list[Message], *, tools: list | None = None,
          ids: tuple[list[int], list[int]] | None = None, served: tuple[str, str] | None = None,
          said: Message | None = None) -> dict:
    ex = Exchange(input=list(history), output=[said or _say(i)], tools=tools)
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


# -- subagents, as Claude Code 2.1 and Qwen Code 0.24 send them ---------------------------------------------------

SUB_PROMPT = "Count the files in the current directory and report the number."
MAIN_SYSTEM = Message("system", (Part("text", text="x-anthropic-billing-header: cc_version=2.1.197.cec;"),
                                 Part("text", text="You are an interactive agent that helps users with software "
                                                   "engineering tasks.")))
SUB_SYSTEM = Message("system", (Part("text", text="x-anthropic-billing-header: cc_version=2.1.197.ac5; "
                                                  "cc_is_subagent=true;"),
                                Part("text", text="You are an agent for Claude Code, Anthropic's official CLI for "
                                                  "Claude. Given the user's message, you should use the tools")))
REMINDER = Part("text", text="<system-reminder>\nToday's date is 2026-12-07.\n</system-reminder>")
AGENT_TOOL = {"name": "Agent", "description": "Launch a new agent", "input_schema": {"type": "object"}}
TOOLS = [AGENT_TOOL, {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}]


def delegate(call_id: str, text: str = "I will delegate.") -> Message:
    arguments = json.dumps({"description": "Count files", "prompt": SUB_PROMPT, "subagent_type": "general-purpose"})
    return Message("assistant", (Part("text", text=text),
                                 Part("tool_call", tool_name="Agent", call_id=call_id, arguments=arguments)))


def answered(call_id: str, text: str) -> Message:
    return Message("user", (Part("tool_result", call_id=call_id, content=(Part("text", text=text),)),))


def test_a_nested_subagent_that_repeats_its_parents_prompt_is_a_subagent_of_it():
    """Claude Code's subagent calls `Agent` with the prompt it was given: the nested subagent's conversation starts
    as its parent's did (same system prompt, same prompt), while the parent waits on that call."""
    t = SessionThreads()
    main_user = Message("user", (REMINDER, Part("text", text="How many files are here? Use a subagent.")))
    sub_user = Message("user", (REMINDER, Part("text", text=SUB_PROMPT)))
    assert place(t, 0, [MAIN_SYSTEM, main_user], tools=TOOLS, said=delegate("toolu_a"))["segment_reason"] == "start"
    sub = place(t, 1, [SUB_SYSTEM, sub_user], tools=TOOLS, said=delegate("toolu_b", "I will delegate again."))
    assert (sub["segment_index"], sub["segment_reason"], sub["parent_segment"]) == (1, "subagent", 0)
    nested = place(t, 2, [SUB_SYSTEM, sub_user], tools=TOOLS, said=_say(2))
    assert (nested["segment_index"], nested["segment_reason"], nested["parent_segment"]) == (2, "subagent", 1)
    back = place(t, 3, [SUB_SYSTEM, sub_user, delegate("toolu_b", "I will delegate again."),
                        answered("toolu_b", "answer number 2")], tools=TOOLS)
    assert (back["segment_index"], back["continues_call"]) == (1, "c1")
    done = place(t, 4, [MAIN_SYSTEM, main_user, delegate("toolu_a"), answered("toolu_a", "answer number 3")],
                 tools=TOOLS)
    assert (done["segment_index"], done["continues_call"]) == (0, "c0")


def test_a_forked_agent_given_the_conversation_is_a_subagent_and_a_resumed_one_edits_history():
    """Qwen Code's memory extractor runs after the final answer with its own system prompt and tools and the main
    conversation as history: another agent, so grading's main thread leaves it out. A resumed Claude Code
    (`--continue`) rewrites its reminders, a part of its system prompt and a tool's description: it still edits
    the main thread's history."""
    t = SessionThreads()
    task = Message("user", (Part("text", text="Write proof.txt, then read it back."),))
    history = [task, _say(0), _result(0)]
    place(t, 0, [MAIN_SYSTEM, task], tools=TOOLS)
    place(t, 1, [MAIN_SYSTEM, *history], tools=TOOLS)
    extractor = Message("system", (Part("text", text="You are the managed auto-memory extraction agent."),))
    brief = Message("user", (Part("text", text="Extract durable memories from the conversation above."),))
    fork = place(t, 2, [extractor, *history, _say(1), brief], tools=TOOLS[1:])
    assert (fork["segment_reason"], fork["parent_segment"]) == ("subagent", 0)
    rewritten = Message("system", (MAIN_SYSTEM.parts[0], Part("text", text="You are an interactive agent (memory "
                                                                            "at a new path).")))
    tools = [TOOLS[0], {**TOOLS[1], "description": "Run a command (now with a sandbox note)"}]
    resumed = place(t, 3, [rewritten, Message("user", (REMINDER, *task.parts)), _say(0), _result(0), _say(1),
                           Message("user", (Part("text", text="And now?"),))], tools=tools)
    assert (resumed["segment_reason"], resumed["parent_segment"]) == ("edited_history", 0)


def test_ids_a_harness_gives_the_calls_it_replays_do_not_break_the_thread():
    """Gemini CLI names each call the Gemini API left unnamed and adds a made-up thought signature when it sends
    the model's turn back: the replay still continues the answer (the stored replay keeps both)."""
    t = SessionThreads()
    made = Message("assistant", (Part("tool_call", tool_name="write_file", arguments='{"file_path":"p"}'),))
    replayed = Message("assistant", (Part("tool_call", tool_name="write_file", call_id="write_file_1796662272890_0",
                                          arguments='{"file_path":"p"}',
                                          extra={"thoughtSignature": "skip_thought_signature_validator"}),))
    result = Message("user", (Part("tool_result", call_id="write_file_1796662272890_0", text='{"output":"ok"}'),))
    place(t, 0, [SYSTEM, USER], said=made)
    loop = place(t, 1, [SYSTEM, USER, replayed, result])
    assert (loop["segment_index"], loop["continues_call"]) == (0, "c0")
    # another call with other arguments is another turn
    other = Message("assistant", (Part("tool_call", tool_name="write_file", call_id="x",
                                       arguments='{"file_path":"q"}'),))
    assert place(t, 2, [SYSTEM, USER, other, result])["segment_reason"] == "edited_history"


def _user_texts(request: Request) -> list[str]:
    out = []
    for message in request.body.get("messages") or []:
        content = message.get("content") if message.get("role") == "user" else None
        out += [content] if isinstance(content, str) else [c.get("text", "") for c in content or []
                                                            if isinstance(c, dict) and c.get("type") == "text"]
    return out


@pytest.mark.slow
def test_claude_codes_nested_subagent(tmp_path):
    """The real CLI: the main agent delegates, its subagent delegates the same prompt again, the nested one answers,
    then each parent. Each subagent is the subagent of the one that called it, and grading reads the main agent."""
    claude = needs("claude")
    asked = []

    def script(request: Request) -> Turn:
        texts = _user_texts(request)
        tools = {t.get("name") for t in request.body.get("tools") or []}
        delegate = ToolCall("Agent", {"description": "Count files", "prompt": SUB_PROMPT,
                                      "subagent_type": "general-purpose"})
        if any(SUB_PROMPT in t for t in texts):
            if saw_tool_result(request):
                return Turn(text="My helper counted 42 files.")
            asked.append(request)
            if len(asked) == 1 and "Agent" in tools:
                return Turn(text="I will delegate again.", tool_calls=[delegate])
            return Turn(text="The directory holds 42 files.")
        if "Agent" in tools and not saw_tool_result(request):
            return Turn(text="I will delegate.", tool_calls=[delegate])
        return Turn(text="Done: there are 42 files.")

    rec = record_trapped(tmp_path, "nest", script,
                         [str(claude), "-p", "How many files are here? Use a subagent.", "--output-format", "json",
                          "--dangerously-skip-permissions"],
                         {"ANTHROPIC_API_KEY": "sk-ant-api03-segmenttestsegmenttest", "IS_SANDBOX": "1",
                          "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
    assert rec["run"].returncode == 0, rec["run"].stdout[-2000:] + rec["run"].stderr[-2000:]
    calls = [c for c in session_calls(rec["data"], "nest", 5) if c["segment_index"] is not None]
    calls.sort(key=lambda c: (c["t_start"], c["seq"]))
    assert [(c["segment_index"], c["segment_reason"], c["parent_segment"]) for c in calls] == [
        (0, "start", None), (1, "subagent", 0), (2, "subagent", 1), (1, "subagent", 0), (0, "start", None)]
    assert main_thread(calls)["call_id"] == calls[-1]["call_id"]
    assert "Done: there are 42 files." in calls[-1]["response"]


# -- the stored placement's readers -----------------------------------------------------------------------------

def stored(*placements: tuple[int | None, str | None, int | None]) -> list[dict]:
    """Call rows in recording order, call k with placement k: (segment index, reason, parent segment)."""
    return [{"call_id": f"c{k}", "session_id": "s", "seq": k, "t_start": datetime(2026, 1, 1, tzinfo=timezone.utc),
             "segment_index": index, "segment_reason": reason, "parent_segment": parent,
             "parent_position": None if parent is None else 1}
            for k, (index, reason, parent) in enumerate(placements)]


@pytest.mark.parametrize("placements, graded", [
    # the main agent answers, then Qwen Code's memory extractor (a forked agent) makes the session's last call
    ([(0, "start", None), (0, "start", None), (1, "subagent", 0)], "c1"),
    # Claude Code: main, its subagent, a resumed run, the compaction that carries it on
    ([(0, "start", None), (1, "subagent", 0), (0, "start", None), (2, "edited_history", 0),
      (3, "compaction", 2), (None, None, None)], "c4"),
    # a subagent of the compacted thread answers last; a token break carries the main thread on
    ([(0, "start", None), (1, "token_break", 0), (2, "subagent", 1), (2, "subagent", 1)], "c1"),
    # Qwen Code's first resumed round shares too little to be linked; the second edits its history
    ([(0, "start", None), (1, "new_conversation", None), (2, "edited_history", 1), (3, "subagent", 2)], "c2"),
    # a side conversation (a title) made first, the main agent's after it
    ([(0, "start", None), (1, "new_conversation", None), (1, "new_conversation", None)], "c2"),
    ([(None, None, None)], None),
])
def test_grading_reads_the_main_threads_last_call(placements, graded):
    rows = stored(*placements)
    found = main_thread(list(reversed(rows)))  # in any order
    assert (found and found["call_id"]) == graded


def test_stored_segments_group_placed_calls_in_segment_order():
    rows = stored((0, "start", None), (1, "subagent", 0), (None, None, None), (0, "start", None))
    groups = stored_segments(rows)
    assert [(g.index, g.reason, g.parent, [c["call_id"] for c in g.calls]) for g in groups] == [
        (0, "start", None, ["c0", "c3"]), (1, "subagent", 0, ["c1"])]
    assert [segment_id("s", 1), segment_id("s", 1, 0)] == ["s:1", "s:1/0"]


def test_joined_ids_add_each_prompts_new_tail():
    pieces = list(joined_ids([("a", [1, 2], [3]), ("b", [1, 2, 3, 4], [5, 6])], "s:0"))
    assert pieces == [([1, 2], [3]), ([4], [5, 6])]
    with pytest.raises(RuntimeError, match="call b's prompt is shorter"):
        list(joined_ids([("a", [1, 2], [3]), ("b", [1, 2], [5])], "s:0"))
