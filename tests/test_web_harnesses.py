"""Screen-seeing harnesses end to end on the web benchmark: browser-use and Claude Code with Playwright MCP each
run two web tasks through `forge-run` (the apps served in each rollout's sandbox, the Debian Chromium driven
headless) against a scripted upstream that reads the page it is shown and issues the clicks, typing and
answer: it solves the shop search (typing "kettle", answering what the results page showed) and fails the trip
cancellation (it cancels the wrong booking). The task's checks grade them 1.0 and 0.0 from the apps' state;
the recorded screenshots are stored once per session and the VL rows load through veRL with the ids of
`tokens` (`vl_checks`)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from forgerl.runners.grading import GradeInput
from forgerl.runners.kinds.web import browser_actions
from forgerl.schema.store import read_table

from harness_checks import FORGE_RUN, needs
from scripted_upstream import Request, ScriptedUpstream, ToolCall, Turn
from vl_checks import check_vl_dataset
from web_fixtures import WEB_BENCH, served

pytestmark = pytest.mark.slow

SOLVED, FAILED = "shop-cheapest-kettle", "travel-cancel-trip"
KETTLE = ("Classic Stovetop Kettle", "$39.95")
ANSWER = f"The cheapest kettle in stock is the {KETTLE[0]}, at {KETTLE[1]}."


def body_text(request: Request) -> str:
    return json.dumps(request.body)


def run_web_tasks(harness: str, script, out, *args: str) -> dict[str, dict]:
    """`forge-run benchmarks/web` of the two tasks with `harness` against `script`: outcome rows by task."""
    with ScriptedUpstream(script) as up:
        r = subprocess.run([FORGE_RUN, str(WEB_BENCH), "--task", SOLVED, "--task", FAILED, "--harness", harness,
                            "--upstream", up.url, "--parallel", "2", "--retries", "0", "--out", str(out), *args],
                           capture_output=True, text=True, timeout=500, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return {row["task_id"]: row for row in read_table(out, "outcomes").to_pylist()}


def check_graded(rows: dict[str, dict], harness: str, data: Path, work: Path, actions: list[str]) -> dict[str, int]:
    """The solved task graded 1.0 (passes), the failed one 0.0; the trajectory the checks see holds `actions`;
    the recording's screenshots are stored once per session, and its VL rows load through veRL with the
    `tokens` rows' ids: what `check_vl_dataset` counted."""
    solved, failed = rows[SOLVED], rows[FAILED]
    turns = GradeInput(data, solved["session_id"], data).turns
    assert [a["name"] for turn in turns for a in browser_actions(turn)] == actions
    assert (solved["harness"], solved["status"], solved["reward"]) == (harness, "success", 1.0), solved["error"]
    assert json.loads(solved["extra"])["final_answer"] == ANSWER
    assert (failed["status"], failed["reward"]) == ("failed", 0.0), failed["error"]
    assert json.loads(failed["scores"]) == {"KX7P2Q cancelled": 0.0, "other trips untouched": 0.0}
    counts = check_vl_dataset(data, work)
    assert counts["blobs"] >= 1 and counts["samples_with_images"] >= 1, counts
    return counts


# --- browser-use: Chat Completions, each answer a JSON object whose `action` list holds the step's actions ---


def bu_index(page: str, pattern: str) -> int:
    """The index browser-use gave the element whose serialisation matches `pattern` (`[12]<input name=q />`)."""
    found = re.search(r"\[(\d+)\]<" + pattern, page)
    assert found, f"no element {pattern!r} on the page shown:\n{page[-3000:]}"
    return int(found.group(1))


def bu_turn(*actions: dict) -> Turn:
    return Turn(text=json.dumps({"thinking": "", "evaluation_previous_goal": "", "memory": "", "next_goal": "",
                                 "action": list(actions)}))


