"""GUI views of the analysis: actions by kind, steps, invalid actions, screenshots, and the report's strip.

Two sessions recorded through `forge-record serve`: Claude Code + Playwright MCP's shape (tool calls,
screenshots in tool results, one failing action) and browser-use's (its action listed in an
AgentOutput call, or in the answer's JSON text, per step; screenshots as data URLs; `done` answers).
"""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from forgerl.analysis import connect
from forgerl.analysis.cli import main as analyze

from conftest import RecorderProcess, session_calls
from gui_sessions import drive_anthropic, drive_chat, gui_script, screenshot


@pytest.fixture(scope="module")
def gui_root(tmp_path_factory):
    from scripted_upstream import ScriptedUpstream

    root = tmp_path_factory.mktemp("gui-analysis") / "data"
    with ScriptedUpstream(gui_script(6)) as claude, ScriptedUpstream(gui_script(5, browser_use=True)) as bu, \
            ScriptedUpstream(gui_script(5, browser_use=True, structured=True)) as json_bu:
        rec = RecorderProcess(root, claude.url, "--upstream-openai", bu.url).start()
        json_rec = RecorderProcess(root, json_bu.url).start()
        try:
            drive_anthropic(rec.base("playwright"), 6, failing=2)
            drive_chat(rec.base("browser-use"), 5)
            drive_chat(json_rec.base("browser-use-json"), 5)
            session_calls(root, "playwright", 6)
            session_calls(root, "browser-use", 5)
            session_calls(root, "browser-use-json", 5)
        finally:
            rec.stop()
            json_rec.stop()
    return root


def test_actions_by_kind_steps_invalid_rate_and_screenshots(gui_root):
    con = connect(gui_root)
    kinds = {(s, k): n for s, k, n in con.sql("SELECT session_id, kind, count(*) FROM gui_actions GROUP BY ALL")
             .fetchall()}
    assert kinds == {("playwright", "navigate"): 1, ("playwright", "click"): 1, ("playwright", "type"): 1,
                     ("playwright", "scroll"): 1, ("playwright", "screenshot"): 1, ("playwright", "answer"): 1,
                     ("browser-use", "navigate"): 1, ("browser-use", "click"): 1, ("browser-use", "type"): 1,
                     ("browser-use", "scroll"): 1, ("browser-use", "answer"): 1,
                     **{("browser-use-json", k): 1 for k in ("navigate", "click", "type", "scroll", "answer")}}
    sessions = {r[0]: r[1:] for r in con.sql(
        "SELECT session_id, steps, actions, invalid_actions, invalid_rate, screenshots, distinct_images "
        "FROM gui_sessions").fetchall()}
    assert sessions["playwright"] == (6, 6, 1, pytest.approx(1 / 6), 6, 6)
    assert sessions["browser-use"] == sessions["browser-use-json"] == (5, 5, 0, 0.0, 5, 5)
    (failed,) = con.sql("SELECT action FROM gui_actions WHERE invalid").fetchall()
    assert failed == ("browser_click",)  # step 2's result was an error
    by_task = con.sql("SELECT harness, mean_steps, invalid_rate FROM gui_by_task ORDER BY harness").fetchall()
    assert [(h, s) for h, s, _ in by_task] == [("anthropic-python", 6.0), ("openai-python", 5.0)]  # 2 sessions


def test_report_shows_a_sessions_screenshot_strip(gui_root, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert analyze(["report", str(gui_root), "--out", str(out), "--screenshots", "playwright"]) == 0
    page = out.read_text()
    strip = page[page.index('<section id="screenshots">'):page.index("</section>")]
    urls = [chunk[:chunk.index('"')] for chunk in strip.split('src="')[1:]]
    thumbs = [base64.b64decode(url.split(",", 1)[1]) for url in urls]
    assert len(thumbs) == 6 and "(6 of 6)" in strip and "640x400" in strip
    assert Image.open(io.BytesIO(thumbs[0])).size == (200, 125)  # 640x400 scaled to the strip's width
    assert len({*thumbs}) == 6 and screenshot(0) not in thumbs
    capsys.readouterr()
    assert analyze(["report", str(gui_root), "--out", str(out), "--screenshots", "nope"]) == 2
    assert "no such session" in capsys.readouterr().err
