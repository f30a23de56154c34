"""The HTML report in real headless Chromium (DevTools protocol), and the notebook executed by nbclient.

Both run on the bundled example dataset (analysis/example). Set
FORGERL_UPDATE_DOCS=1 to refresh the screenshot analysis/README.md shows.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO

EXAMPLE = REPO / "analysis" / "example"
FORGE_ANALYZE = str(Path(sys.executable).with_name("forge-analyze"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.slow


class DevTools:
    """One page of a headless Chromium, driven over the DevTools protocol; keeps every console/log event."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    async def send(self, method: str, **params) -> dict:
        msg_id = next(self.ids)
        await self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self.events.append(msg)

    async def wait_for(self, method: str, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(json.loads(await asyncio.wait_for(self.ws.recv(), deadline - time.time())))

    def problems(self) -> list[str]:
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(json.dumps(p["exceptionDetails"])[:300])
            elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(json.dumps(p.get("args"))[:300])
            elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(p["entry"].get("text", "")[:300])
        return out


def _chromium(profile: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                             "--disable-component-update", "--disable-sync", "--no-first-run",
                             f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1280,900",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = profile / "DevToolsActivePort"
    for _ in range(300):
        if port_file.exists() and port_file.read_text().strip():
            port = port_file.read_text().split()[0]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            if pages:
                return proc, pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("chromium did not open its DevTools port")


async def _render(ws_url: str, page: Path, shot: Path) -> tuple[list[str], list[dict]]:
    import websockets

    async with websockets.connect(ws_url, max_size=None) as ws:
        dt = DevTools(ws)
        for domain in ("Page", "Runtime", "Log"):
            await dt.send(f"{domain}.enable")
        await dt.send("Page.navigate", url=page.as_uri())
        await dt.wait_for("Page.loadEventFired")
        boxes = await dt.send("Runtime.evaluate", returnByValue=True, expression="""
            [...document.querySelectorAll('figure.plot')].map(f => {
              const s = f.querySelector('svg'), r = s ? s.getBoundingClientRect() : null;
              return {id: f.id, width: r ? r.width : 0, height: r ? r.height : 0,
                      shapes: s ? s.querySelectorAll('path, rect, use').length : 0};
            })""")
        data = (await dt.send("Page.captureScreenshot", format="png", captureBeyondViewport=True))["data"]
        shot.write_bytes(base64.b64decode(data))
        return dt.problems(), boxes["result"]["value"]


def render(page: Path, shot: Path) -> tuple[list[str], list[dict]]:
    """Open `page` in a fresh headless Chromium, screenshot it to `shot`: console problems and each plot's box."""
    proc, ws_url = _chromium(shot.parent / f"{shot.stem}-profile")
    try:
        return asyncio.run(_render(ws_url, page, shot))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_report_renders_in_headless_chromium(tmp_path):
    page = tmp_path / "report.html"
    r = subprocess.run([FORGE_ANALYZE, "report", str(EXAMPLE), "--out", str(page)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    problems, plots = render(page, tmp_path / "report.png")
    assert problems == []
    assert [p["id"] for p in plots] == ["metric-bars", "pass-curves", "tool-kinds"]
    for p in plots:
        assert p["width"] > 300 and p["height"] > 150 and p["shapes"] > 10, p
    png = (tmp_path / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    if os.environ.get("FORGERL_UPDATE_DOCS"):
        shutil.copy(tmp_path / "report.png", EXAMPLE / "report.png")


def test_notebook_runs_on_the_example():
    import jupytext
    import nbclient

    path = REPO / "analysis" / "notebooks" / "behaviour.py"
    nb = jupytext.read(path)
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 4
    first = next(o for o in outputs if o.output_type == "execute_result")["data"]["text/plain"]
    assert [float(v) for v in first.split("\n")[1].split()[1:]] == [21, 87, 75]  # 7 scenarios x 3 attempts: sessions, turns, calls
