"""The harness spec: one declarative record per harness, and the small types its fields hold.

A harness module holds one `Harness` subclass whose field defaults are
its spec (what the CLI is, where it is found, what it needs, how it is
aimed at the recorder, what gives it away, what its tools do) and whose
methods are what cannot be a table (its command lines, reading its final
answer back). A field that does not apply to a harness says so with
`NotApplicable(reason)`, so the registry's completeness test can tell a
forgotten field from one that has no meaning there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from .context import McpServer, RunContext
from .launch import Launch, harness_env
from .locate import HarnessError, Tool, locate, node_path, runtime_version
from .sqlite_transcript import MAX_TRANSCRIPT_BYTES

ToolKind = Literal["shell", "read", "write", "edit", "search", "web", "plan", "subagent", "verify", "browser",
                   "computer", "other"]
"""What a tool does. The analysis reads today's kinds (shell, read, write, search, web, plan, subagent, other);
edit, verify, browser and computer are the vocabulary's room for the harnesses that will need them."""


class Table(dict):
    """A mapping in a spec: read-only, so a dataclass may take it as a field's default."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

    def _read_only(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a harness spec's table is read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _read_only  # type: ignore[assignment]


@dataclass(frozen=True)
class NotApplicable:
    """A spec field that has no meaning for this harness, and why. False, as an empty value is: `if
    harness.resumes:` reads "if it can resume"."""

    reason: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True)
class Pin:
    """The version the project installs and tests: `registry` is npm, pypi or cargo. `installer` names the
    file that installs it here ("" where nothing does: ZeroClaw, a cargo crate, is not installable here)."""

    registry: Literal["npm", "pypi", "cargo"]
    package: str
    version: str
    installer: str

    def __str__(self) -> str:
        return f"{self.package}=={self.version}" if self.registry == "pypi" else f"{self.package}@{self.version}"


@dataclass(frozen=True)
class Runtime:
    """The interpreter its CLI runs on, and the oldest version it accepts (its package.json `engines`)."""

    name: Literal["node"]
    minimum: tuple[int, ...]

    def check(self, harness: str) -> None:
        """A one-line `HarnessError` naming the version found and the one needed, if the runtime is too old."""
        found, where = runtime_version(self.name)
        needed = ".".join(map(str, self.minimum))
        if found is None:
            raise HarnessError(f"{harness} needs {self.name} >= {needed}, none found ({where})")
        if found < self.minimum:
            raise HarnessError(f"{harness} needs {self.name} >= {needed}, found {'.'.join(map(str, found))} "
                               f"at {where} (set FORGE_NODE, or run `make harnesses` for the pinned Node)")


@dataclass(frozen=True)
class Key:
    """Where the harness takes its API key: the variable it reads, and how it sends it (`header`, with an
    optional `scheme` such as Bearer, or a `query` parameter). `placeholder` is sent when the user gives none."""

    env: str
    header: str
    placeholder: str
    scheme: str = ""
    query: str = ""


OPENAI_KEY = Key("OPENAI_API_KEY", "authorization", "sk-forgerl-placeholder", scheme="Bearer")
"""The OpenAI SDKs' key: `OPENAI_API_KEY`, sent as `Authorization: Bearer`."""


@dataclass(frozen=True)
class Fingerprints:
    """What gives a harness away in a recorded call (`recorder.harness.identify` reads them).

    `user_agents`: lower-case User-Agent fragments. `headers`: (header, value fragment) pairs, lower case, an empty
    fragment meaning "present". `prompts`: phrases its system prompt contains. `tools`: tool sets, each matching
    when all its names are offered (case matters). `precedes`: harnesses whose fingerprints this one's calls also
    match (OpenCode offers pi's four tools), so this one is tried first.
    """

    user_agents: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    prompts: tuple[str, ...] = ()
    tools: tuple[frozenset[str], ...] = ()
    precedes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanTools:
    """Plan tools. `snapshots`: tools that resend the whole list (tool -> JSON path of its items, each with a
    `status`). `create`: tools adding one item a call; `update`: tool -> JSON path of the item id it updates
    (None: the latest item created)."""

    snapshots: Mapping[str, str] = Table()
    create: tuple[str, ...] = ()
    update: Mapping[str, str | None] = Table()


Doc = str | NotApplicable


