"""Qwen Code (npm `@qwen-code/qwen-code`, pinned in package.json; a Gemini CLI fork).

Install: `npm ci` in the project root; runs on the pinned Node 24. Configure:
its OpenAI auth (`--auth-type openai`, `OPENAI_BASE_URL=<recorder>/s/<session>/v1`,
`OPENAI_API_KEY`), Chat Completions; usage statistics off
(`QWEN_USAGE_STATISTICS_ENABLED=false`), all from `recorder/launch.py`.
Headless: `qwen --yolo --output-format json [-m MODEL] PROMPT` (one-shot;
YOLO approves every tool, the runner is the sandbox). The final answer is the
`result` of the last `{"type": "result"}` item of the JSON array on stdout;
its own transcript is `~/.qwen/projects/<cwd>/chats/<session>.jsonl`. Its
managed memory is off (`memory.enableManagedAutoMemory` and
`enableManagedAutoDream` false in `~/.qwen/settings.json`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from forgerl.recorder.launch import qwen_code

from .base import Harness, RunContext, openai_env
from .mcp import gemini_settings, merged_into

MEMORY_OFF = {"enableManagedAutoMemory": False, "enableManagedAutoDream": False}


@dataclass
class QwenCode(Harness):
    name: str = "qwen-code"
    cli: str = "qwen"
    api: str = "chat"
    mcp_wiring: str = ("mcpServers in ~/.qwen/settings.json ({command, args, env, trust: true}), "
                       "tools.toolSearch.enabled=false")
    resumes: str = "qwen --continue ... MESSAGE (the newest session of the workspace's project)"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        model = ["-m", ctx.model] if ctx.model else []
        # Its managed memory off: after every run its extraction subagent makes one more model call (another
        # system prompt, the conversation plus its own instructions), which would be the session's last call, the
        # one graded; and a private HOME keeps no memory to extract or consolidate ("dream") anyway.
        merged_into(ctx.home / ".qwen" / "settings.json", {"memory": MEMORY_OFF})
        aimed = qwen_code([exe, "--yolo", "--output-format", "json", *model, ctx.prompt], ctx.base_url, ctx.session,
                          ctx.home)
        return aimed.argv, {**aimed.env, **openai_env(ctx), "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [argv[0], "--continue", *argv[1:]], env

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        # Tool search off: Qwen Code 0.24 otherwise defers MCP tools behind its tool_search bridge, and the
        # model is never offered them upfront.
        merged_into(ctx.home / ".qwen" / "settings.json",
                    {**gemini_settings(ctx.mcp_servers), "tools": {"toolSearch": {"enabled": False}}})
        return argv, env

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        try:
            items = json.loads(stdout[stdout.find("["):])
        except json.JSONDecodeError:
            return None
        results = [i.get("result") for i in items if isinstance(i, dict) and i.get("type") == "result"]
        return results[-1] if results and isinstance(results[-1], str) else None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((ctx.home / ".qwen" / "projects").glob("*/chats/*.jsonl"))
