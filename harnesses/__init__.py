"""Harnesses: one module each, holding its spec; the registry derives every table from them.

Imports only the top package (`forgerl`) and the standard library, so every
other folder may import it. See README.md here for how to add a harness.
"""

from __future__ import annotations

from .context import McpServer, RunContext
from .launch import Launch, harness_env, session_root
from .locate import HarnessError, Tool, locate, node_path, project_root
from .registry import (FINGERPRINTS, HARNESSES, LAUNCHERS, PLAN_CREATE, PLAN_SNAPSHOTS, PLAN_UPDATE, SUBAGENT_TOOLS,
                       TOOL_KINDS, get_harness, launch, mcp_help, pins, readme_table, recorded_commands, resume_help)
from .spec import Fingerprints, Harness, Key, NotApplicable, Pin, PlanTools, Runtime, Table

__all__ = ["FINGERPRINTS", "HARNESSES", "LAUNCHERS", "PLAN_CREATE", "PLAN_SNAPSHOTS", "PLAN_UPDATE", "SUBAGENT_TOOLS",
           "TOOL_KINDS", "Fingerprints", "Harness", "HarnessError", "Key", "Launch", "McpServer", "NotApplicable",
           "Pin", "PlanTools", "RunContext", "Runtime", "Table", "Tool", "get_harness", "harness_env", "launch",
           "locate", "mcp_help", "node_path", "pins", "project_root", "readme_table", "recorded_commands",
           "resume_help", "session_root"]
