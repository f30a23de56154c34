"""mini-swe-agent (PyPI `mini-swe-agent`, pinned in requirements-mini.lock).

Install: `make test` builds its own venv `.venv-mini` (its litellm and typer
pins clash with ours); the CLI is `.venv-mini/bin/mini`. It reaches the model
through litellm's Chat Completions client: `-m openai/<name>` with the base URL
in `OPENAI_API_BASE` / `OPENAI_BASE_URL` (`recorder/launch.py`
`mini_swe_agent_env`, which also turns off its first-run setup prompt, its
cost lookup and litellm's model-cost-map fetch from GitHub). Headless:
`mini -t TASK --yolo --exit-immediately -o TRAJ.json`. Its one action is the
`bash` tool (v2 sends it as a tool definition); it finishes when a command
prints `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` first, and what follows is the
submission: the final answer, stored as `info.submission` in the trajectory
file, which is also its own transcript.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from forgerl.recorder.launch import mini_swe_agent_env

from .base import Harness, HarnessError, RunContext, openai_env

MINI_BIN = Path(__file__).resolve().parents[2] / ".venv-mini" / "bin"


@dataclass
class MiniSweAgent(Harness):
    name: str = "mini-swe-agent"
    cli: str = "mini"
    api: str = "chat"
    default_model: str = "gpt-5.4"

    def find(self) -> str:
        found = shutil.which(self.cli, path=str(MINI_BIN)) or shutil.which(self.cli)
        if found is None:
            raise HarnessError(f"mini not found in {MINI_BIN} or on PATH (run `make test` in the project root)")
        return found

    def _trajectory(self, ctx: RunContext) -> Path:
        return ctx.home / "mini.traj.json"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        model = ctx.model or self.default_model
        argv = [exe, "-m", model if model.startswith("openai/") else f"openai/{model}", "-t", ctx.prompt,
                "--yolo", "--exit-immediately", "-o", str(self._trajectory(ctx))]
        env = {**mini_swe_agent_env(ctx.base_url, ctx.session, ctx.home), **openai_env(ctx)}
        return argv, env

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        try:
            info = json.loads(self._trajectory(ctx).read_text(encoding="utf-8")).get("info") or {}
        except (OSError, json.JSONDecodeError):
            return None
        return (info.get("submission") or "").strip() or None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        path = self._trajectory(ctx)
        return [path] if path.exists() else []
