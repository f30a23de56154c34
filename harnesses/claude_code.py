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

from .launch import harness_env
from .locate import Tool
from .mcp import STARTUP_TIMEOUT_S, claude_code_config
from .spec import (Fingerprints, Harness, Key, NotApplicable, Pin, PlanTools, RunContext, Runtime,
                   Table, last_json_line_field, write_config)


@dataclass
class ClaudeCode(Harness):
    name: str = "claude-code"
    cli: Tool = Tool("claude", "claude", "node_modules/.bin/claude")
    runtime: Runtime = Runtime("node", (18, 0, 0))
    pin: Pin = Pin("npm", "@anthropic-ai/claude-code", "2.1.197", "package.json")
    api: str = "anthropic"
    default_model: NotApplicable = NotApplicable("its own default model")
    key: Key = Key("ANTHROPIC_API_KEY", "x-api-key", "sk-ant-forgerl-placeholder")
    fingerprints: Fingerprints = Fingerprints(
        user_agents=("claude-cli", "claude-code"),
        headers=(("x-app", "cli"), ("anthropic-beta", "claude-code-"), ("x-claude-code-session-id", "")),
        prompts=("x-anthropic-billing-header: cc_version=", "Anthropic's official CLI for Claude",
                 "You are a Claude agent, built on Anthropic's Claude Agent SDK"),
        tools=(frozenset({"Bash", "Read", "Edit", "Write"}),))
    commands: tuple[str, ...] = ("claude",)
    offline: Table = Table({"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"})
    headless: str = "`claude -p … --output-format json --dangerously-skip-permissions` (`IS_SANDBOX=1`)"
    mcp_wiring: str = ("--strict-mcp-config --mcp-config FILE ({mcpServers: {NAME: {type: stdio, command, args, "
                       "env}}}), MCP_CONNECTION_NONBLOCKING=0, MCP_CONNECT_TIMEOUT_MS")
    resumes: str = "claude -p MESSAGE --continue (the private HOME's one conversation in the workspace)"
    transcript: str = "`~/.claude/projects/*/*.jsonl`"
    final_answer_from: str = "JSON `result`"
    tool_kinds: Table = Table({  # Claude Code 2.1 (sdk-tools.d.ts)
        "Bash": "shell", "BashOutput": "shell", "KillShell": "shell", "KillBash": "shell",
        "Read": "read", "LS": "read", "NotebookRead": "read",
        "Edit": "write", "MultiEdit": "write", "Write": "write", "NotebookEdit": "write",
        "Glob": "search", "Grep": "search", "WebFetch": "web", "WebSearch": "web",
        "TodoWrite": "plan", "TaskCreate": "plan", "TaskUpdate": "plan", "TaskList": "plan", "TaskGet": "plan",
        "ExitPlanMode": "plan"})
    plan_tools: PlanTools = PlanTools(snapshots=Table({"TodoWrite": "$.todos"}), create=("TaskCreate",),
                                      update=Table({"TaskUpdate": "$.taskId"}))
    subagent_tools: frozenset[str] = frozenset({"Agent", "Task"})  # Agent, formerly Task

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        argv = [exe, "-p", ctx.prompt, "--output-format", "json", "--dangerously-skip-permissions"]
        if ctx.model:
            argv += ["--model", ctx.model]
        # A rollout's system prompt leaves out the `x-anthropic-billing-header` line: it carries a hash of each
        # prompt (cc_version=2.1.197.<3 hex>), billing metadata for Anthropic's API that no policy can know and that
        # breaks every shared prefix after its first 22 tokens (vLLM's prefix cache, shared-prefix SFT).
        env = {**harness_env(ctx.base_url, ctx.session), **self.base_env(ctx), **self.offline_env(), "IS_SANDBOX": "1",
               "CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}
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


HARNESS = ClaudeCode()
