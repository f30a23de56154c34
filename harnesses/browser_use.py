"""browser-use (PyPI `browser-use`, pinned in requirements-browser.lock): a browser agent that sees the screen.

Install: `make test` builds its own venv `.venv-browser` (its openai,
anthropic and pydantic pins clash with ours). browser-use is a library; its
headless command line is `browser_use_cli.py` beside this file, run by that
venv's Python: one agent run on the task, driving the Debian Chromium
(`browser.CHROMIUM`) over CDP, headless, vision on (a screenshot in every
step's request), through browser-use's `ChatOpenAI` (Chat Completions with a
JSON-schema `response_format`: each answer is a JSON object whose `action`
list holds the step's actions) at `OPENAI_BASE_URL=<recorder>/s/<id>/v1`.
Telemetry, cloud sync and the version check are off (`BROWSER_USE_OFFLINE`).
The final answer is the text of its `done` action; its own transcript is the
agent history it saves. It has no MCP client: a web task's browser server
(`browser.PLAYWRIGHT_MCP`) is left out, its browser being its own.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from .browser import CHROMIUM, PLAYWRIGHT_MCP
from .launch import Launch, harness_env
from .locate import HarnessError, Tool, locate
from .spec import OPENAI_KEY, Fingerprints, Harness, Key, NotApplicable, Pin, RunContext, Table, last_json_line_field

CLI = Path(__file__).with_name("browser_use_cli.py")
VIEWPORT = "1024x768"  # screenshots of this size: fewer image tokens per step than browser-use's 1920x1080

BROWSER_USE_OFFLINE = Table({"ANONYMIZED_TELEMETRY": "false", "BROWSER_USE_CLOUD_SYNC": "false",
                             "BROWSER_USE_VERSION_CHECK": "false", "BROWSER_USE_CLOUD_HINTS": "false"})
"""browser-use 0.13's phone-home off: PostHog telemetry (eu.i.posthog.com), cloud sync of runs
(api.browser-use.com), the PyPI version check and cloud hints (names from its `config.py`)."""


def browser_use_env(base_url: str, session: str, scratch: Path) -> dict[str, str]:
    """browser-use's `ChatOpenAI` at the session (`OPENAI_BASE_URL`), its config folder (profiles, cached
    settings) in `scratch`, its phone-home off."""
    return {**harness_env(base_url, session), **BROWSER_USE_OFFLINE,
            "BROWSER_USE_CONFIG_DIR": str(scratch / "browser-use"), "XDG_CONFIG_HOME": str(scratch / "config"),
            "XDG_CACHE_HOME": str(scratch / "cache")}


@dataclass
class BrowserUse(Harness):
    name: str = "browser-use"
    # a `python` on PATH is not known to hold browser-use: only FORGE_BROWSER_USE_PYTHON, the config, the venv
    cli: Tool = Tool("browser-use-python", "", ".venv-browser/bin/python")
    runtime: NotApplicable = NotApplicable("its own venv's Python (.venv-browser) and Debian's chromium")
    pin: Pin = Pin("pypi", "browser-use", "0.13.14", "requirements-browser.lock")
    api: str = "chat"
    default_model: str = "gpt-5.4"
    key: Key = OPENAI_KEY
    # its system prompt (browser_use/agent/system_prompts/*.md); it sends the openai-python User-Agent
    fingerprints: Fingerprints = Fingerprints(
        prompts=("designed to operate in an iterative loop to automate browser tasks",  # any model
                 "You automate browser tasks by outputting structured JSON actions"))  # browser-use's own models
    commands: tuple[str, ...] = (CLI.name,)
    offline: Table = BROWSER_USE_OFFLINE
    headless: str = (f"`.venv-browser/bin/python -P {CLI.name} --task … --chromium /usr/bin/chromium` (Agent with "
                     "`use_vision=True`, headless Chromium over CDP, no extensions, no judge call)")
    mcp_wiring: str = "none: it drives its own browser (a web task's Playwright MCP server is left out)"
    resumes: NotApplicable = NotApplicable("cannot resume: tasks with a simulated user cannot run in it")
    transcript: str = "its agent history JSON"
    final_answer_from: str = "the `done` action's text"
    tool_kinds: NotApplicable = NotApplicable("its actions come as JSON in each answer (analysis/gui.py reads them)")
    plan_tools: NotApplicable = NotApplicable("its plan is a field of each JSON answer, not a tool")
    subagent_tools: NotApplicable = NotApplicable("none")

    def find(self) -> str:
        python = locate(self.cli)
        if not CHROMIUM.exists() and shutil.which("chromium") is None:
            raise HarnessError(f"{CHROMIUM} missing (run `make browser`: Debian's chromium package)")
        return python

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        return Launch(list(argv), browser_use_env(base_url, session, scratch))

    def _history(self, ctx: RunContext) -> Path:
        return ctx.home / "browser-use-history.json"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        # -P: the script's folder stays off sys.path, where this module would shadow the browser_use package
        argv = [exe, "-P", str(CLI), "--task", ctx.prompt, "--model", self.model(ctx),
                "--history", str(self._history(ctx)), "--chromium", str(CHROMIUM), "--viewport", VIEWPORT]
        return argv, {**browser_use_env(ctx.base_url, ctx.session, ctx.home), **self.base_env(ctx)}

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


HARNESS = BrowserUse()
