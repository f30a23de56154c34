"""pi (npm `@mariozechner/pi-coding-agent`, pinned in package.json).

Install: `npm ci` in the project root; runs on the pinned Node 24. Configure:
a custom provider in `~/.pi/agent/models.json` (`api: "openai-completions"`,
Chat Completions at `<recorder>/s/<session>/v1`, the key read from
`OPENAI_API_KEY`), chosen with `--provider forgerl --model MODEL`;
`PI_OFFLINE=1 PI_TELEMETRY=0` stop its version check, install report and tool
downloads. Headless: `pi -p --mode json ... PROMPT` (pi has no approval
prompts; the runner is the sandbox). The final answer is the last assistant
text of the `agent_end` event on stdout; its own transcript is
`~/.pi/agent/sessions/--<cwd>--/<time>_<id>.jsonl`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from .launch import PROVIDER, Launch, drop_options, harness_env, session_root, write_json
from .locate import Tool
from .spec import OPENAI_KEY, Fingerprints, Harness, Key, NotApplicable, Pin, RunContext, Runtime, Table, write_config

PI_OFFLINE = Table({"PI_OFFLINE": "1", "PI_TELEMETRY": "0"})  # no version check, install report or tool downloads


def pi_models(base_url: str, session: str, model: str) -> dict:
    """pi's `models.json`: one Chat Completions provider at the session, its key read from `OPENAI_API_KEY`
    (the variable's name, not its value, is written)."""
    return {"providers": {PROVIDER: {
        "baseUrl": f"{session_root(base_url, session)}/v1", "api": "openai-completions", "apiKey": "OPENAI_API_KEY",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": model}]}}}


def pi_folder(cwd: Path) -> str:
    """The folder name pi gives a working directory's sessions (`getDefaultSessionDir`)."""
    return "--" + re.sub(r"[/\\:]", "-", str(cwd).lstrip("/\\")) + "--"


@dataclass
class Pi(Harness):
    name: str = "pi"
    cli: Tool = Tool("pi", "pi", "node_modules/.bin/pi")
    runtime: Runtime = Runtime("node", (20, 6, 0))
    pin: Pin = Pin("npm", "@mariozechner/pi-coding-agent", "0.73.1", "package.json")
    api: str = "chat"
    default_model: NotApplicable = NotApplicable("--model, else `policy`, names the one model of its provider")
    key: Key = OPENAI_KEY
    fingerprints: Fingerprints = Fingerprints(prompts=("operating inside pi, a coding agent harness",),
                                              tools=(frozenset({"read", "bash", "edit", "write"}),))
    commands: tuple[str, ...] = ("pi",)
    offline: Table = PI_OFFLINE
    headless: str = "`pi -p --mode json …` (no approvals)"
    mcp_wiring: NotApplicable = NotApplicable("no MCP client: tasks with MCP tools cannot run in it")
    resumes: str = "pi -p --continue ... MESSAGE (the newest session of the workspace)"
    transcript: str = "`~/.pi/agent/sessions/*/*.jsonl`"
    final_answer_from: str = "`agent_end` event"
    tool_kinds: Table = Table({"bash": "shell", "read": "read", "ls": "read", "edit": "write", "write": "write",
                               "grep": "search", "find": "search"})  # pi 0.73.1's built-in tools
    plan_tools: NotApplicable = NotApplicable("none built in")
    subagent_tools: NotApplicable = NotApplicable("none built in")

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        """pi with its agent dir in `scratch` (a custom provider can only come from `models.json` there) and its
        sessions where pi keeps them for this folder. `--model M` names the upstream model (a `P/` prefix naming
        the given `--provider P` is dropped; `Qwen/Qwen3-8B` stays whole)."""
        rest, given = drop_options(argv[1:], ("--provider", "--model"))
        model = given.get("--model", "policy")
        for provider in (PROVIDER, given.get("--provider")):
            model = model.removeprefix(f"{provider}/") if provider else model
        agent = scratch / "pi-agent"
        write_json(agent / "models.json", pi_models(base_url, session, model))
        user_agent = Path(os.environ.get("PI_CODING_AGENT_DIR") or Path.home() / ".pi" / "agent").expanduser()
        sessions = os.environ.get("PI_CODING_AGENT_SESSION_DIR") or str(user_agent / "sessions" / pi_folder(Path.cwd()))
        env = {**harness_env(base_url, session), **PI_OFFLINE, "PI_CODING_AGENT_DIR": str(agent),
               "PI_CODING_AGENT_SESSION_DIR": sessions}
        return Launch([argv[0], *rest, "--provider", PROVIDER, "--model", model], env)

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        model = ctx.model or "policy"
        write_config(ctx, ".pi/agent/models.json", json.dumps(pi_models(ctx.base_url, ctx.session, model), indent=2))
        argv = [exe, "-p", "--mode", "json", "--provider", PROVIDER, "--model", model, ctx.prompt]
        return argv, {**harness_env(ctx.base_url, ctx.session), **self.base_env(ctx), **PI_OFFLINE}

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [*argv[:2], "--continue", *argv[2:]], env  # after `pi -p`

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        for line in reversed(stdout.splitlines()):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and event.get("type") == "agent_end":
                texts = [_text(m) for m in event.get("messages") or [] if m.get("role") == "assistant"]
                return next((t for t in reversed(texts) if t), None)
        return None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((ctx.home / ".pi" / "agent" / "sessions").glob("*/*.jsonl"))


def _text(message: dict) -> str:
    return "".join(p.get("text", "") for p in message.get("content") or [] if p.get("type") == "text").strip()


HARNESS = Pi()
