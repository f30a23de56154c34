"""OpenCode (npm `opencode-ai` 1.18.33, pinned in package.json; a platform binary built with Bun).

Configure (`opencode_env`): the provider comes in `OPENCODE_CONFIG_CONTENT`
(`@ai-sdk/openai-compatible`, Chat Completions at `<recorder>/s/<session>/v1`,
key from `OPENAI_API_KEY`, every permission granted), its phone-home off
(models.dev catalogue, update check, LSP downloads, sharing, the background
npm install of its plugin package). Headless: `opencode run --format json
PROMPT` (one JSON event per line); the final answer is the text of the last
assistant message's `text` events. Its own transcript is its SQLite database
under the private HOME (`~/.local/share/opencode/opencode.db`): each message
with its parts, one JSON line per message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .launch import PROVIDER, Launch, drop_options, harness_env, session_root
from .locate import Tool
from .mcp import opencode_mcp
from .spec import OPENAI_KEY, Fingerprints, Harness, Key, NotApplicable, Pin, PlanTools, RunContext, Table
from .sqlite_transcript import sqlite_transcript

MESSAGES = ("SELECT json_set(m.data, '$.id', m.id, '$.parts', json_group_array(json(p.data))) FROM message m "
            "JOIN part p ON p.message_id = m.id GROUP BY m.id ORDER BY m.time_created, m.id")

OPENCODE_OFFLINE = Table({"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
                          "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1"})
"""OpenCode 1.18's phone-home off: the models.dev catalogue, the update check, language-server downloads and
session sharing (names from its `RuntimeFlags`)."""


def opencode_config(base_url: str, session: str, model: str) -> dict:
    """OpenCode's config (`OPENCODE_CONFIG_CONTENT`): one `@ai-sdk/openai-compatible` provider at the session,
    its key read from `OPENAI_API_KEY` when called, as the default model; every permission granted (headless
    runs cannot ask), no auto-update, no sharing, no git snapshots of the workspace (kept for undo only)."""
    return {"provider": {PROVIDER: {
                "npm": "@ai-sdk/openai-compatible", "name": PROVIDER,
                "options": {"baseURL": f"{session_root(base_url, session)}/v1", "apiKey": "{env:OPENAI_API_KEY}"},
                "models": {model: {"name": model, "tool_call": True}}}},
            "model": f"{PROVIDER}/{model}", "permission": "allow", "autoupdate": False, "share": "disabled",
            "snapshot": False}


def opencode_env(base_url: str, session: str, model: str, config_home: Path, workdir: Path) -> dict[str, str]:
    """OpenCode aimed at the session, working in `workdir` (it reads `PWD` before its real working directory),
    its global config folder `config_home/opencode` (`XDG_CONFIG_HOME`, so the user's own config and plugins
    stay out of the recording). OpenCode 1.18 runs `npm install @opencode-ai/plugin` in the background in every
    config folder whose lock file lacks it; the folder is seeded with that lock file and an empty
    `node_modules`, so it finds nothing to do and fetches nothing."""
    folder = config_home / "opencode"
    (folder / "node_modules").mkdir(parents=True, exist_ok=True)
    lock = {"packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}}
    (folder / "package-lock.json").write_text(json.dumps(lock))
    return {**harness_env(base_url, session), **OPENCODE_OFFLINE, "XDG_CONFIG_HOME": str(config_home),
            "PWD": str(workdir), "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(base_url, session, model))}


@dataclass
class OpenCode(Harness):
    name: str = "opencode"
    cli: Tool = Tool("opencode", "opencode", "node_modules/.bin/opencode")
    runtime: NotApplicable = NotApplicable("a self-contained Bun binary")
    pin: Pin = Pin("npm", "opencode-ai", "1.18.33", "package.json")
    api: str = "chat"
    default_model: str = "gpt-5.4"
    key: Key = OPENAI_KEY
    fingerprints: Fingerprints = Fingerprints(
        user_agents=("opencode/",),
        headers=(("x-session-affinity", ""), ("x-parent-session-id", ""), ("x-opencode-session", "")),
        prompts=("You are opencode, ", "You are OpenCode, "),
        tools=(frozenset({"bash", "read", "glob", "grep", "webfetch"}),),
        precedes=("pi",))  # it offers pi's four tools too
    commands: tuple[str, ...] = ("opencode",)
    offline: Table = OPENCODE_OFFLINE
    headless: str = "`opencode run --format json --title ID …` (`--title`: no title-writing call)"
    mcp_wiring: str = "mcp in OPENCODE_CONFIG_CONTENT ({NAME: {type: local, command: [...], environment}})"
    resumes: str = "opencode run --continue ... MESSAGE (the last session in the private HOME's database)"
    transcript: str = "`~/.local/share/opencode/opencode.db` messages with their parts, as JSON lines"
    final_answer_from: str = "last assistant message's `text` events"
    # OpenCode 1.18.33; a gpt-* model gets apply_patch in place of edit and write
    tool_kinds: Table = Table({
        "bash": "shell", "read": "read", "edit": "write", "write": "write", "apply_patch": "write",
        "glob": "search", "grep": "search", "webfetch": "web", "websearch": "web",
        "todowrite": "plan", "plan_enter": "plan", "plan_exit": "plan"})
    plan_tools: PlanTools = PlanTools(snapshots=Table({"todowrite": "$.todos"}))
    subagent_tools: frozenset[str] = frozenset({"task"})

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        """`-m M` (or `provider/M`) names the upstream model, served as `forgerl/M` (the config's default)."""
        rest, given = drop_options(argv[1:], ("-m", "--model"))
        model = (given.get("-m") or given.get("--model") or "policy").split("/", 1)[-1]
        return Launch([argv[0], *rest], opencode_env(base_url, session, model, scratch / "opencode-config", Path.cwd()))

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        env = {**opencode_env(ctx.base_url, ctx.session, self.model(ctx), ctx.home / ".config", ctx.workspace),
               **self.base_env(ctx)}
        return [exe, "run", "--format", "json", "--title", ctx.session, ctx.prompt], env

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [*argv[:2], "--continue", *argv[2:]], env  # after `opencode run`

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        config = {**json.loads(env["OPENCODE_CONFIG_CONTENT"]), **opencode_mcp(ctx.mcp_servers)}
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


HARNESS = OpenCode()
