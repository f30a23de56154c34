"""pi (npm `@mariozechner/pi-coding-agent`, pinned in package.json).

Install: `npm ci` in the project root; runs on the pinned Node 24. Configure:
a custom provider in `~/.pi/agent/models.json` (`api: "openai-completions"`,
Chat Completions at `<recorder>/s/<session>/v1`, the key read from
`OPENAI_API_KEY`; `recorder/launch.py` writes it), chosen with
`--provider forgerl --model MODEL`; `PI_OFFLINE=1 PI_TELEMETRY=0` stop its
version check, install report and tool downloads. Headless:
`pi -p --mode json ... PROMPT` (pi has no approval prompts; the runner is the
sandbox). The final answer is the last assistant text of the `agent_end`
event on stdout; its own transcript is
`~/.pi/agent/sessions/--<cwd>--/<time>_<id>.jsonl`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from forgerl.recorder.launch import PI_OFFLINE, PROVIDER, harness_env, pi_models

from .base import Harness, RunContext, openai_env, write_config


@dataclass
class Pi(Harness):
    name: str = "pi"
    cli: str = "pi"
    api: str = "chat"
    resumes: str = "pi -p --continue ... MESSAGE (the newest session of the workspace)"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        model = ctx.model or "policy"
        write_config(ctx, ".pi/agent/models.json", json.dumps(pi_models(ctx.base_url, ctx.session, model), indent=2))
        argv = [exe, "-p", "--mode", "json", "--provider", PROVIDER, "--model", model, ctx.prompt]
        return argv, {**harness_env(ctx.base_url, ctx.session), **openai_env(ctx), **PI_OFFLINE}

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
