"""Scripted harness-like sessions for the hand-labelled analysis fixtures and the bundled example dataset.

Each `Scenario` is what a model "says" turn by turn and what the harness's
tools answer. `play` drives it with the real SDK clients (anthropic, openai)
through a recorder session URL, sending a harness's User-Agent and tool names,
so the recorder sees the traffic a harness would send. `script` is the
upstream's side: it finds the scenario named in the first user text and
answers the turn given by the number of assistant messages so far.
Used only to record data: by tests/analysis_fixtures.py, and by
examples/record_example.py for analysis/example/.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from forgerl.schema.messages import Usage

from scripted_upstream import Request, ToolCall, Turn

USAGE = Usage(input_tokens=100, output_tokens=10, cache_read_tokens=1000, cache_write_tokens=50)
CLAUDE_UA = "claude-cli/2.1.197 (external, sdk-cli)"
CODEX_UA = "codex_exec/0.171.0 (Debian 12; x86_64) xterm"
REMINDER = "<system-reminder>\nThe task tools are available.\n</system-reminder>"
ENV_CONTEXT = "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"
TAG = re.compile(r"\[scenario: ([\w/-]+)\]")


@dataclass
class Step:
    """One model turn and the harness's answer to each of its tool calls: {call id: (text, is_error)}."""

    turn: Turn
    results: dict[str, tuple[str, bool | None]] = field(default_factory=dict)
    fault: str | None = None  # the upstream fails this call instead (scripted fault name)


@dataclass
class Scenario:
    session: str
    api: str  # anthropic | responses | chat
    user_agent: str
    prompt: str
    steps: list[Step]
    tools: list[str] = field(default_factory=list)
    preamble: list[str] = field(default_factory=list)  # harness-written user text sent before the prompt
    model: str = "claude-sonnet-4-5"
    subagents: dict[str, Scenario] = field(default_factory=dict)  # by the Agent call id that starts them


def call(name: str, cid: str, **args: Any) -> ToolCall:
    return ToolCall(name, args, id=cid)


def turn(*calls: ToolCall, text: str = "") -> Turn:
    return Turn(text=text, tool_calls=list(calls), usage=USAGE)


def ok(text: str = "ok") -> tuple[str, bool | None]:
    return (text, None)


def _todos(*statuses: str) -> list[dict[str, str]]:
    return [{"content": f"item {i}", "status": s, "activeForm": f"doing item {i}"} for i, s in enumerate(statuses)]


