"""Harnesses as the recorder sees them: who made a call, and how to point one at us.

`detect_harness` names the harness from its User-Agent, in one table so
analysis and summaries agree on names (order matters: the first matching
fragment wins; Claude Code's UA also names the Anthropic SDK).
`harness_env` and `codex_overrides` are how `forge-record run` and the
runners aim a harness at a recorder session URL.
"""

from __future__ import annotations

USER_AGENT_FRAGMENTS: tuple[tuple[str, str], ...] = (
    ("claude-cli", "claude-code"),
    ("claude-code", "claude-code"),
    ("codex", "codex"),
    ("openclaw", "openclaw"),
    ("zeroclaw", "zeroclaw"),
    ("anthropic/python", "anthropic-python"),
    ("anthropic/js", "anthropic-js"),
    ("openai/python", "openai-python"),
    ("openai/js", "openai-js"),
)


def detect_harness(user_agent: str | None) -> str:
    """A harness name, or `unknown`."""
    ua = (user_agent or "").lower()
    for fragment, name in USER_AGENT_FRAGMENTS:
        if fragment in ua:
            return name
    return "unknown"


def harness_env(base_url: str, session: str) -> dict[str, str]:
    """Environment that points Claude Code and OpenAI-SDK clients at the recorder."""
    root = f"{base_url}/s/{session}"
    return {
        "ANTHROPIC_BASE_URL": root,
        "OPENAI_BASE_URL": f"{root}/v1",
        "FORGE_SESSION_ID": session,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def codex_overrides(base_url: str, session: str) -> list[str]:
    """`-c` flags that give Codex a provider pointing at the recorder over SSE."""
    provider = (f'{{name="forgerl", base_url="{base_url}/s/{session}/v1", wire_api="responses", '
                f'env_key="OPENAI_API_KEY"}}')
    return ["-c", f"model_providers.forgerl={provider}", "-c", "model_provider=forgerl"]
