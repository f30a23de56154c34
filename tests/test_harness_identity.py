"""Harness identity (recorder/harness.py) from real requests, and one harness per session in the dataset.

The texts below are the harnesses' own: system prompts from their npm
packages (Claude Code 2.1.197 and Codex 0.171.0 as pinned in package.json;
OpenClaw 2026.9.6, pi-coding-agent 0.73.1, Qwen Code 0.15.10, Gemini CLI
0.61.0, OpenCode 1.18.33 from `npm pack`), tool sets from tests/tool_sets/
(recorded requests), User-Agents and headers as the harnesses send them.
"""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from forgerl.recorder.apis import codec_for
from forgerl.recorder.harness import identify
from forgerl.schema import store

from conftest import FORGE_RECORD, REPO, session_calls
from harness_checks import needs, run_recorded
from scripted_upstream import Turn

TOOL_SETS = REPO / "tests" / "tool_sets"
# OpenClaw's system prompt as `buildAgentSystemPrompt` (dist/system-prompt-params-*.mjs) starts it.
OPENCLAW_SYSTEM = ("You are a personal assistant running inside OpenClaw.\n\n## Tooling\n"
                   "Tools policy-filtered. Names case-sensitive; call exact.\n")
OPENAI_JS = {"user-agent": "OpenAI/JS 6.10.0", "x-stainless-lang": "js", "x-stainless-package-version": "6.10.0",
             "x-stainless-runtime": "node", "x-stainless-os": "Linux"}


def chat_request(system: str | None, tools: list[dict]) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "hi"}]
    return {"model": "m", "messages": messages, **({"tools": tools} if tools else {})}


def function_tools(*names: str) -> list[dict]:
    return [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]


def openclaw_tools() -> list[dict]:
    return json.loads((TOOL_SETS / "openclaw.json").read_text())


CASES = [
    # (id, headers, system prompt, tools: name, rank, evidence)
    ("openclaw-prompt", OPENAI_JS, OPENCLAW_SYSTEM, [], "openclaw", 3, "system-prompt:running inside OpenClaw"),
    ("openclaw-tools", OPENAI_JS, None, "openclaw", "openclaw", 3, "tools:exec,process"),
    ("pi", OPENAI_JS, "You are an expert coding assistant operating inside pi, a coding agent harness. You help users "
     "by reading files, executing commands, editing code, and writing new files.", function_tools(
         "read", "bash", "edit", "write"), "pi", 3, "system-prompt:operating inside pi, a coding agent harness"),
    ("pi-tools", OPENAI_JS, None, function_tools("read", "bash", "edit", "write"), "pi", 3, "tools:bash,edit,read,write"),
    ("qwen-code", {"user-agent": "QwenCode/0.15.10 (linux; x64)"}, "You are Qwen Code, an interactive CLI agent "
     "developed by Alibaba Group, specializing in software engineering tasks.", [], "qwen-code", 3,
     "system-prompt:You are Qwen Code, "),
    ("qwen-code-tools-not-gemini", OPENAI_JS, None, function_tools(
        "edit", "write_file", "read_file", "grep_search", "glob", "run_shell_command", "todo_write", "save_memory"),
     "qwen-code", 3, "tools:edit,read_file,run_shell_command,todo_write"),
    ("opencode-headers", {"user-agent": "ai-sdk/openai-compatible/1.0.0", "x-session-affinity": "ses_1",
                          "X-Session-Id": "ses_1"}, None, [], "opencode", 2, "header:x-session-affinity"),
    ("opencode-ua", {"user-agent": "opencode/1.18.33"}, None, [], "opencode", 2, "user-agent:opencode/"),
    ("codex-originator", {"user-agent": "codex_exec/0.171.0 (Ubuntu 24.4.0; x86_64) xterm",
                          "originator": "codex_exec"}, None, [], "codex", 2, "user-agent:codex"),
    ("gemini-cli", {"user-agent": "GeminiCLI/0.61.0/gemini-2.5-pro (linux; x64)"}, None, [], "gemini-cli", 2,
     "user-agent:geminicli/"),
    ("claude-code-header", {"x-app": "cli", "anthropic-beta": "claude-code-20250219"}, None, [], "claude-code", 2,
     "header:x-app=cli"),
    ("claude-code-probe", {"user-agent": "Bun/1.4.0"}, None, [], "bun", 1, "user-agent:bun/"),
    ("generic-python", {"user-agent": "OpenAI/Python 2.54.0"}, "You are a helpful assistant.",
     function_tools("get_weather", "read"), "openai-python", 1, "user-agent:openai/python"),
    ("nothing", {}, "You are a helpful assistant.", [], "unknown", 0, None),
]