def browser_use_script(request: Request) -> Turn:
    messages = request.body["messages"]
    last = messages[-1]["content"]
    parts = last if isinstance(last, list) else [{"type": "text", "text": last}]
    page = "".join(p.get("text", "") for p in parts)
    step = int(re.search(r"<step_info>Step(\d+)", page).group(1)) - 1  # each step's request is built afresh
    assert step == 0 or any(p.get("type") == "image_url" for p in parts), "no screenshot in the step's message"
    if "8101" in json.dumps(messages[1]):  # the shop: type "kettle", tick "in stock", search, answer
        if step == 0:
            return bu_turn({"navigate": {"url": "http://127.0.0.1:8101/"}})
        if step == 1:
            return bu_turn({"input": {"index": bu_index(page, "input name=q"), "text": "kettle"}},
                           {"click": {"index": bu_index(page, "input type=checkbox name=in_stock")}},
                           {"click": {"index": bu_index(page, r"button type=submit />\s*Search")}})
        shown = KETTLE[0] in page and "Compact Travel Kettle" not in page
        return bu_turn({"done": {"text": ANSWER if shown else "Not found.", "success": True}})
    if step == 0:  # SkyHop: open the wrong trip, cancel it
        return bu_turn({"navigate": {"url": "http://127.0.0.1:8102/trips"}})
    if step == 1:
        return bu_turn({"click": {"index": bu_index(page, r"a />\s*RB4M9T")}})
    if step == 2:
        return bu_turn({"click": {"index": bu_index(page, r"button type=submit />\s*Cancel booking")}})
    return bu_turn({"done": {"text": "Cancelled.", "success": True}})


def test_browser_use(tmp_path):
    rows = run_web_tasks("browser-use", browser_use_script, tmp_path / "data", "--model", "gpt-test")
    counts = check_graded(rows, "browser-use", tmp_path / "data", tmp_path / "vl",
                          ["navigate", "input", "click", "click", "done"])
    assert counts["blobs"] >= 5  # a new screenshot in every step's request after the first


# --- Claude Code + Playwright MCP: Anthropic Messages, tool calls to mcp__playwright__*, screenshots as images ---

PW = "mcp__playwright__"


def tool_results(request: Request) -> list[dict]:
    return [c for m in request.body.get("messages", []) if isinstance(m.get("content"), list)
            for c in m["content"] if c.get("type") == "tool_result"]


def ref(page: str, pattern: str) -> str:
    found = re.search(pattern + r"[^\n]*\[ref=(\w+)\]", page)
    assert found, f"no element {pattern!r} in the snapshot:\n{page[-3000:]}"
    return found.group(1)


def result_text(result: dict) -> str:
    content = result.get("content")
    return content if isinstance(content, str) else "".join(c.get("text", "") for c in content or [])


def claude_script(request: Request) -> Turn:
    tools = [t["name"] for t in request.body.get("tools", [])]
    if f"{PW}browser_navigate" not in tools:
        return Turn(text="ok")  # Claude Code's side calls (titles, checks)
    pages = [result_text(r) for r in tool_results(request)]
    step, page = len(pages), pages[-1] if pages else ""
    snapshot = ToolCall(f"{PW}browser_snapshot", {})  # actions answer with a link to a file; this one inline
    if "8101" in json.dumps(request.body["messages"][0]):
        if step == 0:
            return Turn(tool_calls=[ToolCall(f"{PW}browser_navigate", {"url": "http://127.0.0.1:8101/"})])
        if step in (1, 4, 6):
            return Turn(tool_calls=[snapshot])
        if step == 2:
            return Turn(tool_calls=[ToolCall(f"{PW}browser_click", {"element": "In stock only",
                                                                     "target": ref(page, 'checkbox "In stock only"')})])
        if step == 3:
            return Turn(tool_calls=[ToolCall(f"{PW}browser_type", {"element": "Search box", "text": "kettle",
                                                                    "target": ref(pages[1], 'textbox "Search"'),
                                                                    "submit": True})])
        if step == 5:
            return Turn(tool_calls=[ToolCall(f"{PW}browser_take_screenshot", {"type": "png"})])
        (screenshot,) = tool_results(request)[5]["content"][1:]
        assert screenshot["type"] == "image", "the screenshot did not come back as an image"
        shown = KETTLE[0] in pages[4] and "Compact Travel Kettle" not in pages[4]
        return Turn(text=ANSWER if shown else "Not found.")
    if step == 0:
        return Turn(tool_calls=[ToolCall(f"{PW}browser_navigate", {"url": "http://127.0.0.1:8102/trips"})])
    if step in (1, 3):
        return Turn(tool_calls=[snapshot])
    if step == 2:
        return Turn(tool_calls=[ToolCall(f"{PW}browser_click", {"element": "RB4M9T",
                                                                 "target": ref(page, 'link "RB4M9T"')})])
    if step == 4:
        return Turn(tool_calls=[ToolCall(f"{PW}browser_click", {"element": "Cancel booking",
                                                                 "target": ref(page, 'button "Cancel booking"')})])
    return Turn(text="Cancelled.")


