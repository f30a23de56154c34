"""GUI agents' behaviour: browser actions by kind, steps per task, invalid actions, screenshots.

The action vocabulary of the screen-seeing harnesses lives here, one table like `kinds.TOOL_KINDS`:
Playwright MCP's tools (what Claude Code calls, `browser_click`, ...) and browser-use's actions
(what its model lists, `{"action": [{"click_element_by_index": {...}}]}`, in its answer's JSON
text or in an `AgentOutput` tool call; older and newer names). A model turn that answers in text
without calling anything is an `answer`, as is browser-use's `done`. The views are registered by
`views.register` with the others; `screenshot_strip` is the HTML report's strip of one session's screenshots.
"""

from __future__ import annotations

import base64
import html
import io
import json

import duckdb
import pyarrow as pa

from forgerl.errors import UserError
from forgerl.schema import duck

GUI_KINDS: tuple[str, ...] = ("navigate", "click", "type", "scroll", "screenshot", "answer", "other")

ACTION_KINDS: dict[str, str] = {
    # Playwright MCP 0.0.86 (core, tabs and vision capabilities)
    "browser_navigate": "navigate", "browser_navigate_back": "navigate", "browser_navigate_forward": "navigate",
    "browser_tabs": "navigate",
    "browser_click": "click", "browser_hover": "click", "browser_drag": "click", "browser_select_option": "click",
    "browser_mouse_click_xy": "click", "browser_mouse_drag_xy": "click", "browser_mouse_move_xy": "click",
    "browser_type": "type", "browser_press_key": "type", "browser_fill_form": "type", "browser_file_upload": "type",
    "browser_mouse_wheel": "scroll",
    "browser_take_screenshot": "screenshot", "browser_snapshot": "screenshot",
    # browser-use (0.1-0.5 action names, then 0.6+)
    "go_to_url": "navigate", "open_tab": "navigate", "switch_tab": "navigate", "go_back": "navigate",
    "search_google": "navigate", "navigate": "navigate", "search": "navigate", "switch": "navigate",
    "click_element_by_index": "click", "click_element": "click", "click": "click",
    "select_dropdown_option": "click", "get_dropdown_options": "click", "dropdown_options": "click",
    "select_dropdown": "click",
    "input_text": "type", "send_keys": "type", "input": "type", "upload_file": "type",
    "scroll_down": "scroll", "scroll_up": "scroll", "scroll": "scroll", "scroll_to_text": "scroll",
    "find_text": "scroll",
    "screenshot": "screenshot",
    "done": "answer",
}
# browser-use's model answers with one call (or structured text) listing its actions
ACTION_LISTS: tuple[str, ...] = ("AgentOutput",)

