"""Who made a call: `identify` reads it against the harnesses' fingerprints.

The fingerprints are each harness's own (`forgerl.harnesses`, its module's
`fingerprints`, in `FINGERPRINTS` order); `GENERIC` below adds the SDKs and
runtimes, which name no harness. Evidence comes in ranks, so a session's
name can only get more specific as its calls arrive (the store keeps the
highest rank, the latest on ties):

- 3: the system prompt or the tool set. Fingerprints come from the harnesses'
  own sources (the npm packages, ZeroClaw's and mini-swe-agent's repos); they
  name the harness whatever client library or base URL it was set up with.
- 2: the harness's own User-Agent or header (Claude Code's `x-app: cli`,
  Codex's `originator`, OpenCode's session headers).
- 1: a generic SDK or runtime User-Agent (`OpenAI/JS`, which OpenClaw and pi
  send; `Bun/…`, the connectivity probe Claude Code makes first).
- 0: nothing known, `unknown`.

Stainless headers (`x-stainless-*`) are left out on purpose: every
Anthropic/OpenAI SDK sends them, so they name no harness.

How a harness is aimed at a recorder session lives in its module too
(`forgerl.harnesses.launch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import takewhile

from forgerl.harnesses import FINGERPRINTS, Fingerprints
from forgerl.schema.messages import Exchange

UNKNOWN_RANK, GENERIC_RANK, OWN_RANK, FINGERPRINT_RANK = 0, 1, 2, 3

GENERIC: tuple[tuple[str, Fingerprints], ...] = (
    ("anthropic-python", Fingerprints(user_agents=("anthropic/python",))),
    ("anthropic-js", Fingerprints(user_agents=("anthropic/js",))),
    ("openai-python", Fingerprints(user_agents=("openai/python",))),
    ("openai-js", Fingerprints(user_agents=("openai/js",))),
    ("bun", Fingerprints(user_agents=("bun/",))),
)
"""SDKs and runtimes, not harnesses: their User-Agent names a session only when nothing more specific does."""


@dataclass(frozen=True)
class HarnessId:
    """Who made a call, how specific the evidence is (`*_RANK`), and what it was."""

    name: str
    rank: int
    evidence: str | None


UNKNOWN = HarnessId("unknown", UNKNOWN_RANK, None)


def identify(headers: Mapping[str, str], exchange: Exchange | None) -> HarnessId:
    """The most specific evidence a call holds about its harness.

    `headers` are the request headers by lower-case name (a `CallRecord`'s
    redacted `request_headers`); `exchange` is the parsed request, if any.
    """
    if exchange is not None:
        found = _by_prompt(exchange) or _by_tools(exchange)
        if found:
            return found
    user_agent = headers.get("user-agent", "").lower()
    for rank, table in ((OWN_RANK, FINGERPRINTS), (GENERIC_RANK, GENERIC)):
        for harness, prints in table:
            for fragment in prints.user_agents:
                if fragment in user_agent:
                    return HarnessId(harness, rank, f"user-agent:{fragment}")
            for name, fragment in prints.headers:
                if name in headers and fragment in headers[name].lower():
                    return HarnessId(harness, rank, f"header:{name}" + (f"={fragment}" if fragment else ""))
    return UNKNOWN


def _by_prompt(exchange: Exchange) -> HarnessId | None:
    leading = takewhile(lambda m: m.role in ("system", "developer"), exchange.input)
    system = "\n".join(m.text() for m in leading)
    if not system:
        return None
    for harness, prints in FINGERPRINTS:
        for phrase in prints.prompts:
            if phrase in system:
                return HarnessId(harness, FINGERPRINT_RANK, f"system-prompt:{phrase}")
    return None


def _by_tools(exchange: Exchange) -> HarnessId | None:
    offered = {tool.get("name") for tool in exchange.tools}
    for harness, prints in FINGERPRINTS:
        for names in prints.tools:
            if names <= offered:
                return HarnessId(harness, FINGERPRINT_RANK, "tools:" + ",".join(sorted(names)))
    return None
