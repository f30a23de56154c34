"""A rollout's stdio MCP servers (`RunContext.mcp_servers`) in each harness's own config format.

One function per format; each harness's `mcp` method puts its format where
its harness reads it (a flag, a `-c` override, a settings file, a config
variable), and its `mcp_wiring` says so for `forge-run --help`.
"""

from __future__ import annotations

import json
from pathlib import Path

from .context import McpServer

STARTUP_TIMEOUT_S = 60  # a Python MCP server importing its SDK on a busy 2-core machine takes seconds


def stdio_entry(server: McpServer) -> dict:
    """`{command, args, env}`: what Claude Code, Gemini CLI, Qwen Code and OpenClaw all accept for a stdio server."""
    return {"command": server.command[0], "args": list(server.command[1:]), "env": dict(server.env)}


def claude_code_config(servers: tuple[McpServer, ...]) -> dict:
    """Claude Code's `--mcp-config` file."""
    return {"mcpServers": {s.name: {"type": "stdio", **stdio_entry(s)} for s in servers}}


def codex_mcp_overrides(servers: tuple[McpServer, ...]) -> list[str]:
    """Codex's `-c mcp_servers.NAME.*` overrides (TOML values: JSON strings and arrays are valid TOML). `required`:
    Codex 0.171 otherwise leaves out the tools of a server not ready when the first turn starts."""
    flags: list[str] = []
    for s in servers:
        env = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in s.env.items())
        for key, value in (("command", json.dumps(s.command[0])), ("args", json.dumps(list(s.command[1:]))),
                           ("env", f"{{{env}}}"), ("startup_timeout_sec", str(STARTUP_TIMEOUT_S)),
                           ("required", "true")):
            flags += ["-c", f"mcp_servers.{s.name}.{key}={value}"]
    return flags


def gemini_mcp(servers: tuple[McpServer, ...]) -> dict:
    """The `mcpServers` of Gemini CLI's (and Qwen Code's) `settings.json`; trusted, so headless runs never ask."""
    return {"mcpServers": {s.name: {**stdio_entry(s), "trust": True, "timeout": STARTUP_TIMEOUT_S * 1000}
                           for s in servers}}


def opencode_mcp(servers: tuple[McpServer, ...]) -> dict:
    """The `mcp` block of OpenCode's config."""
    return {"mcp": {s.name: {"type": "local", "command": list(s.command), "environment": dict(s.env),
                             "enabled": True, "timeout": STARTUP_TIMEOUT_S * 1000} for s in servers}}


def openclaw_mcp(servers: tuple[McpServer, ...]) -> dict:
    """The `mcp.servers` block of OpenClaw's `openclaw.json`."""
    return {"mcp": {"servers": {s.name: {**stdio_entry(s), "connectionTimeoutMs": STARTUP_TIMEOUT_S * 1000}
                                for s in servers}}}


def merged_into(path: Path, block: dict) -> None:
    """Add `block`'s top-level keys to the JSON config at `path` (created if missing)."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**doc, **block}, indent=2))
