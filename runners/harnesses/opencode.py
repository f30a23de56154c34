"""OpenCode (npm `opencode-ai` 1.18.33, pinned in package.json; a platform binary built with Bun).

Configure: `forgerl.recorder.launch.opencode_env`: the provider comes in
`OPENCODE_CONFIG_CONTENT` (`@ai-sdk/openai-compatible`, Chat Completions at
`<recorder>/s/<session>/v1`, key from `OPENAI_API_KEY`, every permission
granted), its phone-home off (models.dev catalogue, update check, LSP
downloads, sharing, the background npm install of its plugin package).
Headless: `opencode run --format json PROMPT` (one JSON event per line); the
final answer is the text of the last assistant message's `text` events. Its
own transcript is its SQLite database under the private HOME
(`~/.local/share/opencode/opencode.db`): each message with its parts, one JSON
line per message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from forgerl.recorder.launch import opencode_env

from .base import Harness, RunContext, openai_env
from .mcp import opencode_config
from .sqlite_transcript import sqlite_transcript

MESSAGES = ("SELECT json_set(m.data, '$.id', m.id, '$.parts', json_group_array(json(p.data))) FROM message m "
            "JOIN part p ON p.message_id = m.id GROUP BY m.id ORDER BY m.time_created, m.id")


@dataclass
class OpenCode(Harness):
    name: str = "opencode"
    cli: str = "opencode"
    api: str = "chat"
    default_model: str = "gpt-5.4"
    mcp_wiring: str = "mcp in OPENCODE_CONFIG_CONTENT ({NAME: {type: local, command: [...], environment}})"
    resumes: str = "opencode run --continue ... MESSAGE (the last session in the private HOME's database)"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        model = ctx.model or self.default_model
        env = {**opencode_env(ctx.base_url, ctx.session, model, ctx.home / ".config", ctx.workspace), **openai_env(ctx)}
        return [exe, "run", "--format", "json", "--title", ctx.session, ctx.prompt], env

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [*argv[:2], "--continue", *argv[2:]], env  # after `opencode run`

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        config = {**json.loads(env["OPENCODE_CONFIG_CONTENT"]), **opencode_config(ctx.mcp_servers)}
        return argv, {**env, "OPENCODE_CONFIG_CONTENT": json.dumps(config)}

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        texts: dict[str, list[str]] = {}
        for line in stdout.splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            part = event.get("part") if isinstance(event, dict) and event.get("type") == "text" else None
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.setdefault(part.get("messageID", ""), []).append(part["text"])
        if not texts:
            return None
        return "".join(list(texts.values())[-1]).strip() or None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((ctx.home / ".local" / "share" / "opencode").glob("opencode*.db"))

    def own_transcript(self, ctx: RunContext) -> str | None:
        return sqlite_transcript(self.transcript_files(ctx), MESSAGES)