_ACTIONS = """
WITH listed AS (  -- browser-use: the actions inside one AgentOutput call, in order
  SELECT session_id, call_id, turn, step, tool_call_id, tool_name AS via,
         unnest(json_extract(try(arguments::JSON), '$.action[*]')) AS item
  FROM tool_calls WHERE tool_name IN (SELECT name FROM gui_action_lists)),
said AS (  -- the text parts of each turn's output, with the action list when the text is browser-use's JSON
  SELECT t.session_id, t.call_id, t.turn, m.text,
         CASE WHEN starts_with(ltrim(m.text), '{') THEN json_extract(try(m.text::JSON), '$.action[*]') END AS items
  FROM turns t JOIN messages m ON m.session_id = t.session_id AND list_contains(t.output_refs, m.part_hash)
  WHERE m.part_type = 'text' AND coalesce(m.text, '') <> ''),
direct AS (
  SELECT session_id, call_id, turn, step, tool_call_id, tool_name AS action, NULL AS via FROM tool_calls
  WHERE tool_name NOT IN (SELECT name FROM gui_action_lists)
  UNION ALL
  SELECT session_id, call_id, turn, step, tool_call_id, json_keys(item)[1] AS action, via FROM listed
  UNION ALL  -- browser-use with structured output: the actions listed in the answer's JSON text
  SELECT session_id, call_id, turn, turn * 100000 + n AS step, NULL AS tool_call_id,
         json_keys(items[n])[1] AS action, 'text' AS via
  FROM (SELECT *, unnest(range(1, len(items) + 1)) AS n FROM said WHERE len(items) > 0)),
answered AS (  -- a turn with output text (not an action list) and no tool call answers
  SELECT session_id, call_id, turn, turn * 100000 AS step, NULL AS tool_call_id, 'answer' AS action, NULL AS via
  FROM said WHERE coalesce(len(items), 0) = 0
    AND NOT EXISTS (SELECT 1 FROM tool_calls c WHERE c.call_id = said.call_id)
  GROUP BY ALL)
SELECT a.session_id, a.call_id, a.turn, a.step, a.tool_call_id, a.action, a.via,
       CASE WHEN a.action = 'answer' THEN 'answer' ELSE coalesce(k.kind, 'other') END AS kind,
       coalesce(r.failed, false) AS invalid
FROM (SELECT * FROM direct UNION ALL SELECT * FROM answered) a
LEFT JOIN gui_action_kinds k ON k.action = a.action
LEFT JOIN tool_results r ON r.session_id = a.session_id AND r.tool_call_id = a.tool_call_id
"""

# images per stored part: the part itself, or those inside a tool result's content
_SCREENSHOTS = """
WITH nested AS (
  SELECT session_id, part_type, blob_hash,
         list_filter(json_extract(part, '$.content[*]'), lambda x: json_extract_string(x, '$.type') = 'image') AS inside
  FROM messages WHERE part_type IN ('image', 'tool_result')),
parts AS (
  SELECT session_id, CASE WHEN part_type = 'image' THEN [blob_hash]
                          ELSE list_transform(inside, lambda x: json_extract_string(x, '$.blob_hash')) END AS hashes,
         CASE WHEN part_type = 'image' THEN 1 ELSE len(inside) END AS images
  FROM nested)
SELECT session_id, sum(images)::BIGINT AS screenshots,
       count(DISTINCT h) FILTER (WHERE h IS NOT NULL) AS distinct_images
FROM (SELECT session_id, images, unnest(CASE WHEN len(hashes) = 0 THEN [NULL] ELSE hashes END) AS h FROM parts)
GROUP BY session_id HAVING sum(images) > 0
"""

_SESSIONS = f"""
WITH acts AS (
  SELECT session_id, count(*) AS actions, count(DISTINCT turn) AS steps,
         count(*) FILTER (WHERE invalid) AS invalid_actions,
         {", ".join(f"count(*) FILTER (WHERE kind = '{k}') AS {k}" for k in GUI_KINDS)}
  FROM gui_actions GROUP BY session_id)
SELECT s.session_id, i.harness, i.model, i.task, a.steps, a.actions, a.invalid_actions,
       a.invalid_actions / a.actions AS invalid_rate, {", ".join(f"a.{k}" for k in GUI_KINDS)},
       s.screenshots, s.distinct_images
FROM gui_screenshots s JOIN acts a USING (session_id) LEFT JOIN session_info i USING (session_id)
"""

_BY_TASK = """
SELECT task, harness, count(*) AS sessions, avg(steps) AS mean_steps, avg(actions) AS mean_actions,
       sum(invalid_actions) / sum(actions) AS invalid_rate, avg(screenshots) AS mean_screenshots
FROM gui_sessions GROUP BY ALL
"""

_BY_KIND = """
SELECT i.harness, a.kind, count(*) AS actions, count(*) FILTER (WHERE a.invalid) AS invalid
FROM gui_actions a JOIN gui_screenshots USING (session_id) LEFT JOIN session_info i USING (session_id)
GROUP BY ALL
"""

