"""Claude Code (`@anthropic-ai/claude-code`, pinned in package.json).

Install: `npm ci` in the project root (npm 11 skips its postinstall: run
`node node_modules/@anthropic-ai/claude-code/install.cjs` once). Configure:
`ANTHROPIC_BASE_URL=<recorder>/s/<session>` (no /v1), a key in
`ANTHROPIC_API_KEY`, non-essential traffic off. Headless:
`claude -p PROMPT --output-format json --dangerously-skip-permissions`
(as root this needs `IS_SANDBOX=1`). The final answer is the JSON `result`;
its own transcript is `~/.claude/projects/*/*.jsonl`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from forgerl.recorder.launch import harness_env

from .base import Harness, RunContext, base_env, key_or_placeholder, last_json_line_field, write_config
from .mcp import STARTUP_TIMEOUT_S, claude_code_config


@dataclass
class ClaudeCode(Harness):
    name: str = "claude-code"
    cli: str = "claude"
    api: str = "anthropic"
    mcp_wiring: str = ("--strict-mcp-config --mcp-config FILE ({mcpServers: {NAME: {type: stdio, command, args, env}}}), "
                       "MCP_CONNECTION_NONBLOCKING=0, MCP_CONNECT_TIMEOUT_MS")
    resumes: str = "claude -p MESSAGE --continue (the private HOME's one conversation in the workspace)"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        argv = [exe, "-p", ctx.prompt, "--output-format", "json", "--dangerously-skip-permissions"]
        if ctx.model:
            argv += ["--model", ctx.model]
        env = {**harness_env(ctx.base_url, ctx.session), **base_env(ctx), "IS_SANDBOX": "1",
               "ANTHROPIC_API_KEY": key_or_placeholder(ctx, "ANTHROPIC_API_KEY", "sk-ant-forgerl-placeholder"),
               "DISABLE_AUTOUPDATER": "1"}
        return argv, env

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [*argv, "--continue"], env

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        write_config(ctx, "mcp.json", json.dumps(claude_code_config(ctx.mcp_servers), indent=2))
        # Connected before the first model call (by default -p mode connects in the background, so the first
        # call may go out without the servers' tools), with a start-up timeout a Python server can meet.
        blocking = {"MCP_CONNECTION_NONBLOCKING": "0", "MCP_CONNECT_TIMEOUT_MS": str(STARTUP_TIMEOUT_S * 1000),
                    "MCP_TIMEOUT": str(STARTUP_TIMEOUT_S * 1000)}
        return [*argv, "--strict-mcp-config", "--mcp-config", str(ctx.home / "mcp.json")], {**env, **blocking}

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        return last_json_line_field(stdout, "result")

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((ctx.home / ".claude" / "projects").glob("*/*.jsonl"))
