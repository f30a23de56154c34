"""Claude Code (subagent + compaction) and Codex sessions recorded through `forge-record run` with the real CLIs.

The scripted upstream plays the model. Claude Code: the main agent calls the
`Agent` tool, the subagent (its own interleaved conversation) answers, the
main agent finishes; a second `claude -p /compact --continue` asks for a
summary, which the script writes; a third `--continue` run starts from that
summary. Codex: one exec_command tool loop.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from forgerl.harnesses import harness_env

from harness_checks import forge_record_run, serve_script
from scripted_upstream import Request, ToolCall, Turn, saw_tool_result

SUB_PROMPT = "Count the files in the current directory and report the number."
SUMMARY = "Summary of the conversation so far: the subagent counted the files and reported 42 of them."
CLAUDE_RUNS = (["-p", "How many files are here? Use a subagent."], ["-p", "/compact", "--continue"],
               ["-p", "Remind me of the count.", "--continue"])
CLAUDE_FLAGS = ["--output-format", "json", "--dangerously-skip-permissions"]
_DELEGATE = json.dumps({"name": "Agent", "arguments": {"description": "Count files", "prompt": SUB_PROMPT,
                                                       "subagent_type": "general-purpose"}})
# what the policy writes in the served runs: delegate, the subagent's answer, the answer, the summary, the last
SERVED_CLAUDE_TURNS = [f"I will delegate.\n<tool_call>\n{_DELEGATE}\n</tool_call>", "The directory holds 42 files.",
                       "Done: there are 42 files.", SUMMARY, "There are 42 files."]


def _user_texts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [c.get("text", "") for c in content or [] if isinstance(c, dict) and c.get("type") == "text"]


def claude_script(request: Request) -> Turn:
    users = [m for m in request.body.get("messages") or [] if m.get("role") == "user"]
    texts = [t for m in users for t in _user_texts(m)]
    last = " ".join(_user_texts(users[-1])) if users else ""
    tools = {t.get("name") for t in request.body.get("tools") or []}
    if "TEXT ONLY" in last and "summary" in last.lower():  # Claude Code's compaction request
        return Turn(text=SUMMARY)
    if any(SUB_PROMPT in t for t in texts):
        return Turn(text="The directory holds 42 files.")
    if "Agent" in tools and not saw_tool_result(request) and not any(SUMMARY[:40] in t for t in texts):
        return Turn(text="I will delegate.", tool_calls=[ToolCall("Agent", {
            "description": "Count files", "prompt": SUB_PROMPT, "subagent_type": "general-purpose"})])
    return Turn(text="Done: there are 42 files.")


def codex_script(request: Request) -> Turn:
    if not saw_tool_result(request):
        return Turn(tool_calls=[ToolCall("exec_command", {"cmd": "echo forgerl > proof.txt"})])
    return Turn(text="Done.")


def record_claude(claude: Path, base: Path, upstream: str) -> list[subprocess.CompletedProcess]:
    work, home = base / "work", base / "home"
    work.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    env = {"ANTHROPIC_API_KEY": "sk-ant-api03-converttestconverttest", "IS_SANDBOX": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    runs = []
    for args in CLAUDE_RUNS:
        runs.append(forge_record_run([str(claude), *args, *CLAUDE_FLAGS], out=base / "data", session="cc",
                                     upstream=upstream, work=work, home=home, env=env, timeout=240))
    return runs


def record_served_claude(claude: Path, base: Path) -> Path:
    """The same three Claude Code runs answered by `forge-record serve --policy script:` (the policy's token
    ids and logprobs recorded, session `cc`): a served rollout with a subagent and a compaction. Returns the
    dataset folder."""
    work, home = base / "work", base / "home"
    work.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    served = serve_script(base, SERVED_CLAUDE_TURNS)
    env = {**os.environ, "HOME": str(home), **harness_env(served.url, "cc"),
           "ANTHROPIC_API_KEY": "sk-ant-api03-servedservedserved", "IS_SANDBOX": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    try:
        for args in CLAUDE_RUNS:
            r = subprocess.run([str(claude), *args, *CLAUDE_FLAGS], cwd=work, env=env, capture_output=True,
                               text=True, timeout=240, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, r.stdout + r.stderr
    finally:
        served.stop()
    return base / "data"


def record_codex(codex: Path, base: Path, upstream: str) -> subprocess.CompletedProcess:
    work, home = base / "cwork", base / "chome"
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env: dict[str, Any] = {"OPENAI_API_KEY": "sk-proj-converttestconverttestconvert",
                           "CODEX_HOME": str(home / ".codex")}
    return forge_record_run([str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                             "Write proof.txt"], out=base / "data", session="cx", upstream=upstream, work=work,
                            home=home, env=env, timeout=240)
