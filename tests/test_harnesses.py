"""Real harness CLIs from npm (package-lock.json) recorded through `forge-record run`.

The scripted upstream plays the model: on the first call it asks the harness
to run a shell command that writes `proof.txt`; once it sees the tool result
it answers "Done.". We assert the harness really ran the tool, and that the
dataset holds the calls, the tool call and its result.
"""

from __future__ import annotations

import json

import pytest

from conftest import session_calls
from harness_checks import needs, run_recorded, tool_exchange
from scripted_upstream import Request, ToolCall, Turn, saw_tool_result

pytestmark = pytest.mark.slow


def claude_script(request: Request) -> Turn:
    tools = {t.get("name") for t in request.body.get("tools", [])}
    if "Bash" in tools and not saw_tool_result(request):
        return Turn(text="I'll write the file.", tool_calls=[
            ToolCall("Bash", {"command": "echo forgerl > proof.txt", "description": "Write proof file"})])
    return Turn(text="Done.")


def test_claude_code(scripted, tmp_path):
    claude = needs("claude")
    up = scripted(claude_script)
    r = run_recorded(tmp_path, "cc", up.url,
                     [str(claude), "-p", "Write proof.txt", "--output-format", "json",
                      "--dangerously-skip-permissions"],
                     {"ANTHROPIC_API_KEY": "sk-ant-api03-harnesstestharnesstest", "IS_SANDBOX": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["result"] == "Done."
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    calls = [c for c in session_calls(tmp_path / "data", "cc", 2) if c["api"] == "anthropic"]
    assert len(calls) == 2 and all(c["complete"] and c["error"] is None and c["streamed"] for c in calls)
    assert calls[0]["path"].startswith("/v1/messages")
    made, result = tool_exchange(tmp_path / "data", "cc", calls, "Bash")
    assert json.loads(made["arguments"])["command"] == "echo forgerl > proof.txt"
    assert result.get("is_error") in (None, False)
    tools = {t["name"] for t in json.loads(calls[0]["tools"])}
    assert {"Bash", "Read", "Edit", "Write"} <= tools
    assert "session cc (claude-code)" in r.stderr and "Bash x1" in r.stderr
    assert "sk-ant-api03-harnesstest" not in calls[0]["request_headers"]


def codex_script(request: Request) -> Turn:
    if not saw_tool_result(request):
        return Turn(tool_calls=[ToolCall("exec_command", {"cmd": "echo forgerl > proof.txt"})])
    return Turn(text="Done.")


def test_codex(scripted, tmp_path):
    codex = needs("codex")
    up = scripted(codex_script)
    codex_home = tmp_path / "home" / ".codex"
    r = run_recorded(tmp_path, "cx", up.url,
                     [str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                      "Write proof.txt"],
                     {"OPENAI_API_KEY": "sk-proj-harnesstestharnesstestharness", "CODEX_HOME": str(codex_home)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Done." in r.stdout
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    calls = [c for c in session_calls(tmp_path / "data", "cx", 2) if c["api"] == "responses"]
    assert len(calls) == 2 and all(c["complete"] and c["error"] is None and c["streamed"] for c in calls)
    assert all(c["path"] == "/v1/responses" for c in calls)
    made, result = tool_exchange(tmp_path / "data", "cx", calls, "exec_command")
    assert json.loads(made["arguments"]) == {"cmd": "echo forgerl > proof.txt"}
    assert "Process exited with code 0" in result["text"]
    assert "session cx (codex)" in r.stderr and "exec_command x1" in r.stderr
    assert "sk-proj-harnesstest" not in calls[0]["request_headers"]
