"""`forge-analyze view`: the real server as a subprocess, its JSON over HTTP, and the page in headless Chromium.

Datasets: the converter tests' Qwen3 chat sessions (engine token ids from a
vLLM-like upstream, recorded through `forge-record serve`) plus one image
call recorded the same way, and the bundled analysis example (graded
outcomes, Claude Code- and Codex-like sessions). The layout at 1400x1100 and
the screenshot analysis/README.md shows: `test_viewer_screenshots.py`.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from conftest import REPO, RecorderProcess, session_calls
from convert_fixtures import TOKENIZER_DIR, chat_dataset  # noqa: F401 - fixture
from gui_sessions import drive_anthropic, screenshot
from scripted_upstream import ScriptedUpstream
from test_analysis_report import DevTools, _chromium

from forgerl.analysis import connect

EXAMPLE = REPO / "analysis" / "example"
FORGE_ANALYZE = str(Path(sys.executable).with_name("forge-analyze"))


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (48, 32), (200, 40, 40)).save(buf, format="PNG")
    return buf.getvalue()


class ViewerProcess:
    """`forge-analyze view` on a free port; `url` once it says where it listens."""

    def __init__(self, dataset: Path, *extra: str):
        self.proc = subprocess.Popen([FORGE_ANALYZE, "view", str(dataset), "--listen", "127.0.0.1:0", *extra],
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        match = re.search(r"at (http://\S+) ", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"forge-analyze view did not start: {line}{self.proc.stderr.read()}")
        self.url = match.group(1)

    def get(self, path: str) -> tuple[int, bytes, str]:
        try:
            with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=60) as r:
                return r.status, r.read(), r.headers["Content-Type"]
        except urllib.error.HTTPError as e:
            return e.code, e.read(), e.headers["Content-Type"]

    def json(self, path: str) -> dict:
        status, body, _ = self.get(path)
        assert status == 200, (path, body)
        return json.loads(body)

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        return self.proc.stderr.read()


@pytest.fixture(scope="module")
def upstream():
    """The scripted upstream the viewer's sessions are recorded against; its log holds what each call sent."""
    with ScriptedUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def chat_data(chat_dataset, upstream, tmp_path_factory) -> Path:  # noqa: F811 - the imported fixture
    """The chat sessions plus `chat-image`: a user image through the openai SDK, and two GUI sessions
    (Claude Code + Playwright MCP's shape, a 640x400 screenshot), `gui-keep` recorded with the images' bytes
    and `gui-hash` with `--images hash-only`, recorded into a copy."""
    from openai import OpenAI

    root = tmp_path_factory.mktemp("viewer") / "data"
    shutil.copytree(chat_dataset, root)
    for images, sessions in (("keep", ("chat-image", "gui-keep")), ("hash-only", ("gui-hash",))):
        rec = RecorderProcess(root, upstream.url, "--images", images).start()
        try:
            for session in sessions:
                if session == "chat-image":
                    client = OpenAI(base_url=rec.base(session) + "/v1", api_key="sk-test-viewer-0000000000",
                                    max_retries=0)
                    image = "data:image/png;base64," + base64.b64encode(_png()).decode()
                    client.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": [
                        {"type": "text", "text": "What colour is this square?"},
                        {"type": "image_url", "image_url": {"url": image}}]}])
                else:
                    drive_anthropic(rec.base(session), 1)
                session_calls(root, session, 1)
        finally:
            rec.stop()
    return root


@pytest.fixture(scope="module")
def chat_viewer(chat_data):
    viewer = ViewerProcess(chat_data, "--tokenizer", TOKENIZER_DIR)
    yield viewer
    assert "Traceback" not in viewer.stop()


@pytest.fixture(scope="module")
def example_viewer():
    viewer = ViewerProcess(EXAMPLE)
    yield viewer
    assert "Traceback" not in viewer.stop()


# --- JSON over HTTP ------------------------------------------------------------------------------


