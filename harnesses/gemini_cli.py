"""Gemini CLI (npm `@google/gemini-cli` 0.61.0, pinned in package.json).

Install: `npm ci` in the project root; runs on the pinned Node 24. Configure
(`gemini_env`): the Gemini API at `GOOGLE_GEMINI_BASE_URL=<recorder>/s/<session>`
(streamGenerateContent over SSE), the key in `GEMINI_API_KEY` (sent as
`x-goog-api-key`), and `GEMINI_CLI_HOME` = the rollout's private home, whose
`.gemini/settings.json` selects API-key auth and turns off update checks,
usage statistics (Clearcut), telemetry and IDE discovery. Headless:
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

from .launch import Launch, harness_env, session_root, write_json
from .locate import Tool
from .mcp import gemini_mcp, merged_into
from .spec import Fingerprints, Harness, Key, NotApplicable, Pin, PlanTools, RunContext, Runtime, Table

GEMINI_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "ide": {"enabled": False},
}
"""Gemini CLI's settings for a recorded run: the API-key auth (with only `GOOGLE_GEMINI_BASE_URL` set, 0.61 picks
its "gateway" auth, which headless mode then refuses), and its phone-home off: update checks (npm registry),
usage statistics (Clearcut, play.googleapis.com), OpenTelemetry export, IDE companion discovery."""


def gemini_env(base_url: str, session: str, home: Path) -> dict[str, str]:
    """Gemini CLI 0.61: the Gemini API at `GOOGLE_GEMINI_BASE_URL`, key in `GEMINI_API_KEY` (sent as
    `x-goog-api-key`), and `GEMINI_CLI_HOME` = `home`, whose `.gemini/settings.json` holds `GEMINI_SETTINGS`
    (its chats go there too). Not the system settings file: Gemini CLI skips one whose parent folders are
    writable by others, as /tmp is. The workspace is trusted, so headless `--yolo` may run tools."""
    write_json(home / ".gemini" / "settings.json", GEMINI_SETTINGS)
    return {**harness_env(base_url, session), "GOOGLE_GEMINI_BASE_URL": session_root(base_url, session),
            "GEMINI_CLI_HOME": str(home), "GEMINI_CLI_TRUST_WORKSPACE": "true"}


@dataclass
class GeminiCli(Harness):
    name: str = "gemini-cli"
    cli: Tool = Tool("gemini", "gemini", "node_modules/.bin/gemini")
    runtime: Runtime = Runtime("node", (20, 0, 0))
    pin: Pin = Pin("npm", "@google/gemini-cli", "0.61.0", "package.json")
    api: str = "gemini"
    default_model: str = "gemini-2.5-pro"
    key: Key = Key("GEMINI_API_KEY", "x-goog-api-key", "forgerl-placeholder-key")
    fingerprints: Fingerprints = Fingerprints(
        user_agents=("geminicli/", "geminicli-"),  # 0.61 headless: "GeminiCLI-tui/0.61.0/<model>"
        prompts=("You are Gemini CLI, ", "CLI agent specializing in software engineering tasks"),
        tools=(frozenset({"run_shell_command", "read_file", "replace"}),))
    commands: tuple[str, ...] = ("gemini",)
    offline: NotApplicable = NotApplicable("in its settings.json (GEMINI_SETTINGS), under GEMINI_CLI_HOME")
    headless: str = "`gemini --yolo --output-format json -m M -p …`"
    mcp_wiring: str = "mcpServers in $GEMINI_CLI_HOME/.gemini/settings.json ({command, args, env, trust: true})"
    resumes: str = "gemini --resume latest ... -p MESSAGE (the newest session of the workspace's project)"
    transcript: str = "`$GEMINI_CLI_HOME/.gemini/tmp/*/chats/session-*.jsonl`"
    final_answer_from: str = "JSON `response`"
    # Gemini CLI 0.61.0 (the functionDeclarations it sends); write_todos and update_topic (its chapter/progress
    # narration) its plan tools
    tool_kinds: Table = Table({
        "run_shell_command": "shell", "list_background_processes": "shell", "read_background_output": "shell",
        "read_file": "read", "read_many_files": "read", "list_directory": "read", "write_file": "write",
        "replace": "write", "glob": "search", "grep_search": "search", "web_fetch": "web", "google_web_search": "web",
        "write_todos": "plan", "update_topic": "plan", "enter_plan_mode": "plan"})
    plan_tools: PlanTools = PlanTools(snapshots=Table({"write_todos": "$.todos"}))
    subagent_tools: frozenset[str] = frozenset({"invoke_agent"})

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        return Launch(list(argv), gemini_env(base_url, session, scratch / "gemini"))

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        argv = [exe, "--yolo", "--output-format", "json", "-m", self.model(ctx), "-p", ctx.prompt]
        return argv, {**gemini_env(ctx.base_url, ctx.session, ctx.home), **self.base_env(ctx)}

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [argv[0], "--resume", "latest", *argv[1:]], env

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        merged_into(Path(env["GEMINI_CLI_HOME"]) / ".gemini" / "settings.json", gemini_mcp(ctx.mcp_servers))
        return argv, env

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        try:
            answer = json.loads(stdout[stdout.find("{"):]).get("response")
        except (json.JSONDecodeError, AttributeError):
            return None
        return answer if isinstance(answer, str) else None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((ctx.home / ".gemini" / "tmp").glob("*/chats/session-*.jsonl"))


HARNESS = GeminiCli()
