"""Behaviour metrics on sessions of the real harness CLIs (Claude Code, Codex), recorded by `forge-record run`.

The scripted model makes each harness fail a read of a missing file, write
the file, and read it back: one failure episode recovered, and a write
verified by re-reading it. Harnesses add calls of their own (titles, probes),
so turn numbers are not asserted; what the metrics say about the plan is.
"""

from __future__ import annotations

import json

import pytest

from forgerl.analysis import connect

from harness_checks import needs, run_recorded
from scripted_upstream import Request, ToolCall, Turn

pytestmark = pytest.mark.slow


def _results(request: Request) -> int:
    """How many tool results the request carries (Anthropic tool_result blocks, Responses call outputs)."""
    text = json.dumps(request.body.get("messages") or request.body.get("input") or [])
    return text.count('"type": "tool_result"') + text.count('"type": "function_call_output"')


def plan(read: ToolCall, write: ToolCall, check: ToolCall, tool: str | None):
    steps = [Turn(text="Let me look.", tool_calls=[read]), Turn(text="Creating it.", tool_calls=[write]),
             Turn(text="Checking.", tool_calls=[check]), Turn(text="Done.")]

    def script(request: Request) -> Turn:
        if tool and tool not in {t.get("name") for t in request.body.get("tools") or []}:
            return Turn(text="ok")  # the harness's side calls (titles, probes)
        return steps[min(_results(request), len(steps) - 1)]

    return script


def metrics(root, session: str) -> dict:
    con = connect(root)
    cur = con.execute("SELECT * FROM session_metrics WHERE session_id = ?", [session])
    return dict(zip([d[0] for d in cur.description], cur.fetchone()))


def test_claude_code_session_metrics(scripted, tmp_path):
    claude = needs("claude")
    work = tmp_path / "work"
    up = scripted(plan(ToolCall("Bash", {"command": "cat notes.txt", "description": "Read notes"}),
                       ToolCall("Write", {"file_path": str(work / "notes.txt"), "content": "hello\n"}),
                       ToolCall("Bash", {"command": "cat notes.txt", "description": "Check notes"}), "Bash"))
    r = run_recorded(tmp_path, "cc", up.url, [str(claude), "-p", "Create notes.txt", "--output-format", "json",
                                              "--dangerously-skip-permissions"],
                     {"ANTHROPIC_API_KEY": "sk-ant-api03-analysisanalysis", "IS_SANDBOX": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert (work / "notes.txt").read_text() == "hello\n"
    m = metrics(tmp_path / "data", "cc")
    assert m["harness"] == "claude-code"
    assert (m["tool_calls"], m["writes"], m["verified"], m["check_kind"]) == (3, 1, True, "reread")
    assert (m["failed_results"], m["failure_episodes"], m["recovered_episodes"]) == (1, 1, 1)
    assert m["tools_offered"] >= 10 and m["tools_used"] == 2
    assert m["tool_coverage"] == pytest.approx(2 / m["tools_offered"])
    assert m["human_turns"] >= 1 and m["errored"] is False


def test_codex_session_metrics(scripted, tmp_path):
    codex = needs("codex")
    patch = "*** Begin Patch\n*** Add File: notes.txt\n+hello\n*** End Patch\n"
    up = scripted(plan(ToolCall("exec_command", {"cmd": "cat notes.txt"}),
                       ToolCall("exec_command", {"cmd": f"apply_patch <<'EOF'\n{patch}EOF"}),
                       ToolCall("exec_command", {"cmd": "cat notes.txt"}), None))
    r = run_recorded(tmp_path, "cx", up.url,
                     [str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                      "Create notes.txt"],
                     {"OPENAI_API_KEY": "sk-proj-analysisanalysisanalysis", "CODEX_HOME": str(tmp_path / "home" / ".codex")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "work" / "notes.txt").read_text() == "hello\n"
    m = metrics(tmp_path / "data", "cx")
    assert m["harness"] == "codex"
    assert (m["tool_calls"], m["writes"], m["verified"], m["check_kind"]) == (3, 1, True, "reread")
    assert (m["failed_results"], m["failure_episodes"], m["recovered_episodes"]) == (1, 1, 1)
    assert m["human_turns"] >= 1 and m["harness_turns"] >= 1  # the <environment_context> preamble
    # Codex 0.171 offers 12 tools in 3 namespaces (`additional_tools`); the script calls exec_command, not among them
    assert (m["tools_offered"], m["tool_coverage"]) == (12, 0.0)
