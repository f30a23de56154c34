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

from .launch import PROVIDER, Launch, harness_env, session_root
from .locate import Tool
from .mcp import codex_mcp_overrides
from .spec import OPENAI_KEY, Fingerprints, Harness, Key, NotApplicable, Pin, PlanTools, RunContext, Runtime, Table


def provider_overrides(base_url: str, session: str) -> list[str]:
    """`-c` flags that give Codex a provider pointing at the recorder over SSE."""
    provider = (f'{{name="{PROVIDER}", base_url="{session_root(base_url, session)}/v1", wire_api="responses", '
                f'env_key="OPENAI_API_KEY"}}')
    return ["-c", f"model_providers.{PROVIDER}={provider}", "-c", f"model_provider={PROVIDER}"]


@dataclass
class Codex(Harness):
    name: str = "codex"
    cli: Tool = Tool("codex", "codex", "node_modules/.bin/codex")
    runtime: Runtime = Runtime("node", (16,))
    pin: Pin = Pin("npm", "@openai/codex", "0.171.0", "package.json")
    api: str = "responses"
    default_model: str = "gpt-5.4"
    key: Key = OPENAI_KEY
    fingerprints: Fingerprints = Fingerprints(
        user_agents=("codex",), headers=(("originator", "codex"),),
        prompts=("You are Codex, ", "You are a coding agent running in the Codex CLI"),
        tools=(frozenset({"exec_command", "write_stdin"}), frozenset({"shell", "update_plan"}),
               frozenset({"apply_patch", "update_plan"})))
    commands: tuple[str, ...] = ("codex",)
    offline: NotApplicable = NotApplicable("no switch set: its custom provider fetches no model list")
    headless: str = "`codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -o FILE`"
    mcp_wiring: str = ("-c mcp_servers.NAME.{command,args,env,startup_timeout_sec,required=true} (its tools come in "
                       "a namespace mcp__NAME)")
    resumes: str = "codex exec resume --last [the same options] MESSAGE (the newest session of the workspace)"
    transcript: str = "`$CODEX_HOME/sessions/**/*.jsonl`"
    final_answer_from: str = "the `-o` file"
    tool_kinds: Table = Table({  # Codex CLI 0.17x; its multi_agent_v1 namespace steers or awaits a subagent
        "exec_command": "shell", "write_stdin": "shell", "shell": "shell", "local_shell": "shell",
        "container.exec": "shell", "unified_exec": "shell", "apply_patch": "write",
        "read_file": "read", "list_dir": "read", "view_image": "read", "grep_files": "search",
        "web_search": "web", "web_fetch": "web", "update_plan": "plan",
        "create_goal": "plan", "update_goal": "plan", "get_goal": "plan",
        "send_input": "subagent", "wait_agent": "subagent", "resume_agent": "subagent", "close_agent": "subagent"})
    plan_tools: PlanTools = PlanTools(snapshots=Table({"update_plan": "$.plan"}), create=("create_goal",),
                                      update=Table({"update_goal": None}))  # one goal active at a time
    subagent_tools: frozenset[str] = frozenset({"spawn_agent"})

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        return Launch([argv[0], *provider_overrides(base_url, session), *argv[1:]], harness_env(base_url, session))

    def _home(self, ctx: RunContext) -> Path:
        return ctx.home / ".codex"

    def _last_message(self, ctx: RunContext) -> Path:
        return ctx.home / "last-message.txt"

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        self._home(ctx).mkdir(parents=True, exist_ok=True)
        argv = [exe, "exec", *provider_overrides(ctx.base_url, ctx.session), "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", "-o", str(self._last_message(ctx)), "-m", self.model(ctx)]
        env = {**harness_env(ctx.base_url, ctx.session), **self.base_env(ctx), "CODEX_HOME": str(self._home(ctx))}
        return [*argv, ctx.prompt], env

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        argv, env = self.command(exe, replace(ctx, prompt=message))
        return [*argv[:2], "resume", "--last", *argv[2:]], env  # `resume` takes exec's options after it

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        return [*argv[:-1], *codex_mcp_overrides(ctx.mcp_servers), argv[-1]], env  # before the prompt

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        path = self._last_message(ctx)
        return path.read_text(encoding="utf-8").strip() if path.exists() else None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        return list((self._home(ctx) / "sessions").rglob("*.jsonl"))


HARNESS = Codex()