VIEWS: tuple[tuple[str, str, str], ...] = (
    ("gui_actions", "every browser action a model took (Playwright MCP tools, browser-use actions, text answers) "
     "with its kind (navigate, click, type, scroll, screenshot, answer, other) and whether its result failed",
     _ACTIONS),
    ("gui_screenshots", "per session with images: image parts sent (screenshots) and distinct images", _SCREENSHOTS),
    ("gui_sessions", "per GUI session (one with images): steps, actions by kind, invalid actions and rate, "
     "screenshots", _SESSIONS),
    ("gui_by_task", "per task and harness: GUI sessions, mean steps and actions, invalid-action rate, mean "
     "screenshots", _BY_TASK),
    ("gui_action_kinds_by_harness", "GUI actions per harness and kind (sessions with images only)", _BY_KIND),
)


def register_tables(con: duckdb.DuckDBPyConnection) -> None:
    """The action vocabulary as lookup tables (`gui_action_kinds`, `gui_action_lists`)."""
    duck.create_table(con, "gui_action_kinds", pa.schema([("action", pa.string()), ("kind", pa.string())]),
                      ACTION_KINDS.items())
    duck.create_table(con, "gui_action_lists", pa.schema([("name", pa.string())]), [(n,) for n in ACTION_LISTS])


def _thumbnail(data: bytes, width: int) -> str | None:
    """A PNG data URL of the image scaled to `width` pixels wide; None for bytes that are not an image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.thumbnail((width, width * 4))
            out = io.BytesIO()
            image.convert("RGB").save(out, format="PNG")
    except (UnidentifiedImageError, OSError, ValueError):
        return None
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def session_images(con: duckdb.DuckDBPyConnection, session_id: str) -> list[dict]:
    """The session's images in the order the harness first sent them: hash, media type, size, bytes (or None)."""
    rows = con.execute("""
        SELECT m.part FROM messages m JOIN calls c USING (call_id)
        WHERE m.session_id = ? AND m.part_type IN ('image', 'tool_result')
        ORDER BY c.t_start, c.seq, list_position(c.input_refs, m.part_hash)""", [session_id]).fetchall()
    images: list[dict] = []
    for (text,) in rows:
        part = json.loads(text)
        images.extend(p for p in [part, *(part.get("content") or [])] if p.get("type") == "image")
    hashes = list(dict.fromkeys(p.get("blob_hash") for p in images if p.get("blob_hash")))
    data = dict(con.execute("SELECT blob_hash, data FROM blobs WHERE session_id = ? AND blob_hash IN "
                            "(SELECT unnest(?::VARCHAR[]))", [session_id, hashes]).fetchall()) if hashes else {}
    return [{**p, "data": data.get(p.get("blob_hash"))} for p in images]


def screenshot_strip(con: duckdb.DuckDBPyConnection, session_id: str, limit: int = 24, width: int = 200) -> str:
    """An HTML strip of a session's screenshots (thumbnails; a box with the size where bytes were not kept)."""
    images = session_images(con, session_id)
    if not images:
        known = con.execute("SELECT count(*) FROM calls WHERE session_id = ?", [session_id]).fetchone()[0]
        raise UserError(f"--screenshots {session_id}: " + ("the session has no images" if known
                                                            else "no such session in the dataset"))
    cells = []
    for n, image in enumerate(images[:limit], 1):
        size = f"{image.get('width', '?')}x{image.get('height', '?')}"
        url = _thumbnail(image["data"], width) if image["data"] else None
        body = (f'<img src="{url}" width="{width}" alt="screenshot {n}">' if url else
                f'<div class="shot-missing" style="width:{width}px">not kept ({html.escape(size)})</div>')
        cells.append(f"<figure class=\"shot\">{body}<figcaption>{n}. {html.escape(size)}</figcaption></figure>")
    shown = f"{min(limit, len(images))} of {len(images)}"
    return (f'<section id="screenshots"><h2>Screenshots: {html.escape(session_id)} ({shown})</h2>'
            f'<div class="strip" style="display:flex;gap:8px;overflow-x:auto">{"".join(cells)}</div></section>')
