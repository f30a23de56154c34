"""browser-use (PyPI `browser-use`, pinned in requirements-browser.lock): a browser agent that sees the screen.

Install: `make test` builds its own venv `.venv-browser` (its openai,
anthropic and pydantic pins clash with ours). browser-use is a library; its
headless command line is `browser_use_cli.py` beside this file, run by
`.venv-browser/bin/python`: one agent run on the task, driving the Debian
Chromium (`browser.CHROMIUM`) over CDP, headless, vision on (a screenshot in
every step's request), through browser-use's `ChatOpenAI` (Chat Completions
with a JSON-schema `response_format`: each answer is a JSON object whose
`action` list holds the step's actions) at `OPENAI_BASE_URL=<recorder>/s/<id>/v1`.
Telemetry, cloud sync and the version check are off (`launch.browser_use_env`).
The final answer is the text of its `done` action; its own transcript is
the agent history it saves. It has no MCP client: a web task's browser server
(`browser.PLAYWRIGHT_MCP`) is left out, its browser being its own.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from forgerl.recorder.launch import browser_use_env

from .base import Harness, HarnessError, RunContext, last_json_line_field, openai_env
from .browser import CHROMIUM, PLAYWRIGHT_MCP

BROWSER_VENV_PYTHON = Path(__file__).resolve().parents[2] / ".venv-browser" / "bin" / "python"
CLI = Path(__file__).with_name("browser_use_cli.py")
VIEWPORT = "1024x768"  # screenshots of this size: fewer image tokens per step than browser-use's 1920x1080


@dataclass
class BrowserUse(Harness):
    name: str = "browser-use"
    cli: str = "python"
    api: str = "chat"
    default_model: str = "gpt-5.4"
    mcp_wiring: str = "none: it drives its own browser (a web task's Playwright MCP server is left out)"

    def find(self) -> str:
        if not BROWSER_VENV_PYTHON.exists():
            raise HarnessError(f"{BROWSER_VENV_PYTHON} missing (run `make test` in the project root)")
        if not CHROMIUM.exists() and shutil.which("chromium") is None:
            raise HarnessError(f"{CHROMIUM} missing (run `make browser`: Debian's chromium package)")
        return str(BROWSER_VENV_PYTHON)

    def _history(self, ctx: RunContext) -> Path:
        return ctx.home / "browser-use-history.json"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        # -P: the script's folder stays off sys.path, where this module would shadow the browser_use package
        argv = [exe, "-P", str(CLI), "--task", ctx.prompt, "--model", ctx.model or self.default_model,
                "--history", str(self._history(ctx)), "--chromium", str(CHROMIUM), "--viewport", VIEWPORT]
        return argv, {**browser_use_env(ctx.base_url, ctx.session, ctx.home), **openai_env(ctx)}

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        """A task's browser server is left out (browser-use drives its own browser); any other MCP server is an
        error: it has no MCP client."""
        if any(server != PLAYWRIGHT_MCP for server in ctx.mcp_servers):
            return super().mcp(argv, env, ctx)
        return argv, env

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        return last_json_line_field(stdout, "result")

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        path = self._history(ctx)
        return [path] if path.exists() else []
