"""One rollout as a harness sees it, and the MCP servers it is given."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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
    mcp_servers: tuple[McpServer, ...] = ()  # each harness writes them into its own MCP config