def test_sessions_list_pages_filters_and_sorts(example_viewer):
    con = connect(EXAMPLE)
    want = con.execute("SELECT session_id FROM session_info i LEFT JOIN (SELECT session_id, reward FROM outcomes) o "
                       "USING (session_id) ORDER BY coalesce(reward, -1) DESC, session_id DESC").fetchall()
    pages, after = [], ""
    while True:
        page = example_viewer.json(f"/api/sessions?sort=reward&limit=4{after}")
        pages.append([s["session_id"] for s in page["sessions"]])
        if not page["next"]:
            break
        after = f"&after={page['next']}"
    assert [sid for p in pages for sid in p] == [sid for (sid,) in want]  # keyset pages: every session once
    assert len(pages) == 6 and all(len(p) == 4 for p in pages[:-1])

    codex = example_viewer.json("/api/sessions?harness=codex&sort=cost&dir=asc")["sessions"]
    assert len(codex) == 3 and {s["harness"] for s in codex} == {"codex"}
    costs = [s["cost_usd"] for s in codex]
    assert costs == sorted(costs) and costs[0] > 0
    failed = example_viewer.json("/api/sessions?outcome=failed&task=fix-calc")["sessions"]
    assert failed and {(s["outcome"], s["task"]) for s in failed} == {("failed", "fix-calc")}
    facets = example_viewer.json("/api/facets")
    assert facets["harness"] == ["claude-code", "codex", "openai-python"]
    assert {"success", "failed", "infra_error"} == set(facets["outcome"])
    # search: a command only Codex-like sessions ran (in a tool call's arguments)
    found = example_viewer.json("/api/sessions?q=apply_patch")["sessions"]
    assert found and {s["harness"] for s in found} == {"codex"}


def test_session_calls_and_errors(example_viewer):
    con = connect(EXAMPLE)
    sid = "cc-recover2-a1"  # two failed tool results, then recovered
    assert con.execute("SELECT count(*) FROM tool_results WHERE failed AND session_id = ?", [sid]).fetchone() == (2,)
    session = example_viewer.json(f"/api/session?id={sid}")
    assert session["session"]["session_id"] == sid
    stored = con.execute("SELECT call_id FROM calls WHERE session_id = ? ORDER BY t_start, seq, call_id", [sid]).fetchall()
    assert [c["call_id"] for c in session["calls"]] == [c for (c,) in stored]
    assert sum(len(g["calls"]) for g in session["segments"]) == sum(c["segment_index"] is not None
                                                                   for c in session["calls"])
    total = con.execute("SELECT cost_usd FROM session_costs WHERE session_id = ?", [sid]).fetchone()[0]
    assert sum(c["cost_usd"] for c in session["calls"]) == pytest.approx(total)
    last = example_viewer.json(f"/api/call?id={session['calls'][-1]['call_id']}")
    results = [p for m in last["input"] for p in m["parts"] if p["type"] == "tool_result"]
    assert sum(last["tool_results"][p["call_id"]]["failed"] for p in results) == 2 < len(results)
    # what the last call adds: one tool result after the conversation the call before it had
    assert (last["repeated"], last["repeats"]) == (len(last["input"]) - 1, session["calls"][-2]["call_id"])
    first = example_viewer.json(f"/api/call?id={session['calls'][0]['call_id']}")
    assert (first["repeated"], first["repeats"]) == (0, None)
    # the trajectory: the test fails twice, the fix, the test passes, the notes
    assert [(t["tool_name"], t["kind"], t["target"], t["failed"]) for t in session["tool_calls"]] == [
        ("Bash", "shell", "pytest tests/test_a.py", True), ("Bash", "shell", "pytest tests/test_a.py", True),
        ("Edit", "write", "/w/a.py", False), ("Bash", "shell", "pytest tests/test_a.py", False),
        ("Write", "write", "/w/NOTES.md", False)]
    assert example_viewer.json(f"/api/call?id={last['call_id']}&session={sid}") == last
    assert example_viewer.get(f"/api/call?id={last['call_id']}&session=cc-verify-a1")[0] == 404  # not its session
    raw = example_viewer.json(f"/api/raw?id={session['calls'][0]['call_id']}")
    assert json.loads(raw["request_raw"])["messages"]
    assert example_viewer.get("/api/session?id=nope")[0] == 404


@pytest.mark.parametrize("path, message", [
    ("/api/sessions?sort=colour", "unknown sort 'colour'"),
    ("/api/sessions?limit=many", "parameter 'limit' must be a whole number"),
    ("/api/sessions?limit=0", "limit must be 1..1000"),
    ("/api/sessions?limit=--5", "parameter 'limit' must be a whole number"),
    ("/api/sessions?after=not-a-cursor", "bad page cursor"),
    ("/api/sessions?after=" + base64.urlsafe_b64encode(b'[{"a": 1}, "s"]').decode(), "bad page cursor"),
    ("/api/tokens?session=x", "missing parameter 'segment'"),
    ("/api/tokens?session=x&segment=first", "parameter 'segment' must be a whole number"),
    ("/api/call", "missing parameter 'id'"),
    ("/report?by=colour", "unknown --by column 'colour'"),
])
def test_bad_parameters_are_400(example_viewer, path, message):
    status, body, _ = example_viewer.get(path)
    assert status == 400 and message in json.loads(body)["error"], body


