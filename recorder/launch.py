"""How `forge-record run` and the runners aim a harness at a recorder session URL.

One launcher per harness CLI, found by the command's file name in
`LAUNCHERS`. A launcher returns the harness's own flags and environment that
point it at `<recorder>/s/<session>`. Config files a harness can only read
from disk go under `scratch`, a private directory the caller owns and
removes, never the user's HOME. Commands nobody knows get `harness_env`
alone: the base-URL variables that the Anthropic and OpenAI SDKs read.

Adding a harness: one function here and one row in `LAUNCHERS`, one adapter
in `runners/harnesses/`, one row of fingerprints in `recorder/harness.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Launch:
    """A command line and the environment additions that aim it at a session."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


Launcher = Callable[[list[str], str, str, Path], Launch]


def session_root(base_url: str, session: str) -> str:
    """The session's URL on the recorder: every API path goes under it."""
    return f"{base_url}/s/{session}"


def harness_env(base_url: str, session: str) -> dict[str, str]:
    """Environment that points Claude Code and OpenAI-SDK clients at the recorder."""
    root = session_root(base_url, session)
    return {
        "ANTHROPIC_BASE_URL": root,
        "OPENAI_BASE_URL": f"{root}/v1",
        "FORGE_SESSION_ID": session,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def codex_overrides(base_url: str, session: str) -> list[str]:
    """`-c` flags that give Codex a provider pointing at the recorder over SSE."""
    provider = (f'{{name="forgerl", base_url="{session_root(base_url, session)}/v1", wire_api="responses", '
                f'env_key="OPENAI_API_KEY"}}')
    return ["-c", f"model_providers.forgerl={provider}", "-c", "model_provider=forgerl"]


def codex(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    return Launch([argv[0], *codex_overrides(base_url, session), *argv[1:]], harness_env(base_url, session))


def claude_code(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    return Launch(list(argv), harness_env(base_url, session))


def mini_swe_agent_env(base_url: str, session: str, scratch: Path) -> dict[str, str]:
    """mini-swe-agent (litellm): the OpenAI base URL, no first-run setup prompt, its global config
    (`.env`, last trajectory) in `scratch`, no cost lookup for an unpriced model, and litellm's model
    cost map read from the package instead of fetched from GitHub at import."""
    root = session_root(base_url, session)
    return {**harness_env(base_url, session), "OPENAI_API_BASE": f"{root}/v1", "MSWEA_CONFIGURED": "true",
            "MSWEA_GLOBAL_CONFIG_DIR": str(scratch / "mini-swe-agent"), "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def mini_swe_agent(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    return Launch(list(argv), mini_swe_agent_env(base_url, session, scratch))


LAUNCHERS: dict[str, Launcher] = {
    "claude": claude_code,
    "codex": codex,
    "mini": mini_swe_agent,
}


def launch(argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
    """`argv` aimed at the session: its harness's launcher, else the SDK base-URL variables."""
    launcher = LAUNCHERS.get(Path(argv[0]).name)
    if launcher is None:
        return Launch(list(argv), harness_env(base_url, session))
    return launcher(argv, base_url, session, scratch)
