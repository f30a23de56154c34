"""Aiming a command at a recorder session: the pieces every harness's launcher shares.

`harness_env` is what any command gets (the base-URL variables the Anthropic
and OpenAI SDKs read); a harness's own `launch` adds its flags, config files
(under a private `scratch` folder the caller owns and removes, never the
user's HOME) and phone-home switches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

PROVIDER = "forgerl"  # the name every harness config gives the recorder as its model provider


@dataclass
class Launch:
    """A command line and the environment additions that aim it at a session."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


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


def write_json(path: Path, doc: dict) -> Path:
    """A harness config file (keys stay in the environment: configs name the variable, never its value)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    return path


def drop_options(args: list[str], names: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """`args` without the options `names` (`--x V` or `--x=V`), and the values they had."""
    rest, values, i = [], {}, 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in names and eq:
            values[name] = value
        elif name in names and i + 1 < len(args):
            values[name] = args[i + 1]
            i += 1
        else:
            rest.append(args[i])
        i += 1
    return rest, values
