"""Hand-labelled behaviour sessions of every supported harness, recorded through `forge-record serve` with the real
CLIs (their runner adapters) against a scripted model.

Every harness gets the same job, done with its own tools: make a plan (where it
has a plan tool), read notes.txt before it exists (a failing shell call), write
it, read it back with a shell `cat` (a check after the last write, and the
success that recovers the failed read: the same intent), mark the plan done,
answer. `LABELS` says by hand what each of those tool calls is; the tests in
tests/test_analysis_behaviour.py assert that the views say the same.

The recordings are stored, compacted, in tests/fixtures/behaviour (one dataset,
one session per harness, named after it). Re-record them with
`.venv/bin/python tests/behaviour_fixtures.py tests/fixtures/behaviour`
(needs `make harnesses` and .venv-mini; a few minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import REPO, RecorderProcess, session_calls  # noqa: E402
from harness_checks import ProxyTrap  # noqa: E402
from scripted_upstream import Request, ScriptedUpstream, ToolCall, Turn  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "behaviour"
WORK = Path("/tmp/forgerl-behaviour")  # a fixed workspace, so the paths in the stored sessions are stable
PROMPT = "Create notes.txt holding the word hello, then check it."
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
PATCH = "*** Begin Patch\n*** Add File: notes.txt\n+hello\n*** End Patch\n"

# What each labelled call is: a plan update, a failed call, a write, the check after the last write that also
# recovers the failed call, the final submission (mini-swe-agent's answer is a command).
PLAN, FAILS, WRITE, CHECK, SUBMITS = "plan", "fails", "write", "check+recovers", "submit"


@dataclass
class Job:
    """A harness's scripted calls with their hand labels, and the tool its main conversation always offers."""

    harness: str
    main_tool: str
    acts: list[tuple[ToolCall, str]]
    plan: tuple[int, int] = (0, 0)  # plan items, completed (by hand)
    env: dict[str, str] = field(default_factory=dict)


def _notes(harness: str) -> str:
    return str(WORK / harness / "work" / "notes.txt")


def jobs() -> list[Job]:
    cat = "cat notes.txt"
    return [
        Job("claude-code", "Bash", [
            (ToolCall("TaskCreate", {"subject": "Write notes.txt", "description": "hello"}), PLAN),
            (ToolCall("Bash", {"command": cat, "description": "Read notes"}), FAILS),
            (ToolCall("Write", {"file_path": _notes("claude-code"), "content": "hello\n"}), WRITE),
            (ToolCall("Bash", {"command": cat, "description": "Check notes"}), CHECK),
            (ToolCall("TaskUpdate", {"taskId": "1", "status": "completed"}), PLAN),
        ], plan=(1, 1), env={"IS_SANDBOX": "1"}),
        Job("codex", "exec_command", [
            (ToolCall("create_goal", {"objective": "notes.txt holds hello"}), PLAN),
            (ToolCall("exec_command", {"cmd": cat}), FAILS),
            (ToolCall("exec_command", {"cmd": f"apply_patch <<'EOF'\n{PATCH}EOF"}), WRITE),
            (ToolCall("exec_command", {"cmd": cat}), CHECK),
            (ToolCall("update_goal", {"status": "complete"}), PLAN),
        ], plan=(1, 1)),
        Job("openclaw", "exec", [  # goals are deferred tools: called through tool_call
            (ToolCall("tool_call", {"id": "create_goal", "args": {"objective": "notes.txt holds hello"}}), PLAN),
            (ToolCall("exec", {"command": cat}), FAILS),
            (ToolCall("write", {"path": _notes("openclaw"), "content": "hello\n"}), WRITE),
            (ToolCall("exec", {"command": cat}), CHECK),
            (ToolCall("tool_call", {"id": "update_goal", "args": {"status": "complete"}}), PLAN),
        ], plan=(1, 1)),
        Job("opencode", "bash", [
            (ToolCall("todowrite", {"todos": [{"content": "write notes.txt", "status": "in_progress",
                                               "priority": "high"}]}), PLAN),
            (ToolCall("bash", {"command": cat}), FAILS),
            (ToolCall("apply_patch", {"patchText": PATCH}), WRITE),
            (ToolCall("bash", {"command": cat}), CHECK),
            (ToolCall("todowrite", {"todos": [{"content": "write notes.txt", "status": "completed",
                                               "priority": "high"}]}), PLAN),
        ], plan=(1, 1)),
        Job("gemini-cli", "run_shell_command", [
            (ToolCall("write_todos", {"todos": [{"description": "write notes.txt", "status": "in_progress"},
                                                {"description": "check it", "status": "pending"}]}), PLAN),
            (ToolCall("run_shell_command", {"command": cat}), FAILS),
            (ToolCall("write_file", {"file_path": _notes("gemini-cli"), "content": "hello\n"}), WRITE),
            (ToolCall("run_shell_command", {"command": cat}), CHECK),
            (ToolCall("write_todos", {"todos": [{"description": "write notes.txt", "status": "completed"},
                                                {"description": "check it", "status": "completed"}]}), PLAN),
        ], plan=(2, 2)),
        Job("qwen-code", "run_shell_command", [
            (ToolCall("run_shell_command", {"command": cat}), FAILS),
            (ToolCall("write_file", {"file_path": _notes("qwen-code"), "content": "hello\n"}), WRITE),
            (ToolCall("run_shell_command", {"command": cat}), CHECK),
        ]),
        Job("pi", "bash", [
            (ToolCall("bash", {"command": cat}), FAILS),
            (ToolCall("write", {"path": "notes.txt", "content": "hello\n"}), WRITE),
            (ToolCall("bash", {"command": cat}), CHECK),
        ]),
        Job("mini-swe-agent", "bash", [
            (ToolCall("bash", {"command": cat}), FAILS),
            (ToolCall("bash", {"command": "echo hello > notes.txt"}), WRITE),
            (ToolCall("bash", {"command": cat}), CHECK),
            (ToolCall("bash", {"command": SUBMIT}), SUBMITS),
        ]),
    ]