def scenarios() -> list[Scenario]:
    """The fixture sessions; tests/analysis_fixtures.py holds their hand-labelled expected metrics."""
    cc_tools = ["Bash", "Read", "Edit", "Write", "Glob", "Grep", "TodoWrite", "Agent"]
    patch1 = "*** Begin Patch\n*** Add File: hello.py\n+print(greeting)\n*** End Patch"
    patch2 = "*** Begin Patch\n*** Update File: hello.py\n@@\n-print(greeting)\n+print('hi')\n*** End Patch"
    sub = Scenario("cc-subagent", "anthropic", CLAUDE_UA, "[scenario: cc-subagent/sub] Find the config file", [
        Step(turn(call("Glob", "toolu_s1", pattern="**/*.toml")), {"toolu_s1": ok("pyproject.toml")}),
        Step(turn(text="Found pyproject.toml")),
    ], tools=["Glob", "Read", "Bash"])
    return [
        Scenario("cc-verify", "anthropic", CLAUDE_UA, "[scenario: cc-verify] Fix the bug in calc.py", [
            Step(turn(call("TodoWrite", "toolu_v1", todos=_todos("pending", "pending", "pending"))), {"toolu_v1": ok()}),
            Step(turn(call("Read", "toolu_v2", file_path="/w/calc.py")), {"toolu_v2": ok("def add(a, b): return a - b")}),
            Step(turn(call("Edit", "toolu_v3", file_path="/w/calc.py", old_string="a - b", new_string="a + b")),
                 {"toolu_v3": ok("The file /w/calc.py has been updated.")}),
            Step(turn(call("Bash", "toolu_v4", command="cd /w && python -m pytest -q")), {"toolu_v4": ok("3 passed")}),
            Step(turn(call("TodoWrite", "toolu_v5", todos=_todos("completed", "completed", "pending"))),
                 {"toolu_v5": ok()}),
            Step(turn(text="Fixed.")),
        ], tools=cc_tools, preamble=[REMINDER]),
        Scenario("cc-recover2", "anthropic", CLAUDE_UA, "[scenario: cc-recover2] Make test_a pass", [
            Step(turn(call("Bash", "toolu_r1", command="pytest tests/test_a.py")),
                 {"toolu_r1": ("Exit code 1\nFAILED tests/test_a.py::test_a", True)}),
            Step(turn(call("Bash", "toolu_r2", command="pytest tests/test_a.py")),
                 {"toolu_r2": ok("FAILED tests/test_a.py::test_a\nExit code: 1")}),
            Step(turn(call("Edit", "toolu_r3", file_path="/w/a.py", old_string="x", new_string="y")),
                 {"toolu_r3": ok("updated")}),
            Step(turn(call("Bash", "toolu_r4", command="pytest tests/test_a.py")), {"toolu_r4": ok("1 passed")}),
            Step(turn(call("Write", "toolu_r5", file_path="/w/NOTES.md", content="fixed")), {"toolu_r5": ok("written")}),
            Step(turn(text="Done.")),
        ], tools=cc_tools),
        Scenario("cc-giveup-parallel", "anthropic", CLAUDE_UA, "[scenario: cc-giveup-parallel] Summarise missing.txt", [
            Step(turn(call("Read", "toolu_p1", file_path="/w/missing.txt"), call("Grep", "toolu_p2", pattern="TODO"),
                      call("Glob", "toolu_p3", pattern="*.py")),
                 {"toolu_p1": ("<tool_use_error>File does not exist.</tool_use_error>", True),
                  "toolu_p2": ok("a.py:3: TODO"), "toolu_p3": ok("a.py")}),
            Step(turn(text="I could not find missing.txt.")),
        ], tools=cc_tools),
        Scenario("cc-subagent", "anthropic", CLAUDE_UA, "[scenario: cc-subagent] Update the config and test it", [
            Step(turn(call("Agent", "toolu_a1", description="find config", prompt=sub.prompt, subagent_type="Explore")),
                 {"toolu_a1": ok("Found pyproject.toml")}),
            Step(turn(call("TaskCreate", "toolu_a2", subject="Update config", description="edit pyproject"),
                      call("TaskCreate", "toolu_a3", subject="Run tests", description="pytest")),
                 {"toolu_a2": ok("Task #1 created successfully: Update config"),
                  "toolu_a3": ok("Task #2 created successfully: Run tests")}),
            Step(turn(call("TaskUpdate", "toolu_a4", taskId="1", status="completed")), {"toolu_a4": ok("Updated task #1")}),
            Step(turn(text="Config updated.")),
        ], tools=["Bash", "Read", "Agent", "TaskCreate", "TaskUpdate", "TaskList"], subagents={"toolu_a1": sub}),
        Scenario("cc-errors-out", "anthropic", CLAUDE_UA, "[scenario: cc-errors-out] List the files", [
            Step(turn(call("Bash", "toolu_e1", command="ls")), {"toolu_e1": ok("a.py")}),
            Step(turn(text="never sent"), fault="500"),
        ], tools=cc_tools),
        Scenario("no-tools", "chat", "OpenAI/Python 2.54.0", "[scenario: no-tools] Say hello", [
            Step(turn(text="Hello!")),
        ], model="gpt-4.1"),
        Scenario("codex-patch", "responses", CODEX_UA, "[scenario: codex-patch] Add a greeting script", [
            Step(turn(call("update_plan", "call_c1", plan=[{"step": "write", "status": "in_progress"},
                                                            {"step": "run", "status": "pending"}])),
                 {"call_c1": ok("Plan updated")}),
            Step(turn(call("apply_patch", "call_c2", input=patch1)), {"call_c2": ok("Success. Updated: A hello.py")}),
            Step(turn(call("exec_command", "call_c3", cmd="python hello.py")),
                 {"call_c3": ok("Process exited with code 1\nOutput:\nNameError: name 'greeting' is not defined")}),
            Step(turn(call("apply_patch", "call_c4", input=patch2)), {"call_c4": ok("Success. Updated: M hello.py")}),
            Step(turn(call("exec_command", "call_c5", cmd="python hello.py")),
                 {"call_c5": ok("Process exited with code 0\nOutput:\nhi")}),
            Step(turn(call("update_plan", "call_c6", plan=[{"step": "write", "status": "completed"},
                                                            {"step": "run", "status": "completed"}])),
                 {"call_c6": ok("Plan updated")}),
            Step(turn(text="Done.")),
        ], tools=["exec_command", "write_stdin", "apply_patch", "update_plan", "view_image"],
            preamble=[ENV_CONTEXT], model="gpt-5"),
    ]


def _find(name: str, all_: list[Scenario]) -> Scenario:
    for s in all_:
        if s.session == name:
            return s
        for sub in s.subagents.values():
            if TAG.search(sub.prompt).group(1) == name:
                return sub
    raise KeyError(name)


