"""Screenshot-carrying sessions recorded through `forge-record serve` with real SDK clients.

A GUI agent resends every earlier screenshot in every call. `drive_anthropic` plays Claude Code with
Playwright MCP (screenshots as image blocks inside tool results), `drive_chat` plays browser-use on an
OpenAI-compatible API (screenshots as `image_url` data URLs in user turns); the scripted upstream
issues the browser actions and the answer. Screenshots are PNGs drawn with Pillow, each step's
different (a page with a moving cursor and the step's text).
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

ACTIONS = ("browser_navigate", "browser_click", "browser_type", "browser_mouse_wheel", "browser_take_screenshot")
# browser-use's actions, listed in one AgentOutput call per step
BROWSER_USE_ACTIONS = ("go_to_url", "click_element_by_index", "input_text", "scroll_down")


def screenshot(step: int, size: tuple[int, int] = (640, 400), listing: bool = False) -> bytes:
    """A PNG 'page' for step `step`: header bar, a text line and a cursor whose place depends on the step;
    `listing` fills the page with product rows and thumbnails (PNGs the size of real page screenshots)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, (245, 245, 245))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, size[0], 40), fill=(30, 60, 160))
    draw.text((10, 60), f"Shop - step {step} - results for 'blue mug'", fill=(0, 0, 0))
    for row in range(80, size[1] - 40, 18) if listing else ():
        seed = step * 7919 + row
        draw.rectangle((10, row, 24, row + 14), fill=(seed * 37 % 256, seed * 91 % 256, seed * 53 % 256))
        line = (f"Item {seed % 997}: mug, {seed % 13 + 1} colours, ${seed % 40 + 5}.99, rated {seed % 5 + 1}/5 "
                f"by {seed % 900} buyers - ships in {seed % 9 + 1} days")
        draw.text((30, row), line, fill=(20, 20, 20))
    x, y = 40 + 37 * step % (size[0] - 60), 100 + 23 * step % (size[1] - 120)
    draw.polygon([(x, y), (x + 12, y + 18), (x + 4, y + 16)], fill=(200, 20, 20))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def gui_script(steps: int, browser_use: bool = False, structured: bool = False):
    """The upstream: one browser action per call until `steps` calls, then the answer; `browser_use`: each
    as browser-use's model gives it, an AgentOutput call listing the action (`done` with the answer), or
    with `structured` the same JSON object as the answer's text (structured output)."""
    from scripted_upstream import ToolCall, Turn

    def script(request) -> Turn:
        body = request.body
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        if browser_use:
            last = done + 1 >= steps
            action = {"done": {"text": "The blue mug costs $12.", "success": True}} if last else \
                {BROWSER_USE_ACTIONS[done % len(BROWSER_USE_ACTIONS)]: {"index": done}}
            listed = {"thinking": f"step {done}", "action": [action]}
            return Turn(text=json.dumps(listed)) if structured else Turn(tool_calls=[ToolCall("AgentOutput", listed)])
        if done + 1 >= steps:
            return Turn(text="The blue mug costs $12.")
        name = ACTIONS[done % len(ACTIONS)]
        args: dict[str, Any] = {"url": "http://shop.local/"} if name == "browser_navigate" else {"ref": f"e{done}"}
        return Turn(text="", tool_calls=[ToolCall(name, args)])

    return script


def _tool(name: str) -> dict[str, Any]:
    return {"name": name, "description": f"Playwright MCP {name}",
            "input_schema": {"type": "object", "properties": {"ref": {"type": "string"}, "url": {"type": "string"}}}}


def drive_anthropic(base_url: str, steps: int, size: tuple[int, int] = (640, 400),
                    listing: bool = False, failing: int | None = None) -> int:
    """Claude Code + Playwright MCP's shape: every tool result carries a fresh screenshot, and each call
    resends them all; the result of step `failing` is an error. Returns the request bytes sent."""
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-api03-gui-session-test", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "Find the price of the blue mug."},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": _b64(screenshot(0, size, listing))}}]}]
    sent = 0
    for step in range(1, steps + 1):
        raw = client.messages.with_raw_response.create(model="claude-gui", max_tokens=256, messages=messages,
                                                       tools=[_tool(n) for n in ACTIONS])
        sent += len(raw.http_request.content)
        reply = raw.parse()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            break
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                      "is_error": step == failing, "content": [
            {"type": "text", "text": f"Ran {uses[0].name}. Page snapshot follows."},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": _b64(screenshot(step, size, listing))}}]}]})
    return sent


def _acts(text: str | None) -> bool:
    """Whether an answer's text is browser-use's JSON listing an action other than `done`."""
    try:
        listed = json.loads(text or "")
    except ValueError:
        return False
    return isinstance(listed, dict) and any("done" not in action for action in listed.get("action") or [])


def drive_chat(base_url: str, steps: int, size: tuple[int, int] = (640, 400)) -> int:
    """browser-use's shape on an OpenAI-compatible API: each step's user turn holds the new screenshot as a
    data URL. Returns the request bytes sent."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url + "/v1", api_key="sk-test-gui-session-0000000000", max_retries=0)
    tools = [{"type": "function", "function": {"name": n, "description": f"browser {n}",
                                               "parameters": _tool(n)["input_schema"]}} for n in ACTIONS]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You drive a browser."}]
    sent = 0
    for step in range(steps):
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(screenshot(step, size))}}
        text = "Find the blue mug's price." if step == 0 else f"Step {step}: current page."
        messages.append({"role": "user", "content": [{"type": "text", "text": text}, image]})
        raw = client.chat.completions.with_raw_response.create(model="gui-chat", messages=messages, tools=tools)
        sent += len(raw.http_request.content)
        message = raw.parse().choices[0].message
        back: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        if message.tool_calls:
            back["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                  for c in message.tool_calls]
        messages.append(back)
        if message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "ok"})
        elif not _acts(message.content):
            break
    return sent