def test_a_bug_is_500_with_its_traceback(tmp_path):
    """A ValueError from the viewer's own reading (here: a stored `tools` column that is not JSON, so
    `json.loads` fails) is a bug, not the request's fault: 500, its traceback where the viewer was started."""
    import pyarrow.parquet as pq

    root = tmp_path / "data"
    shutil.copytree(EXAMPLE, root)
    (path,) = (root / "calls").glob("*.parquet")
    table = pq.read_table(path)
    tools = table.column("tools").to_pylist()
    broken = next(i for i, t in enumerate(tools) if t)
    tools[broken] = "{not json"
    pq.write_table(table.set_column(table.schema.get_field_index("tools"), "tools", [tools]), path)
    call_id = table.column("call_id")[broken].as_py()
    viewer = ViewerProcess(root)
    try:
        status, body, _ = viewer.get(f"/api/call?id={call_id}")
        assert viewer.get("/api/sessions?limit=x")[0] == 400  # bad input stays bad input
    finally:
        log = viewer.stop()
    assert status == 500 and json.loads(body)["error"].startswith("bug in forgerl: JSONDecodeError"), body
    assert "Traceback" in log and "json.decoder.JSONDecodeError" in log


def test_first_page_imports_no_pandas():
    """Opening a dataset and serving the first sessions page never imports pandas (half a second of a start):
    the lookup tables are DDL and rows, not registered Arrow tables."""
    code = ("import sys; from pathlib import Path; from forgerl.analysis.viewer.server import Viewer; "
            f"v = Viewer(Path({str(EXAMPLE)!r}), None); print(len(v.data.sessions({{}})['sessions']), "
            "'pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["21", "False"], done.stderr


def test_report_links_to_the_list(example_viewer):
    status, body, kind = example_viewer.get("/report?by=task")
    assert status == 200 and kind.startswith("text/html")
    links = re.findall(r'<a href="/#/\?task=([^"]+)">', body.decode())
    assert "fix-calc" in links and len(links) == 7
    listed = example_viewer.json("/api/sessions?task=fix-calc")["sessions"]
    assert len(listed) == 3
    assert example_viewer.get("/report?by=colour")[0] == 400


def test_images_and_token_view_json(chat_viewer, chat_data):
    session = chat_viewer.json("/api/session?id=chat-image")
    call = chat_viewer.json(f"/api/call?id={session['calls'][0]['call_id']}")
    image = next(p for m in call["input"] for p in m["parts"] if p["type"] == "image")
    status, data, kind = chat_viewer.get(f"/api/blob?session=chat-image&hash={image['blob_hash']}")
    assert (status, data, kind) == (200, _png(), "image/png")

    view = chat_viewer.json("/api/tokens?session=chat-multi&segment=0")
    engine, rendered = view["engine"], view["rendered"]
    assert engine["ids"] and len(engine["ids"]) == len(engine["mask"]) == len(engine["text"])
    assert "".join(engine["text"]) .startswith("<|im_start|>user")
    assert 0 < sum(engine["mask"]) < len(engine["mask"])
    kinds = {d["kind"] for d in view["drift"]}
    assert "stripped_think" in kinds  # veRL's re-render drops the answer's <think> block
    think = next(d for d in view["drift"] if d["kind"] == "stripped_think")
    assert "<think>" in "".join(engine["text"][think["engine"][0]: think["engine"][1]])
    plain = chat_viewer.json("/api/tokens?session=chat-plain&segment=0")
    assert plain["engine"] is None and plain["rendered"]["ids"] and plain["drift"] is None


def _only_call(viewer: ViewerProcess, session: str) -> str:
    (call,) = viewer.json(f"/api/session?id={session}")["calls"]
    return f"id={call['call_id']}&session={session}"


def test_raw_request_is_what_the_harness_sent(chat_viewer, upstream):
    """The raw request shows what the harness sent, never the recorder's blob references: a small image's
    base64 in place, a screenshot as its size (the whole request one link away), an image recorded without
    its bytes named as such."""
    sent = [ex.body for ex in upstream.log]
    small = chat_viewer.json(f"/api/raw?{_only_call(chat_viewer, 'chat-image')}")
    assert small["request_raw"].encode() in sent and small["images"][0]["inline"]  # base64 short: shown as sent

    shot = screenshot(0)
    keep = chat_viewer.json(f"/api/raw?{_only_call(chat_viewer, 'gui-keep')}")
    assert "forgerl-blob" not in keep["request_raw"] and base64.b64encode(shot).decode() not in keep["request_raw"]
    (image,) = keep["images"]
    assert (image["kept"], image["inline"], image["width"], image["height"], image["bytes"]) == \
        (True, False, 640, 400, len(shot))
    assert f"[image 1: image/png 640x400, {len(shot):,} bytes; its " in keep["request_raw"]
    status, body, kind = chat_viewer.get(f"/api/request?{_only_call(chat_viewer, 'gui-keep')}")
    assert status == 200 and body in sent and len(body) == keep["request_bytes"]
    # the shown text is the request as sent, the screenshot's base64 written as its size
    assert re.sub(r"\[image 1: [^\]]*\]", base64.b64encode(shot).decode(), keep["request_raw"]) == body.decode()

    hashed = chat_viewer.json(f"/api/raw?{_only_call(chat_viewer, 'gui-hash')}")
    assert "forgerl-blob" not in hashed["request_raw"] and hashed["images"][0]["kept"] is False
    assert "its bytes not kept (forge-record --images hash-only)" in hashed["request_raw"]
    status, body, _ = chat_viewer.get(f"/api/request?{_only_call(chat_viewer, 'gui-hash')}")
    assert status == 404 and b"not kept" in body  # no request 'as sent' with a reference in its place


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["/no/such/dataset"], "/no/such/dataset"),
    ([str(EXAMPLE), "--listen", "localhost"], "expected HOST:PORT"),
    ([str(EXAMPLE), "--listen", "127.0.0.1:99999"], "expected HOST:PORT"),
    ([str(EXAMPLE), "--listen", "192.0.2.1:8765"], "cannot listen there"),
])
def test_bad_input_is_one_line(args, message):
    r = subprocess.run([FORGE_ANALYZE, "view", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr and "Traceback" not in r.stderr


# --- in the browser ------------------------------------------------------------------------------


async def until(dt: DevTools, expression: str, timeout: float = 30) -> object:
    """The expression's value once it is truthy (the page renders after its fetches answer)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = (await dt.send("Runtime.evaluate", expression=expression, returnByValue=True,
                               awaitPromise=True))["result"].get("value")
        if value:
            return value
        await asyncio.sleep(0.05)
    page = (await dt.send("Runtime.evaluate", expression="document.querySelector('main').innerHTML.slice(0, 2000)",
                          returnByValue=True))["result"].get("value")
    raise AssertionError(f"timed out waiting for: {expression}\npage: {page}")


async def _counts(dt: DevTools, **selectors: str) -> dict[str, int]:
    """How many elements each CSS selector matches (once the page shows any)."""
    fields = ", ".join(f"{name}: document.querySelectorAll({json.dumps(css)}).length" for name, css in selectors.items())
    return await until(dt, f"({{{fields}}})")


async def go(dt: DevTools, url: str) -> None:
    """Open a viewer URL and wait until its route has rendered."""
    await dt.send("Runtime.evaluate", expression=f"location.href = {json.dumps(url)}")
    await until(dt, f"document.body.dataset.ready === {json.dumps(url[url.index('#'):])}")


async def _browse(ws_url: str, base: str, shots: Path) -> dict:
    import websockets

    async with websockets.connect(ws_url, max_size=None) as ws:
        dt = DevTools(ws)
        for domain in ("Page", "Runtime", "Log"):
            await dt.send(f"{domain}.enable")
        await dt.send("Page.navigate", url=base + "#/")
        await until(dt, "document.body.dataset.ready === '#/'")
        seen = {"list": await until(dt, "[...document.querySelectorAll('#sessions tr[data-session]')]"
                                         ".map(r => r.dataset.session)")}
        await dt.send("Runtime.evaluate", expression="document.querySelector('#f-q').value = 'paris';"
                                                     "document.querySelector('#f-q').onchange()")
        await until(dt, "document.body.dataset.ready === '#/?q=paris&sort=time&dir=desc'")
        seen["search"] = await until(dt, "[...document.querySelectorAll('#sessions tr[data-session]')]"
                                          ".map(r => r.dataset.session)")
        await dt.send("Runtime.evaluate", expression="document.querySelector('tr[data-session=\"chat-tools\"]').click()")
        await until(dt, "document.body.dataset.ready === '#/session/chat-tools'")
        seen["calls"] = await until(dt, "document.querySelectorAll('tr.call').length")
        seen["facts"] = await until(dt, "document.querySelector('#session-facts').innerText")
        await dt.send("Runtime.evaluate", expression="document.querySelectorAll('tr.call')[1].click()")
        await until(dt, "document.body.dataset.ready.includes('/call/')")
        seen["call"] = await _counts(dt, messages="#detail .message", history="#detail .message.history",
                                     reasoning="#detail .message:not(.history) .part.reasoning",
                                     results="#detail .message:not(.history) .part.tool_result")
        seen["call"]["facts"] = await until(dt, "document.querySelector('#call-facts').innerText")
        seen["call"]["folded"] = await until(dt, "document.querySelector('#history > summary').innerText")
        await dt.send("Runtime.evaluate", expression="document.querySelector('#history > summary').click()")
        seen["call"]["unfolded"] = await until(dt, "document.querySelectorAll('#history .message.history').length")
        await dt.send("Runtime.evaluate", expression="document.querySelector('#show-raw').click()")
        seen["raw"] = await until(dt, "document.querySelectorAll('#raw pre').length === 2 && "
                                       "document.querySelector('#raw pre').innerText.slice(0, 200)")
        shot = (await dt.send("Page.captureScreenshot", format="png"))["data"]
        (shots / "viewer-call.png").write_bytes(base64.b64decode(shot))
        await dt.send("Runtime.evaluate", expression="document.querySelector('a.token-link').click()")
        await until(dt, "document.body.dataset.ready === '#/session/chat-tools/tokens/0'")
        seen["tokens"] = await _counts(dt, engine="#engine-tokens .tok", loss="#engine-tokens .tok.loss",
                                       drift="#engine-tokens .tok.drift", rendered="#rendered-tokens .tok")
        seen["tokens"]["summary"] = await until(dt, "document.querySelector('#drift-summary').innerText")
        await go(dt, base + "#/session/chat-image/call/" + await until(
            dt, "fetch('/api/session?id=chat-image').then(r => r.json()).then(s => s.calls[0].call_id)"))
        seen["image"] = await until(dt, "[...document.querySelectorAll('#detail img')].map(i => i.naturalWidth)"
                                         ".filter(w => w > 0)")
        await go(dt, base + "#/session/gui-keep/call/" + await until(
            dt, "fetch('/api/session?id=gui-keep').then(r => r.json()).then(s => s.calls[0].call_id)"))
        await dt.send("Runtime.evaluate", expression="document.querySelector('#show-raw').click()")
        seen["gui_raw"] = await until(dt, "document.querySelector('#raw-images') && "
                                           "[document.querySelector('#raw-images').innerText, "
                                           "document.querySelector('#raw-images a').href, "
                                           "document.querySelector('#raw pre').innerText]")
        seen["errors"] = await dt.send("Runtime.evaluate", returnByValue=True,
                                       expression="document.querySelectorAll('#load-error').length")
        seen["problems"] = dt.problems()
        return seen


def in_chromium(browse: Callable[[str, str, Path], Awaitable[dict]], base: str, folder: Path) -> dict:
    """What `browse(DevTools URL, viewer URL, folder)` saw, in a headless Chromium started for it."""
    proc, ws_url = _chromium(folder / "profile")
    try:
        return asyncio.run(browse(ws_url, base, folder))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_browse_list_session_call_tokens_in_chromium(chat_viewer, tmp_path):
    seen = in_chromium(_browse, chat_viewer.url, tmp_path)
    assert seen["problems"] == []
    assert seen["errors"]["result"]["value"] == 0
    assert sorted(seen["list"]) == ["chat-image", "chat-multi", "chat-plain", "chat-tools", "gui-hash", "gui-keep"]
    assert seen["search"] == ["chat-tools"]
    assert seen["calls"] == 2
    assert re.search(r"harness\s+openai-python", seen["facts"]) and "object" not in seen["facts"], seen["facts"]
    call = seen["call"]
    # the second call continues the first: its 3 earlier messages are folded away (built when unfolded), the
    # tool result is new
    assert (call["messages"], call["history"], call["reasoning"], call["results"]) == (2, 0, 1, 1)
    assert call["folded"] == "3 earlier messages this call repeats (call 1 sent or got them)"
    assert call["unfolded"] == 3
    assert "HTTP 200" in call["facts"] and "first byte" in call["facts"]
    assert '"messages"' in seen["raw"]
    tokens = seen["tokens"]
    assert tokens["engine"] == 295 and tokens["rendered"] == 273  # the sample forge-convert writes, both ways
    assert 0 < tokens["loss"] < tokens["engine"] and tokens["drift"] > 0
    assert "stripped_think" in tokens["summary"]
    assert seen["image"] == [48]
    note, link, request = seen["gui_raw"]  # the screenshot shown by its size, the whole request one link away
    assert note.startswith("1 image shown by size, not base64: the whole request as sent (") and "/api/request?id=" in link
    assert "[image 1: image/png 640x400, " in request and "forgerl-blob" not in request
    png = (tmp_path / "viewer-call.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
