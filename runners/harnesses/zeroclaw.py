"""ZeroClaw (Rust; `cargo install zeroclaw`, not installable on these machines).

Configure: `~/.zeroclaw/config.toml` with
`default_provider = "custom:<recorder>/s/<session>/v1"` (OpenAI chat) or
`"anthropic-custom:<recorder>/s/<session>"` (Anthropic Messages), and
`default_model`. Headless: `zeroclaw agent -m PROMPT`. The adapter writes the
config in the rollout's private HOME; running it needs `zeroclaw` on PATH.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Harness, RunContext, base_env, key_or_placeholder


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
        config = ctx.home / ".zeroclaw" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(zeroclaw_config(ctx))
        env = {**base_env(ctx), "OPENAI_API_KEY": key_or_placeholder(ctx, "OPENAI_API_KEY", "sk-forgerl-placeholder")}
        return [exe, "agent", "-m", ctx.prompt], env