@dataclass
class Harness:
    """One harness: subclasses set the fields (each a value, or `NotApplicable(reason)`) and implement `command`.

    `cli`: how its executable is found (`locate`). `commands`: the file names `forge-record run -- CMD` knows it
    by. `offline`: the environment switches that stop it phoning home (`NotApplicable` when they live in its
    config file). `headless`, `mcp_wiring`, `resumes`, `transcript`, `final_answer_from`: one line each for the
    `--help` lists and the README's tables.
    """

    name: str = ""
    cli: Tool | NotApplicable | None = None
    runtime: Runtime | NotApplicable | None = None
    pin: Pin | NotApplicable | None = None
    api: str = ""  # the wire API it speaks: anthropic | responses | chat | gemini
    default_model: str | NotApplicable = ""  # what `forge-run` passes when no --model is given
    key: Key | NotApplicable | None = None
    fingerprints: Fingerprints | NotApplicable | None = None
    commands: tuple[str, ...] | NotApplicable = ()
    offline: Mapping[str, str] | NotApplicable | None = None
    headless: Doc = ""
    mcp_wiring: Doc = ""
    resumes: Doc = ""
    transcript: Doc = ""
    final_answer_from: Doc = ""
    tool_kinds: Mapping[str, ToolKind] | NotApplicable | None = None
    plan_tools: PlanTools | NotApplicable | None = None
    subagent_tools: frozenset[str] | NotApplicable | None = None

    def missing(self) -> list[str]:
        """The spec fields left unset (neither a value nor `NotApplicable`)."""
        return [f.name for f in fields(Harness) if getattr(self, f.name) in (None, "", (), {}, frozenset())]

    def find(self) -> str:
        """The CLI's path, its runtime checked; a one-line `HarnessError` saying where it looked otherwise."""
        if isinstance(self.cli, NotApplicable):
            raise HarnessError(f"{self.name} cannot be run here: {self.cli.reason}")
        if isinstance(self.runtime, Runtime):
            self.runtime.check(self.name)
        return locate(self.cli)

    def launch(self, argv: list[str], base_url: str, session: str, scratch: Path) -> Launch:
        """`argv` (a command line the user gave `forge-record run`) aimed at the recorder session; config files it
        can only read from disk go under `scratch`."""
        return Launch(list(argv), {**harness_env(base_url, session), **self.offline_env()})

    def offline_env(self) -> dict[str, str]:
        return dict(self.offline) if isinstance(self.offline, Mapping) else {}

    def command(self, exe: str, ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        """argv and the environment additions for one headless run."""
        raise NotImplementedError

    def resume_command(self, exe: str, ctx: RunContext, message: str) -> tuple[list[str], dict[str, str]]:
        """argv and the environment additions for the next user turn, `message`, in the session the harness's last
        run in this private HOME and workspace left (a simulated user's reply); harnesses that can resume
        override it."""
        raise HarnessError(f"{self.name} cannot resume its session, and a simulated user's dialogue needs it to")

    def full_command(self, exe: str, ctx: RunContext, reply: str | None = None) -> tuple[list[str], dict[str, str]]:
        """`command` (or, with a `reply`, `resume_command`), with the rollout's MCP servers (`ctx.mcp_servers`)
        wired into the harness's own config."""
        argv, env = self.command(exe, ctx) if reply is None else self.resume_command(exe, ctx, reply)
        return self.mcp(argv, env, ctx) if ctx.mcp_servers else (argv, env)

    def mcp(self, argv: list[str], env: dict[str, str], ctx: RunContext) -> tuple[list[str], dict[str, str]]:
        """`argv` and `env` with `ctx.mcp_servers` given to the harness; harnesses with MCP override it."""
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

    def base_env(self, ctx: RunContext) -> dict[str, str]:
        """What every run gets: a private HOME, the runtime's PATH, the user's extra env, the recorder session id,
        and its key (the user's when given, else its placeholder)."""
        env = {"HOME": str(ctx.home), "PATH": node_path(), "FORGE_SESSION_ID": ctx.session, **ctx.env}
        if isinstance(self.key, Key):
            env[self.key.env] = ctx.env.get(self.key.env) or os.environ.get(self.key.env) or self.key.placeholder
        return env

    def model_for(self, given: str) -> str:
        """The model a run passes: `given`, else the harness's default ("" where it picks its own)."""
        return given or (self.default_model if isinstance(self.default_model, str) else "")

    def model(self, ctx: RunContext) -> str:
        return self.model_for(ctx.model)


def write_config(ctx: RunContext, relative: str, text: str) -> None:
    """A harness config file in the rollout's private HOME (keys stay in the environment, off disk)."""
    path = ctx.home / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def last_json_line_field(stdout: str, key: str) -> str | None:
    """`key` of the JSON object on the last line of `stdout` (a headless run's result line), or None."""
    try:
        return json.loads(stdout.strip().splitlines()[-1]).get(key)
    except (json.JSONDecodeError, IndexError, AttributeError):
        return None


__all__ = ["OPENAI_KEY", "Fingerprints", "Harness", "HarnessError", "Key", "McpServer", "NotApplicable", "Pin",
           "PlanTools", "RunContext", "Runtime", "Table", "Tool", "ToolKind"]
