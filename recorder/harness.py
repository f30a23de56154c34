"""Which harness made a call, from its User-Agent.

One table, so analysis and summaries agree on names. Order matters: the
first matching fragment wins (Claude Code's UA also names the Anthropic SDK).
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
