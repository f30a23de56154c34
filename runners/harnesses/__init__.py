"""Harness adapters: how to find, configure, run headless and read back each harness.

An adapter turns (prompt, workspace, private home, recorder session URL) into
a command line and environment, and after the run collects the harness's
final answer and its own transcript files. The recorder URL is the only
model endpoint a harness is given. `HARNESSES` maps `--harness` names to
adapters.
"""

from __future__ import annotations

from .base import Harness, HarnessError, RunContext, find_cli
from .browser_use import BrowserUse
from .claude_code import ClaudeCode
from .codex import Codex
from .gemini_cli import GeminiCli
from .mini_swe_agent import MiniSweAgent
from .openclaw import OpenClaw
from .opencode import OpenCode
from .pi import Pi
from .qwen_code import QwenCode
from .zeroclaw import ZeroClaw

HARNESSES: dict[str, Harness] = {h.name: h for h in (ClaudeCode(), Codex(), OpenClaw(), ZeroClaw(), QwenCode(), Pi(),
                                                    MiniSweAgent(), GeminiCli(), OpenCode(), BrowserUse())}


def get_harness(name: str) -> Harness:
    try:
        return HARNESSES[name]
    except KeyError:
        raise HarnessError(f"unknown harness {name!r}; known: {', '.join(HARNESSES)}") from None


__all__ = ["HARNESSES", "Harness", "HarnessError", "RunContext", "find_cli", "get_harness"]
