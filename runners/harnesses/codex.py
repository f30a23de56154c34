"""Codex CLI (`@openai/codex`, pinned in package.json).

Install: `npm ci` in the project root. Configure: a private `CODEX_HOME` and a
custom provider pointing at `<recorder>/s/<session>/v1` over the Responses API
with SSE (`-c model_providers.forgerl={...} -c model_provider=forgerl`; the
built-in provider would try a WebSocket first). Headless:
`codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox
-o LAST_MESSAGE_FILE PROMPT` (the runner is the sandbox). The final answer is
that file; its own transcript is `$CODEX_HOME/sessions/**/*.jsonl`.

Model: always `-m` (`default_model`, gpt-5.4, when none is given). With its
own default model (gpt-6.2-sol in 0.171) Codex sends no `tools`, only
namespaces in an `additional_tools` input item whose tool catalogue lives
server-side, so the recorded calls could not be trained with their tool
definitions; with a named model it sends every tool's schema in `tools`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from forgerl.recorder.launch import codex_overrides, harness_env

from .base import Harness, RunContext, openai_env
from .mcp import codex_overrides as mcp_overrides


@dataclass
class Codex(Harness):
    name: str = "codex"
    cli: str = "codex"
    api: str = "responses"
    default_model: str = "gpt-5.4"
    mcp_wiring: str = ("-c mcp_servers.NAME.{command,args,env,startup_timeout_sec,required=true} (its tools come in "
                       "a namespace mcp__NAME)")
    resumes: str = "codex exec resume --last [the same options] MESSAGE (the newest session of the workspace)"

    def _home(self, ctx: RunContext) -> Path:
        return ctx.home / ".codex"

    def _last_message(self, ctx: RunContext) -> Path:
        return ctx.home / "last-message.txt"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        self._home(ctx).mkdir(parents=True, exist_ok=True)
        argv = [exe, "exec", *codex_overrides(ctx.base_url, ctx.session), "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", "-o", str(self._last_message(ctx)),
                "-m", ctx.model or self.default_model]
        env = {**harness_env(ctx.base_url, ctx.session), **openai_env(ctx), "CODEX_HOME": str(self._home(ctx))}
        return [*argv, ctx.prompt], env

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [*argv[:2], "resume", "--last", *argv[2:]], env  # `resume` takes exec's options after it

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        return [*argv[:-1], *mcp_overrides(ctx.mcp_servers), argv[-1]], env  # before the prompt: `exec [resume]` first

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        path = self._last_message(ctx)
        return path.read_text(encoding="utf-8").strip() if path.exists() else None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((self._home(ctx) / "sessions").rglob("*.jsonl"))
