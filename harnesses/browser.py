"""The browser that the screen-seeing harnesses drive: Debian's Chromium, directly (browser-use, over CDP) or
through `@playwright/mcp` for harnesses that take MCP servers (Claude Code, Codex, Gemini CLI, ...)."""

from __future__ import annotations

from pathlib import Path

from .context import McpServer
from .locate import HarnessError, Tool, locate

CHROMIUM = Path("/usr/bin/chromium")  # Debian's `chromium` package (make test's `browser` target)
PLAYWRIGHT = Tool("playwright-mcp", "playwright-mcp", "node_modules/.bin/playwright-mcp")


def _playwright_mcp() -> str:
    """Its executable where found now, else its bare name (the rollout's PATH is then the last chance)."""
    try:
        return locate(PLAYWRIGHT)
    except HarnessError:
        return PLAYWRIGHT.on_path


PLAYWRIGHT_MCP = McpServer("playwright", (_playwright_mcp(), "--headless", "--isolated", "--no-sandbox",
                                          "--executable-path", str(CHROMIUM), "--caps", "vision",
                                          "--image-responses", "allow", "--viewport-size", "1024x768"))
"""`@playwright/mcp` (pinned in package.json, run on the project's Node 24) driving Chromium headless with an
in-memory profile, its vision capability (coordinate clicks) on and image responses allowed:
`browser_take_screenshot` answers with the image itself, so screenshots reach the model as image tool results.
A web task offers it as its MCP server; a harness with a browser of its own (browser-use) leaves it out."""