@pytest.mark.parametrize("headers, system, tools, name, rank, evidence", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_identify(headers, system, tools, name, rank, evidence):
    tools = openclaw_tools() if tools == "openclaw" else tools
    exchange = codec_for("/v1/chat/completions").parse_request(chat_request(system, tools))
    hid = identify({k.lower(): v for k, v in headers.items()}, exchange)
    assert (hid.name, hid.rank, hid.evidence) == (name, rank, evidence)


def test_codex_instructions_and_claude_code_tools():
    """The Responses API carries the system prompt as `instructions`; Anthropic's tools are Claude Code's own."""
    codex = codec_for("/v1/responses").parse_request({
        "model": "m", "input": "hi", "instructions": "You are Codex, a coding agent based on GPT-5. You and the user "
        "share one workspace, and your job is to collaborate with them until their goal is genuinely handled."})
    assert identify({"user-agent": "codex_exec/0.171.0"}, codex).evidence == "system-prompt:You are Codex, "
    claude = codec_for("/v1/messages").parse_request({
        "model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
        "tools": json.loads((TOOL_SETS / "claude_code.json").read_text())})
    hid = identify({"user-agent": "claude-cli/2.1.197 (external, sdk-cli)"}, claude)
    assert (hid.name, hid.rank, hid.evidence) == ("claude-code", 3, "tools:Bash,Edit,Read,Write")


def sessions_of(root, session: str) -> list[dict]:
    return [r for r in store.read_table(root, "sessions").to_pylist() if r["session_id"] == session]


def test_openclaw_through_the_recorder_is_openclaw(scripted, recorder):
    """OpenClaw sends a generic `OpenAI/JS` User-Agent: its system prompt and tools name it."""
    up = scripted()
    rec = recorder(up.url)
    requests = {"oc": (OPENCLAW_SYSTEM, openclaw_tools()), "oc-tools": (None, openclaw_tools()), "sdk": (None, [])}
    for session, (system, tools) in requests.items():
        r = httpx.post(f"{rec.base(session)}/v1/chat/completions", headers=OPENAI_JS,
                       json=chat_request(system, tools), timeout=30)
        assert r.status_code == 200, r.text
    for session in requests:
        session_calls(rec.out, session, 1)
    found = {s: [(r["harness"], r["harness_rank"]) for r in sessions_of(rec.out, s)] for s in requests}
    assert found == {"oc": [("openclaw", 3)], "oc-tools": [("openclaw", 3)], "sdk": [("openai-js", 1)]}


@pytest.mark.slow
def test_claude_code_with_its_bun_probe_is_one_claude_code_session(scripted, tmp_path):
    """Claude Code's first request is a `HEAD /` from `Bun/…`; the session is still one `claude-code` row."""
    claude = needs("claude")
    up = scripted(lambda request: Turn(text="Done."))
    r = run_recorded(tmp_path, "cc", up.url, [str(claude), "-p", "Say done", "--output-format", "json"],
                     {"ANTHROPIC_API_KEY": "sk-ant-api03-identitytestidentitytest", "IS_SANDBOX": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    data = tmp_path / "data"
    calls = session_calls(data, "cc", 2)
    probe = json.loads(calls[0]["request_headers"])
    assert calls[0]["method"] == "HEAD" and probe["user-agent"].startswith("Bun/"), calls[0]
    rows = sessions_of(data, "cc")
    assert [(s["harness"], s["harness_rank"]) for s in rows] == [("claude-code", 3)], rows
    assert rows[0]["harness_evidence"].startswith("system-prompt:")
    listed = json.loads(subprocess.run([FORGE_RECORD, "ls", str(data), "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    assert [(s["session_id"], s["harness"]) for s in listed] == [("cc", "claude-code")]
    assert "session cc (claude-code)" in r.stderr
