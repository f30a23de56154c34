"""A ClawEval task's tools as an MCP server (stdio, the `mcp` SDK), backed by the task's `tool_endpoints`.

    python -m forgerl.runners.kinds.claweval_mcp TASK_YAML

The harness starts it (each adapter writes it into its harness's MCP config,
`RunContext.mcp_servers`) inside the rollout's sandbox, where the task's
mock services listen on their declared ports. It lists the task's `tools`
with their own names, descriptions and input schemas, and runs each call
through ClawEval's own dispatcher (`claw_eval.runner.dispatcher.ToolDispatcher`):
the arguments as the JSON body of the endpoint's request, the service's JSON
answer as the result text, an error result at HTTP status >= 400. Arguments
are not validated against the schema first, as ClawEval does not.
"""

from __future__ import annotations

import os
import sys
import uuid

import anyio
from claw_eval.models.content import ToolUseBlock
from claw_eval.models.task import TaskDefinition
from claw_eval.runner.dispatcher import ToolDispatcher
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from .claweval_trace import SERVER_NAME

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def build_server(task: TaskDefinition) -> Server:
    server: Server = Server(SERVER_NAME)
    dispatcher = ToolDispatcher(task.get_endpoint_map())
    tools = [types.Tool(name=t.name, description=t.description, inputSchema=t.input_schema or {"type": "object"})
             for t in task.tools]

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return tools

    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict) -> types.CallToolResult:
        use = ToolUseBlock(id=f"call_{uuid.uuid4().hex[:12]}", name=name, input=arguments or {})
        result, _ = await anyio.to_thread.run_sync(dispatcher.dispatch, use, "forgerl")
        return types.CallToolResult(content=[types.TextContent(type="text", text=b.text) for b in result.content],
                                    isError=result.is_error)

    return server


async def serve(task: TaskDefinition) -> None:
    server = build_server(task)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m forgerl.runners.kinds.claweval_mcp TASK_YAML", file=sys.stderr)
        return 2
    for name in PROXY_VARIABLES:  # the services are on loopback, in the rollout's own network namespace
        os.environ.pop(name, None)
    anyio.run(serve, TaskDefinition.from_yaml(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
