"""ZeroClaw (Rust; `cargo install zeroclaw`, not installable on these machines).

Configure: `~/.zeroclaw/config.toml` with
`default_provider = "custom:<recorder>/s/<session>/v1"` (OpenAI chat) or
`"anthropic-custom:<recorder>/s/<session>"` (Anthropic Messages), and
`default_model`. Headless: `zeroclaw agent -m PROMPT`. The adapter writes the
config in the rollout's private HOME; running it needs `zeroclaw` on PATH.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Harness, RunContext, openai_env, write_config


def zeroclaw_config(ctx: RunContext) -> str:
    model = ctx.model or "policy"
    return (f'default_provider = "custom:{ctx.base_url}/s/{ctx.session}/v1"\n'
            f'default_model = "{model}"\n')  # the key comes from the environment, never from disk


@dataclass
class ZeroClaw(Harness):
    name: str = "zeroclaw"
    cli: str = "zeroclaw"
    api: str = "chat"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        write_config(ctx, ".zeroclaw/config.toml", zeroclaw_config(ctx))
        return [exe, "agent", "-m", ctx.prompt], openai_env(ctx)
