"""Qwen Code (npm `@qwen-code/qwen-code`, pinned in package.json; a Gemini CLI fork).

Install: `npm ci` in the project root; runs on the pinned Node 24 (it needs
>= 22). Configure: its OpenAI auth (`--auth-type openai`,
`OPENAI_BASE_URL=<recorder>/s/<session>/v1`, `OPENAI_API_KEY`), Chat
Completions; usage statistics off (`QWEN_USAGE_STATISTICS_ENABLED=false`).
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

from .launch import Launch, harness_env
from .locate import Tool
from .mcp import gemini_mcp, merged_into
from .spec import OPENAI_KEY, Fingerprints, Harness, Key, NotApplicable, Pin, PlanTools, RunContext, Runtime, Table

MEMORY_OFF = {"enableManagedAutoMemory": False, "enableManagedAutoDream": False}
OFFLINE = Table({"QWEN_USAGE_STATISTICS_ENABLED": "false"})
"""Its usage statistics (RUM beacons to `*.rum.aliyuncs.com`, on by default) off; update checks and the IDE
companion run only in the interactive TUI, and telemetry is off unless configured."""


@dataclass
class QwenCode(Harness):
    name: str = "qwen-code"
    cli: Tool = Tool("qwen", "qwen", "node_modules/.bin/qwen")
    runtime: Runtime = Runtime("node", (22, 0, 0))
    pin: Pin = Pin("npm", "@qwen-code/qwen-code", "0.24.4", "package.json")
    api: str = "chat"
    default_model: NotApplicable = NotApplicable("its own default model")
    key: Key = OPENAI_KEY
    fingerprints: Fingerprints = Fingerprints(
        user_agents=("qwencode/",), headers=(("x-dashscope-useragent", "qwencode"),),
        prompts=("You are Qwen Code, ",),
        # 0.24 offers todo_write only when tools.todoWrite.enabled; its default set has `agent` instead
        tools=(frozenset({"run_shell_command", "read_file", "edit", "todo_write"}),
               frozenset({"run_shell_command", "read_file", "edit", "write_file", "agent"})),
        precedes=("gemini-cli",))  # a Gemini CLI fork: its tools and prompt descend from Gemini CLI's
    commands: tuple[str, ...] = ("qwen",)
    offline: Table = OFFLINE
    headless: str = "`qwen --yolo --output-format json [-m M] PROMPT`"
    mcp_wiring: str = ("mcpServers in ~/.qwen/settings.json ({command, args, env, trust: true}), "
                       "tools.toolSearch.enabled=false")
    resumes: str = "qwen --continue ... MESSAGE (the newest session of the workspace's project)"
    transcript: str = "`~/.qwen/projects/*/chats/*.jsonl`"
    final_answer_from: str = "JSON `result`"
    # Qwen Code 0.24.4 (ToolNames in its bundle); `todo_write` (off unless tools.todoWrite.enabled) its plan
    tool_kinds: Table = Table({
        "run_shell_command": "shell", "exec": "shell", "read_file": "read", "list_directory": "read",
        "zoom_image": "read", "edit": "write", "write_file": "write", "notebook_edit": "write", "glob": "search",
        "grep_search": "search", "web_fetch": "web", "web_search": "web",
        "todo_write": "plan", "enter_plan_mode": "plan", "exit_plan_mode": "plan", "task_create": "plan",
        "task_update": "plan", "task_list": "plan"})
    plan_tools: PlanTools = PlanTools(snapshots=Table({"todo_write": "$.todos"}))
    subagent_tools: frozenset[str] = frozenset({"agent"})

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        """Its OpenAI auth (the flag outranks an auth type chosen in the user's settings)."""
        flags = [] if any(a.startswith("--auth-type") for a in argv) else ["--auth-type", "openai"]
        return Launch([argv[0], *flags, *argv[1:]], {**harness_env(base_url, session), **OFFLINE})

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        model = ["-m", ctx.model] if ctx.model else []
        # Its managed memory off: after every run its extraction subagent makes one more model call (another
        # system prompt, the conversation plus its own instructions), which would be the session's last call, the
        # one graded; and a private HOME keeps no memory to extract or consolidate ("dream") anyway.
        merged_into(ctx.home / ".qwen" / "settings.json", {"memory": MEMORY_OFF})
        aimed = self.launch([exe, "--yolo", "--output-format", "json", *model, ctx.prompt], ctx.base_url, ctx.session,
                            ctx.home)
        return aimed.argv, {**aimed.env, **self.base_env(ctx), "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [argv[0], "--continue", *argv[1:]], env

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        # Tool search off: Qwen Code 0.24 otherwise defers MCP tools behind its tool_search bridge, and the
        # model is never offered them upfront.
        merged_into(ctx.home / ".qwen" / "settings.json",
                    {**gemini_mcp(ctx.mcp_servers), "tools": {"toolSearch": {"enabled": False}}})
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


HARNESS = QwenCode()