def test_claude_code_playwright_mcp(tmp_path):
    needs("claude")
    rows = run_web_tasks("claude-code", claude_script, tmp_path / "data")
    counts = check_graded(rows, "claude-code", tmp_path / "data", tmp_path / "vl",
                          [f"{PW}browser_{name}" for name in ("navigate", "snapshot", "click", "type", "snapshot",
                                                               "take_screenshot", "snapshot")])
    assert counts["blobs"] == 1
    images = {r["part_hash"] for r in read_table(tmp_path / "data", "messages").to_pylist() if '"image"' in r["part"]}
    sent = [c for c in read_table(tmp_path / "data", "calls").to_pylist() if images & set(c["input_refs"])]
    assert len(sent) >= 2, "the screenshot was not resent"  # resent with every later call, stored once


def test_browser_use_phones_nothing_home(tmp_path):
    """Outside a sandbox (`forge-record run`), every proxy variable at a trap: browser-use asks nothing of anyone
    but the recorder (its telemetry, cloud sync and version check are off). Debian's Chromium itself, which
    ships Google API keys (/etc/chromium.d/apikeys), still calls Google's update, network-time and sign-in
    services and preconnects to its default search engine whatever browser-use's flags say; in a `forge-run`
    rollout's network namespace those find nothing to reach."""
    from forgerl.harnesses import get_harness
    from forgerl.harnesses.browser_use import BROWSER_USE_OFFLINE, CLI

    from harness_checks import record_trapped
    from web_fixtures import load_app

    def script(request: Request) -> Turn:
        page = json.dumps(request.body["messages"][-1]["content"])
        if "Step1 " in page:
            return bu_turn({"navigate": {"url": url}})
        return bu_turn({"done": {"text": "Leaf & Kettle" if "Leaf & Kettle" in page else "?", "success": True}})

    with served(load_app("shop")) as url:
        cmd = [get_harness("browser-use").find(), "-P", str(CLI), "--task", f"Open {url}", "--model", "gpt-test",
               "--history", str(tmp_path / "history.json"), "--viewport", "640x480"]
        run = record_trapped(tmp_path, "bu-trap", script, cmd, {**BROWSER_USE_OFFLINE, "OPENAI_API_KEY": "sk-test"})
    assert run["run"].returncode == 0, run["run"].stderr[-3000:]
    assert json.loads(run["run"].stdout.strip().splitlines()[-1])["result"] == "Leaf & Kettle"
    chromium = ("google.com", "googleapis.com", "duckduckgo.com")
    # Chromium also preconnects to the proxy and closes or idles without a request line: no destination asked.
    asked = [hit for hit in run["hits"] if hit not in ("", "TimeoutError('timed out')")]
    targets = [(hit.split()[1:2] or [hit])[0] for hit in asked]  # "CONNECT host:443 HTTP/1.1" -> host:443
    assert all(any(host in target for host in chromium) for target in targets), run["hits"]
    assert set(run["paths"]) == {"/v1/chat/completions"}, run["paths"]
