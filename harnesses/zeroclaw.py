"""ZeroClaw (Rust; `cargo install zeroclaw`, not installable on these machines).

Configure: `config.toml` in its config folder (`~/.zeroclaw`, or
`$ZEROCLAW_CONFIG_DIR`) with `default_provider = "custom:<recorder>/s/<session>/v1"`
(OpenAI chat; `"anthropic-custom:<recorder>/s/<session>"` would be Anthropic
Messages) and `default_model`. Headless: `zeroclaw agent -m PROMPT`. The
runner writes the config in the rollout's private HOME, `forge-record run`
in a scratch folder it names in `ZEROCLAW_CONFIG_DIR`; running it needs
`zeroclaw` found (PATH, `FORGE_ZEROCLAW`, the tools config).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .launch import Launch, drop_options, harness_env, session_root
from .locate import Tool
from .spec import OPENAI_KEY, Fingerprints, Harness, Key, NotApplicable, Pin, RunContext, Table, write_config


def zeroclaw_config(base_url: str, session: str, model: str) -> str:
    """Its `config.toml`: the recorder session as a custom OpenAI-compatible provider (the key comes from the
    environment, never from disk)."""
    return (f'default_provider = "custom:{session_root(base_url, session)}/v1"\n'
            f'default_model = "{model}"\n')


@dataclass
class ZeroClaw(Harness):
    name: str = "zeroclaw"
    cli: Tool = Tool("zeroclaw", "zeroclaw", "")
    runtime: NotApplicable = NotApplicable("a Rust binary")
    pin: Pin = Pin("cargo", "zeroclaw", "latest", "")
    api: str = "chat"
    default_model: NotApplicable = NotApplicable("its config's default_model: --model, else `policy`")
    key: Key = OPENAI_KEY
    fingerprints: Fingerprints = Fingerprints(
        user_agents=("zeroclaw",),
        prompts=("The following workspace files define your identity, behavior, and context.",),
        tools=(frozenset({"shell", "file_read", "file_write"}),))
    commands: tuple[str, ...] = ("zeroclaw",)
    offline: NotApplicable = NotApplicable("unknown: not installable here, never run by the suite")
    headless: str = "`zeroclaw agent -m …`"
    mcp_wiring: NotApplicable = NotApplicable("no MCP client wired: tasks with MCP tools cannot run in it")
    resumes: NotApplicable = NotApplicable("cannot resume (not wired): tasks with a simulated user cannot run in it")
    transcript: NotApplicable = NotApplicable("not collected")
    final_answer_from: str = "stdout"
    tool_kinds: Table = Table({"shell": "shell", "file_read": "read", "file_write": "write", "http_request": "web",
                               "memory_search": "search"})
    plan_tools: NotApplicable = NotApplicable("none known")
    subagent_tools: frozenset[str] = frozenset({"delegate"})

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        """Its config folder in `scratch` (`ZEROCLAW_CONFIG_DIR`); `--model M` is kept and also names the config's
        default model."""
        _, given = drop_options(argv[1:], ("--model",))
        folder = scratch / "zeroclaw"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.toml").write_text(zeroclaw_config(base_url, session, given.get("--model", "policy")))
        return Launch(list(argv), {**harness_env(base_url, session), "ZEROCLAW_CONFIG_DIR": str(folder)})

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        write_config(ctx, ".zeroclaw/config.toml", zeroclaw_config(ctx.base_url, ctx.session, ctx.model or "policy"))
        return [exe, "agent", "-m", ctx.prompt], self.base_env(ctx)


HARNESS = ZeroClaw()