def script(request: Request) -> Turn:
    """The upstream's side: the scenario named in the request, at the turn its history has reached."""
    body = request.body
    items = body.get("messages") or body.get("input") or []
    text = json.dumps(items)
    match = TAG.search(text)
    if not match:
        return Turn(text="no scenario")
    scenario = _find(match.group(1), scenarios())
    done = sum(1 for m in items if isinstance(m, dict) and (m.get("role") == "assistant" or
                                                            m.get("type") == "function_call"))
    if request.api == "responses":  # one function_call item per tool call; count turns by their call ids
        ids = {m.get("call_id") for m in items if isinstance(m, dict) and m.get("type") == "function_call"}
        done = sum(1 for s in scenario.steps if any(c.id in ids for c in s.turn.tool_calls))
    return scenario.steps[min(done, len(scenario.steps) - 1)].turn


def outcome(scenario: Scenario, session: str, task: str, attempt: int, reward: float | None,
            status: str | None = None) -> dict[str, Any]:
    """An `outcomes` row as a runner writes it: passed only at reward 1.0, no reward for infra errors."""
    now = datetime.now(timezone.utc)
    status = status or ("success" if reward == 1.0 else "failed")
    return {"session_id": session, "task_id": task, "attempt": attempt,
            "harness": "codex" if scenario.api == "responses" else "claude-code", "model": scenario.model,
            "status": status, "reward": reward, "passed": None if reward is None else reward == 1.0,
            "t_start": now, "t_end": now}


# --- the harness side ------------------------------------------------------------------------


def _tool_specs(names: list[str], api: str) -> list[dict[str, Any]]:
    schema = {"type": "object", "properties": {}, "additionalProperties": True}
    if api == "anthropic":
        return [{"name": n, "description": f"the {n} tool", "input_schema": schema} for n in names]
    if api == "responses":
        return [{"type": "function", "name": n, "description": f"the {n} tool", "parameters": schema} for n in names]
    return [{"type": "function", "function": {"name": n, "description": f"the {n} tool", "parameters": schema}}
            for n in names]


def play(scenario: Scenario, base_url: str) -> None:
    """Run `scenario` against a recorder session URL with the SDK its harness speaks."""
    {"anthropic": _play_anthropic, "responses": _play_responses, "chat": _play_chat}[scenario.api](scenario, base_url)


def _play_anthropic(s: Scenario, base_url: str, first: list[dict] | None = None) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-api03-scenarioscenario", max_retries=0,
                                 default_headers={"User-Agent": s.user_agent})
    content = [{"type": "text", "text": t} for t in (*s.preamble, s.prompt)]
    messages: list[dict] = [{"role": "user", "content": content}]
    for step in s.steps:
        headers = {"X-Scripted-Fault": step.fault} if step.fault else {}
        try:
            r = client.messages.create(model=s.model, max_tokens=1024, messages=messages, extra_headers=headers,
                                       system="You are a coding agent.", tools=_tool_specs(s.tools, "anthropic"))
        except anthropic.APIStatusError:
            if step.fault:
                return  # the session errors out here, as scripted
            raise
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
        uses = [b for b in r.content if b.type == "tool_use"]
        if not uses:
            return
        for u in uses:
            if u.id in s.subagents:
                _play_anthropic(s.subagents[u.id], base_url)
        results = []
        for u in uses:
            text, is_error = step.results[u.id]
            results.append({"type": "tool_result", "tool_use_id": u.id, "content": text,
                            **({"is_error": is_error} if is_error is not None else {})})
        messages.append({"role": "user", "content": results})


def _play_responses(s: Scenario, base_url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-proj-scenarioscenarioscenario", max_retries=0,
                           default_headers={"User-Agent": s.user_agent})
    items: list[dict] = [{"role": "user", "content": [{"type": "input_text", "text": t}
                                                      for t in (*s.preamble, s.prompt)]}]
    for step in s.steps:
        r = client.responses.create(model=s.model, input=items, instructions="You are Codex.",
                                    tools=_tool_specs(s.tools, "responses"), stream=False)
        out = [o.model_dump(exclude_none=True) for o in r.output]
        items += out
        calls = [o for o in out if o["type"] == "function_call"]
        if not calls:
            return
        items += [{"type": "function_call_output", "call_id": c["call_id"], "output": step.results[c["call_id"]][0]}
                  for c in calls]


def _play_chat(s: Scenario, base_url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-proj-scenarioscenarioscenario", max_retries=0,
                           default_headers={"User-Agent": s.user_agent})
    client.chat.completions.create(model=s.model, messages=[{"role": "user", "content": s.prompt}])
