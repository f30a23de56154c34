"""Gemini CLI (npm `@google/gemini-cli` 0.61.0, pinned in package.json).

Install: `npm ci` in the project root; runs on the pinned Node 24. Configure
(`recorder/launch.py` `gemini_env`): the Gemini API at
`GOOGLE_GEMINI_BASE_URL=<recorder>/s/<session>` (streamGenerateContent over
SSE), the key in `GEMINI_API_KEY` (sent as `x-goog-api-key`), and
`GEMINI_CLI_HOME` = the rollout's private home, whose `.gemini/settings.json`
selects API-key auth and turns off update checks, usage statistics
(Clearcut), telemetry and IDE discovery. Headless:
`gemini --yolo --output-format json -m MODEL -p PROMPT` (YOLO approves every
tool; the runner is the sandbox). The final answer is the `response` of the
JSON object on stdout; its own transcript is
`$GEMINI_CLI_HOME/.gemini/tmp/<folder>/chats/session-*.jsonl`.

Model: always `-m` (`default_model` when none is given): with none, Gemini
CLI routes each turn through a classifier call to a second model first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from forgerl.recorder.launch import gemini_env

from .base import Harness, RunContext, base_env, key_or_placeholder
from .mcp import gemini_settings, merged_into


@dataclass
class GeminiCli(Harness):
    name: str = "gemini-cli"
    cli: str = "gemini"
    api: str = "gemini"
    default_model: str = "gemini-2.5-pro"
    mcp_wiring: str = "mcpServers in $GEMINI_CLI_HOME/.gemini/settings.json ({command, args, env, trust: true})"
    resumes: str = "gemini --resume latest ... -p MESSAGE (the newest session of the workspace's project)"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        argv = [exe, "--yolo", "--output-format", "json", "-m", ctx.model or self.default_model, "-p", ctx.prompt]
        env = {**gemini_env(ctx.base_url, ctx.session, ctx.home), **base_env(ctx),
               "GEMINI_API_KEY": key_or_placeholder(ctx, "GEMINI_API_KEY", "forgerl-placeholder-key")}
        return argv, env

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [argv[0], "--resume", "latest", *argv[1:]], env

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        merged_into(Path(env["GEMINI_CLI_HOME"]) / ".gemini" / "settings.json", gemini_settings(ctx.mcp_servers))
        return argv, env

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        try:
            answer = json.loads(stdout[stdout.find("{"):]).get("response")
        except (json.JSONDecodeError, AttributeError):
            return None
        return answer if isinstance(answer, str) else None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((ctx.home / ".gemini" / "tmp").glob("*/chats/session-*.jsonl"))