def _tool_names(body: dict) -> set[str]:
    """Tool names a request offers, in any of the four APIs' layouts."""
    names = set()
    for t in body.get("tools") or []:
        names.add((t.get("function") or t).get("name"))
        names.update(f.get("name") for f in t.get("functionDeclarations") or [])
    return names


def _results(body: dict) -> int:
    """Tool calls the conversation holds results for (Anthropic, Responses, Chat Completions, Gemini layouts).
    By call id: Codex adds an output of its own (no call id) after a goal tool's."""
    items = body.get("messages") or body.get("input") or body.get("contents") or []
    ids: set[str] = set()
    gemini = 0
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output":
            ids.add(item.get("call_id"))
        elif item.get("role") == "tool":
            ids.add(item.get("tool_call_id"))
        gemini += sum("functionResponse" in p for p in item.get("parts") or [] if isinstance(p, dict))
        content = item.get("content")
        ids.update(b.get("tool_use_id") for b in content if isinstance(b, dict) and b.get("type") == "tool_result"
                   ) if isinstance(content, list) else None
    return len(ids - {None}) + gemini


def script_for(job: Job):
    def script(request: Request) -> Turn:
        if job.main_tool not in _tool_names(request.body):
            return Turn(text="ok")  # the harness's side calls (titles, summaries, probes)
        done = _results(request.body)
        if done < len(job.acts):
            return Turn(text=f"Step {done + 1}.", tool_calls=[job.acts[done][0]])
        return Turn(text="notes.txt holds hello.")
    return script


def record(out: Path, only: list[str] | None = None) -> None:
    """Run every job's harness through its runner adapter against a recorder, then compact into `out`."""
    from forgerl.harnesses import RunContext, get_harness, node_path
    from forgerl.schema.maintenance import compact

    data = WORK / "data"
    shutil.rmtree(data, ignore_errors=True)
    keys = {"OPENAI_API_KEY": "sk-proj-behaviourbehaviourbehaviour", "GEMINI_API_KEY": "behaviour-placeholder",
            "ANTHROPIC_API_KEY": "sk-ant-api03-behaviourbehaviour"}
    for job in jobs():
        if only and job.harness not in only:
            continue
        base = WORK / job.harness
        shutil.rmtree(base, ignore_errors=True)
        (base / "work").mkdir(parents=True)
        (base / "home").mkdir()
        with ScriptedUpstream(script_for(job)) as up:
            rec = RecorderProcess(data, up.url).start()
            try:
                adapter = get_harness(job.harness)
                ctx = RunContext(PROMPT, base / "work", base / "home", rec.url, job.harness, "", keys)
                argv, env = adapter.command(adapter.find(), ctx)
                with ProxyTrap() as trap:
                    r = subprocess.run(argv, cwd=base / "work", capture_output=True, text=True, timeout=300,
                                       env={"LANG": "C.UTF-8", "PATH": f"{node_path()}:{os.environ['PATH']}",
                                            **env, **job.env, **trap.env()}, stdin=subprocess.DEVNULL)
                try:
                    session_calls(data, job.harness, len(job.acts) + (job.acts[-1][1] != SUBMITS))
                except AssertionError as e:  # reported below; the labels test says what differs
                    print(e, file=sys.stderr)
            finally:
                rec.stop()
        print(f"{job.harness}: exit {r.returncode}, notes.txt {(base / 'work' / 'notes.txt').exists()}, "
              f"trap {trap.hits}", file=sys.stderr)
        if r.returncode != 0:
            print(r.stdout[-1500:], r.stderr[-1500:], file=sys.stderr)
    compact(data)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(data, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", help="record only these harnesses (a scratch run)")
    args = parser.parse_args(argv)
    record(args.out, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
