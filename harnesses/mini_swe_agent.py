"""mini-swe-agent (PyPI `mini-swe-agent`, pinned in requirements-mini.lock).

Install: `make test` builds its own venv `.venv-mini` (its litellm and typer
pins clash with ours); the CLI is `.venv-mini/bin/mini`. It reaches the model
through litellm's Chat Completions client: `-m openai/<name>` with the base URL
in `OPENAI_API_BASE` / `OPENAI_BASE_URL` (`mini_swe_agent_env`, which also
turns off its first-run setup prompt, its cost lookup and litellm's
model-cost-map fetch from GitHub). Headless: `mini -t TASK --yolo
--exit-immediately -o TRAJ.json`. Its one action is the `bash` tool (v2 sends
it as a tool definition); it finishes when a command prints
`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` first, and what follows is the
submission: the final answer, stored as `info.submission` in the trajectory
file, which is also its own transcript.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .launch import Launch, harness_env, session_root
from .locate import Tool
from .spec import OPENAI_KEY, Fingerprints, Harness, Key, NotApplicable, Pin, RunContext, Table

OFFLINE = Table({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_COST_TRACKING": "ignore_errors"})
"""litellm's model cost map read from the package instead of fetched from GitHub at import, and no cost lookup
for an unpriced model."""


def mini_swe_agent_env(base_url: str, session: str, scratch: Path) -> dict[str, str]:
    """mini-swe-agent (litellm): the OpenAI base URL, no first-run setup prompt, its global config (`.env`, last
    trajectory) in `scratch`, its phone-home off (`OFFLINE`)."""
    root = session_root(base_url, session)
    return {**harness_env(base_url, session), "OPENAI_API_BASE": f"{root}/v1", "MSWEA_CONFIGURED": "true",
            "MSWEA_GLOBAL_CONFIG_DIR": str(scratch / "mini-swe-agent"), **OFFLINE}


@dataclass
class MiniSweAgent(Harness):
    name: str = "mini-swe-agent"
    cli: Tool = Tool("mini", "mini", ".venv-mini/bin/mini")
    runtime: NotApplicable = NotApplicable("its own venv's Python (.venv-mini)")
    pin: Pin = Pin("pypi", "mini-swe-agent", "2.4.6", "requirements-mini.lock")
    api: str = "chat"
    default_model: str = "gpt-5.4"
    key: Key = OPENAI_KEY
    fingerprints: Fingerprints = Fingerprints(prompts=("You are a helpful assistant that can interact",))
    commands: tuple[str, ...] = ("mini",)
    offline: Table = OFFLINE
    headless: str = "`mini -t … --yolo --exit-immediately -o TRAJ.json`"
    mcp_wiring: NotApplicable = NotApplicable("no MCP client: tasks with MCP tools cannot run in it")
    resumes: NotApplicable = NotApplicable("cannot resume: tasks with a simulated user cannot run in it")
    transcript: str = "its `-o` trajectory JSON"
    final_answer_from: str = "`info.submission` of the `-o` file"
    # mini-swe-agent 2.4.6: one tool, `bash` (v2 sends it as a tool definition); its checks are shell commands
    tool_kinds: Table = Table({"bash": "shell"})
    plan_tools: NotApplicable = NotApplicable("one tool, bash")
    subagent_tools: NotApplicable = NotApplicable("one tool, bash")

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        return Launch(list(argv), mini_swe_agent_env(base_url, session, scratch))

    def _trajectory(self, ctx: RunContext) -> Path:
        return ctx.home / "mini.traj.json"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        model = self.model(ctx)
        argv = [exe, "-m", model if model.startswith("openai/") else f"openai/{model}", "-t", ctx.prompt,
                "--yolo", "--exit-immediately", "-o", str(self._trajectory(ctx))]
        return argv, {**mini_swe_agent_env(ctx.base_url, ctx.session, ctx.home), **self.base_env(ctx)}

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        try:
            info = json.loads(self._trajectory(ctx).read_text(encoding="utf-8")).get("info") or {}
        except (OSError, json.JSONDecodeError):
            return None
        return (info.get("submission") or "").strip() or None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        path = self._trajectory(ctx)
        return [path] if path.exists() else []


HARNESS = MiniSweAgent()
