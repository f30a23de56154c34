"""Harnesses as the recorder sees them: who made a call, and how to point one at us.

`HARNESSES` is the one table of what gives each harness away, and
`identify` reads a call against it. Evidence comes in ranks, so a session's
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

How a harness is aimed at a recorder session lives in `recorder/launch.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import takewhile

from forgerl.schema.messages import Exchange

UNKNOWN_RANK, GENERIC_RANK, OWN_RANK, FINGERPRINT_RANK = 0, 1, 2, 3


@dataclass(frozen=True)
class Harness:
    """What gives one harness (or, with `generic`, one SDK or runtime) away.

    `user_agents`: lower-case User-Agent fragments. `headers`: (header, value
    fragment) pairs, lower case, an empty fragment meaning "present".
    `prompts`: phrases its system prompt contains. `tools`: tool sets, each
    matching when all its names are offered (case matters: Claude Code's
    `Bash` is not pi's `bash`).
    """

    name: str
    user_agents: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    prompts: tuple[str, ...] = ()
    tools: tuple[frozenset[str], ...] = ()
    generic: bool = False


# Order matters where fingerprints overlap: the first match wins, so the more
# specific entry comes first (OpenCode's tools include pi's four; Claude Code's
# UA names the Anthropic SDK too, and generic entries come last).
HARNESSES: tuple[Harness, ...] = (
    Harness("claude-code", user_agents=("claude-cli", "claude-code"),
            headers=(("x-app", "cli"), ("anthropic-beta", "claude-code-"), ("x-claude-code-session-id", "")),
            prompts=("x-anthropic-billing-header: cc_version=", "Anthropic's official CLI for Claude",
                     "You are a Claude agent, built on Anthropic's Claude Agent SDK"),
            tools=(frozenset({"Bash", "Read", "Edit", "Write"}),)),
    Harness("codex", user_agents=("codex",), headers=(("originator", "codex"),),
            prompts=("You are Codex, ", "You are a coding agent running in the Codex CLI"),
            tools=(frozenset({"exec_command", "write_stdin"}), frozenset({"shell", "update_plan"}),
                   frozenset({"apply_patch", "update_plan"}))),
    Harness("openclaw", user_agents=("openclaw",),
            prompts=("running inside OpenClaw", "operating inside OpenClaw"),
            tools=(frozenset({"exec", "process"}), frozenset({"sessions_spawn", "sessions_yield"}))),
    Harness("zeroclaw", user_agents=("zeroclaw",),
            prompts=("The following workspace files define your identity, behavior, and context.",),
            tools=(frozenset({"shell", "file_read", "file_write"}),)),
    Harness("opencode", user_agents=("opencode/",),
            headers=(("x-session-affinity", ""), ("x-parent-session-id", ""), ("x-opencode-session", "")),
            prompts=("You are opencode, ", "You are OpenCode, "),
            tools=(frozenset({"bash", "read", "glob", "grep", "webfetch"}),)),
    Harness("qwen-code", user_agents=("qwencode/",), headers=(("x-dashscope-useragent", "qwencode"),),
            prompts=("You are Qwen Code, ",),
            # 0.24 offers todo_write only when tools.todoWrite.enabled; its default set has `agent` instead
            tools=(frozenset({"run_shell_command", "read_file", "edit", "todo_write"}),
                   frozenset({"run_shell_command", "read_file", "edit", "write_file", "agent"}))),
    Harness("gemini-cli", user_agents=("geminicli/", "geminicli-"),  # 0.61 headless: "GeminiCLI-tui/0.61.0/<model>"
            prompts=("You are Gemini CLI, ", "CLI agent specializing in software engineering tasks"),
            tools=(frozenset({"run_shell_command", "read_file", "replace"}),)),
    Harness("mini-swe-agent", prompts=("You are a helpful assistant that can interact",)),
    Harness("pi", prompts=("operating inside pi, a coding agent harness",),
            tools=(frozenset({"read", "bash", "edit", "write"}),)),
    Harness("anthropic-python", user_agents=("anthropic/python",), generic=True),
    Harness("anthropic-js", user_agents=("anthropic/js",), generic=True),
    Harness("openai-python", user_agents=("openai/python",), generic=True),
    Harness("openai-js", user_agents=("openai/js",), generic=True),
    Harness("bun", user_agents=("bun/",), generic=True),
)


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
    for harness in HARNESSES:
        rank = GENERIC_RANK if harness.generic else OWN_RANK
        for fragment in harness.user_agents:
            if fragment in user_agent:
                return HarnessId(harness.name, rank, f"user-agent:{fragment}")
        for name, fragment in harness.headers:
            if name in headers and fragment in headers[name].lower():
                return HarnessId(harness.name, rank, f"header:{name}" + (f"={fragment}" if fragment else ""))
    return UNKNOWN


def _by_prompt(exchange: Exchange) -> HarnessId | None:
    leading = takewhile(lambda m: m.role in ("system", "developer"), exchange.input)
    system = "\n".join(m.text() for m in leading)
    if not system:
        return None
    for harness in HARNESSES:
        for phrase in harness.prompts:
            if phrase in system:
                return HarnessId(harness.name, FINGERPRINT_RANK, f"system-prompt:{phrase}")
    return None


def _by_tools(exchange: Exchange) -> HarnessId | None:
    offered = {tool.get("name") for tool in exchange.tools}
    for harness in HARNESSES:
        for names in harness.tools:
            if names <= offered:
                return HarnessId(harness.name, FINGERPRINT_RANK, "tools:" + ",".join(sorted(names)))
    return None
