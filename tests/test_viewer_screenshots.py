"""The viewer as a reader sees it: headless Chromium at 1400x1100 over the real server, the layout measured.

On the behaviour fixture (real CLIs' sessions, hand-labelled in
`behaviour_fixtures.py`): a session page's tables stay left of the call panel
and list the tool calls in order; a call page leads with what the call adds
(its new input, then its output), the history it repeats folded to one line,
a system prompt folded to its first line. The PNGs are saved next to the
test's files; FORGERL_UPDATE_DOCS=1 refreshes the one analysis/README.md shows.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest

from behaviour_fixtures import FAILS, FIXTURE, jobs
from conftest import REPO
from test_analysis_report import DevTools
from test_viewer import ViewerProcess, go, in_chromium, until

WIDTH, HEIGHT = 1400, 1100

# Where each table of the session page ends, against the call panel and the page.
LAYOUT = """(() => {
  const side = document.querySelector('.session-side'), detail = document.querySelector('#detail');
  return {width: innerWidth, height: innerHeight, panel: detail.getBoundingClientRect().left,
          tables: [...side.querySelectorAll('table')].map(t => [t.className, t.getBoundingClientRect().right]),
          side_overflow: side.scrollWidth - side.clientWidth,
          page_overflow: document.documentElement.scrollWidth - innerWidth};
})()"""
# The call panel's message blocks a reader sees (not folded away), in page order.
BLOCKS = """(() => [...document.querySelectorAll('#detail .message')].filter(m => m.getClientRects().length)
  .map(m => { const r = m.getBoundingClientRect();
              return {where: m.dataset.where, role: m.classList[1], top: r.top, height: r.height,
                      folded: m.tagName === 'DETAILS' && !m.open, text: m.innerText.slice(0, 300)}; }))()"""
TRAJECTORY = "[...document.querySelectorAll('#trajectory tr.tool')].map(r => [...r.cells].map(c => c.innerText))"
CALLS = "[...document.querySelectorAll('tr.call')].map(r => r.dataset.call)"


async def _shot(dt: DevTools, path: Path) -> None:
    path.write_bytes(base64.b64decode((await dt.send("Page.captureScreenshot", format="png"))["data"]))


async def _browse(ws_url: str, base: str, shots: Path) -> dict:
    import websockets

    async with websockets.connect(ws_url, max_size=None) as ws:
        dt = DevTools(ws)
        for domain in ("Page", "Runtime", "Log"):
            await dt.send(f"{domain}.enable")
        await dt.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                      mobile=False)
        await dt.send("Page.navigate", url=base + "#/session/claude-code")
        await until(dt, "document.body.dataset.ready === '#/session/claude-code'")
        seen: dict = {"session": await until(dt, LAYOUT), "trajectory": await until(dt, TRAJECTORY)}
        await _shot(dt, shots / "viewer-session.png")
        calls = await until(dt, CALLS)

        # the fourth call: a continuation whose new input is the Write's result
        await dt.send("Runtime.evaluate", expression="document.querySelectorAll('tr.call')[3].click()")
        await until(dt, f"document.body.dataset.ready === {json.dumps('#/session/claude-code/call/' + calls[3])}")
        seen["call"] = {"layout": await until(dt, LAYOUT), "blocks": await until(dt, BLOCKS),
                        "folded": await until(dt, "document.querySelector('#history > summary').innerText"),
                        "facts": await until(dt, "document.querySelector('#call-facts').getBoundingClientRect().left")}
        await _shot(dt, shots / "viewer-call.png")
        await dt.send("Runtime.evaluate", expression="document.querySelector('#history > summary').click()")
        seen["call"]["unfolded"] = await until(dt, f"(b => b.some(m => m.where === 'history') && b)({BLOCKS})")

        # the first call: nothing repeated, its system prompt folded to a line
        await go(dt, f"{base}#/session/claude-code/call/{calls[0]}")
        seen["first"] = {"blocks": await until(dt, BLOCKS),
                         "history": await until(dt, "String(document.querySelectorAll('#history').length)")}

        # OpenClaw's calls each start an edited_history segment (continue no call): the fold still finds the
        # history they repeat
        await go(dt, base + "#/session/openclaw")
        seen["openclaw"] = {"layout": await until(dt, LAYOUT), "trajectory": await until(dt, TRAJECTORY)}
        openclaw = await until(dt, CALLS)
        await go(dt, f"{base}#/session/openclaw/call/{openclaw[2]}")
        seen["openclaw"]["blocks"] = await until(dt, BLOCKS)
        seen["openclaw"]["folded"] = await until(dt, "document.querySelector('#history > summary').innerText")
        seen["problems"] = dt.problems()
        return seen


def _fits(layout: dict) -> None:
    assert (layout["width"], layout["height"]) == (WIDTH, HEIGHT)
    assert {name for name, _ in layout["tables"]} >= {"calls", "tools"}, layout
    for name, right in layout["tables"]:  # no table runs under the call panel
        assert right <= layout["panel"], (name, right, layout)
    assert layout["side_overflow"] <= 0 and layout["page_overflow"] <= 0, layout


def _expected(harness: str) -> list[tuple[str, str, str]]:
    """The hand-labelled trajectory: (#, tool as shown, result) per tool call."""
    (job,) = [j for j in jobs() if j.harness == harness]
    out = []
    for n, (call, label) in enumerate(job.acts, 1):
        tool = call.name if call.name != "tool_call" else f"{call.arguments['id']} (via tool_call)"
        out.append((str(n), tool, "failed (exit 1)" if label == FAILS else "ok"))
    return out


def test_session_and_call_pages_at_1400x1100(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(FIXTURE, data)  # opening may upgrade a dataset in place: keep the stored fixture as recorded
    viewer = ViewerProcess(data)
    try:
        seen = in_chromium(_browse, viewer.url, tmp_path)
    finally:
        log = viewer.stop()
    assert "Traceback" not in log and seen["problems"] == []

    # session page: the calls and tool-call tables end left of the call panel, the trajectory reads in order
    _fits(seen["session"])
    shown = [(row[0], row[2], row[5]) for row in seen["trajectory"]]
    assert shown == _expected("claude-code")
    assert [row[1] for row in seen["trajectory"]] == ["1", "2", "3", "4", "5"]  # one tool call per model call
    assert seen["trajectory"][1][3:5] == ["shell · reread", "cat notes.txt"]
    target = seen["trajectory"][2][4]  # a long path keeps its end
    assert target.startswith("…") and target.endswith("code/work/notes.txt"), target

    # call 4: the calls table still clears the call's labels; the first thing to read is the new input
    call = seen["call"]
    _fits(call["layout"])
    assert max(right for name, right in call["layout"]["tables"] if name == "calls") <= call["facts"]
    blocks = call["blocks"]
    assert [b["where"] for b in blocks] == ["new", "output"], blocks
    assert blocks[0]["role"] == "user" and "File created successfully" in blocks[0]["text"]
    assert blocks[0]["top"] < HEIGHT - 300 and blocks[1]["top"] < HEIGHT  # both in the first screen
    assert call["folded"] == "8 earlier messages this call repeats (call 3 sent or got them)"
    unfolded = call["unfolded"]
    assert [b["where"] for b in unfolded] == ["history"] * 8 + ["new", "output"]
    assert unfolded[0]["role"] == "system" and unfolded[0]["folded"] and unfolded[0]["height"] < 40

    # call 1: all new; the system prompt a folded line, the task's text right under it
    first = seen["first"]["blocks"]
    assert seen["first"]["history"] == "0"
    assert [(b["where"], b["role"]) for b in first] == [("new", "system"), ("new", "user"), ("new", "user"),
                                                         ("output", "assistant")]
    assert first[0]["folded"] and first[0]["height"] < 40 and first[2]["top"] < HEIGHT - 300

    openclaw = seen["openclaw"]
    _fits(openclaw["layout"])
    assert [(row[0], row[2], row[5]) for row in openclaw["trajectory"]] == _expected("openclaw")
    assert openclaw["folded"] == "4 earlier messages this call repeats (call 2 sent or got them)"
    assert [b["where"] for b in openclaw["blocks"]][-1] == "output" and openclaw["blocks"][0]["where"] == "new"

    for name in ("viewer-session.png", "viewer-call.png"):
        png = (tmp_path / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 20_000
    if os.environ.get("FORGERL_UPDATE_DOCS"):
        shutil.copy(tmp_path / "viewer-call.png", REPO / "analysis" / "viewer" / "screenshot.png")
