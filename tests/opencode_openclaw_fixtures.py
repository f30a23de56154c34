"""Shared pieces of the OpenCode and OpenClaw end-to-end tests: a phone-home trap, tool-loop counting, a key grep,
and the record / forge-run / serve runs both make with their own CLI.

`PhoneHomeTrap` is an HTTP(S) proxy that refuses everything and remembers what
was asked of it. A harness run with it as `HTTP(S)_PROXY` (and the recorder in
`NO_PROXY`) reaches the recorder directly, and any other host it tries (a model
catalogue, a package registry, an update or telemetry endpoint) lands in the
trap, so a test can assert that nothing but the model was called. Bun (OpenCode)
honours the proxy variables; Node 24 (OpenClaw) does with `NODE_USE_ENV_PROXY=1`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from forgerl.recorder.launch import launch
from forgerl.schema.store import read_table

from conftest import FORGE_RECORD, REPO, RecorderProcess, session_calls
from convert_fixtures import TOKENIZER_DIR, qwen_tokenizer
from runner_fixtures import BENCH, NOVEL_ANSWER, NOVEL_TASK, SPARQL_QUERY, SPARQL_TASK
from scripted_upstream import Request, Script, ScriptedUpstream, ToolCall, Turn


class PhoneHomeTrap:
    def __init__(self) -> None:
        self.requests: list[str] = []  # first line of each request: "CONNECT host:443 HTTP/1.1", "GET http://..."
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def env(self) -> dict[str, str]:
        no_proxy = "127.0.0.1,localhost"
        return {"HTTP_PROXY": self.url, "HTTPS_PROXY": self.url, "http_proxy": self.url, "https_proxy": self.url,
                "NO_PROXY": no_proxy, "no_proxy": no_proxy, "NODE_USE_ENV_PROXY": "1"}

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    line = conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
                    self.requests.append(line)
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    continue

    def close(self) -> None:
        self._server.close()


def tool_results(request: Request) -> int:
    """How many tool results the conversation holds (OpenClaw appends a context note after each one, so the
    last message is not always the tool result)."""
    return sum(m.get("role") == "tool" for m in request.body.get("messages") or [])


def files_holding(secret: str, *folders: Path) -> list[str]:
    """Files under `folders` whose bytes contain `secret`."""
    return [str(p) for folder in folders for p in folder.rglob("*")
            if p.is_file() and secret.encode() in p.read_bytes()]


def run_recorded(base: Path, session: str, script: Script, argv: list[str],
                 env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`forge-record run -- argv` in `base/work` (HOME `base/home`) against the scripted upstream, behind a
    `PhoneHomeTrap`: the run and what the trap was asked."""
    work, home = base / "work", base / "home"
    work.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    trap = PhoneHomeTrap()
    try:
        with ScriptedUpstream(script) as up:
            r = subprocess.run([FORGE_RECORD, "run", "--out", str(base / "data"), "--session", session,
                                "--upstream-openai", up.url, "--", *argv], cwd=work,
                               env={**os.environ, **trap.env(), "HOME": str(home), "PWD": str(work), **env},
                               capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    finally:
        trap.close()
    return r, trap.requests


def sparql_script(shell_tool: str) -> Script:
    """task_00067 through the harness's shell tool: write the query (14 of 15 checks), then say so."""
    def script(request: Request) -> Turn:
        if tool_results(request) == 0:
            cmd = f"cat > query_output.sparql <<'EOF'\n{SPARQL_QUERY}EOF"
            return Turn(text="Writing the query.", tool_calls=[ToolCall(shell_tool, {"command": cmd})])
        return Turn(text="Wrote query_output.sparql.")
    return script


def run_sparql_task(harness: str, upstream: str, out: Path) -> tuple[dict, dict, list[dict]]:
    """One graded `forge-run` of task_00067: its outcome row, the row's `extra`, the recorded calls."""
    r = subprocess.run([str(Path(sys.executable).with_name("forge-run")), str(BENCH), "--task", SPARQL_TASK,
                        "--harness", harness, "--upstream", upstream, "--out", str(out)],
                       capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = read_table(out, "outcomes").to_pylist()
    return row, json.loads(row["extra"]), read_table(out, "calls").to_pylist()


def run_served(tmp_path: Path, monkeypatch, turns: list[str], argv: list[str], session: str,
               env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[dict], list[str]]:
    """`argv` aimed by `launch()` (called in its working directory, as forge-record run calls it, with
    `tmp_path` as scratch) at `forge-record serve --policy script:` playing `turns`, behind a `PhoneHomeTrap`:
    the run, the session's recorded calls, what the trap was asked."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(turns))
    served = RecorderProcess(tmp_path / "data", None, "--policy", f"script:{script}", "--tokenizer",
                             str(TOKENIZER_DIR), "--served-model", "qwen3-policy").start()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    trap = PhoneHomeTrap()
    try:
        aimed = launch(argv, served.url, session, tmp_path)
        env = {**os.environ, **trap.env(), "HOME": str(tmp_path), "PWD": str(work), **env, **aimed.env}
        r = subprocess.run(aimed.argv, cwd=work, env=env, capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
    finally:
        served.stop()
        trap.close()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r, session_calls(tmp_path / "data", session, len(turns)), trap.requests


def check_served(calls: list[dict], turns: list[str]) -> None:
    """Each recorded completion's ids decode to exactly the scripted turn."""
    tok = qwen_tokenizer()
    assert len(calls) == len(turns)
    for call, text in zip(calls, turns):
        assert call["api"] == "chat" and call["policy_version"] == "qwen3-policy" and call["error"] is None
        assert tok.decode(call["completion_token_ids"][:-1], skip_special_tokens=False) == text


ANSWER = "proof.txt says: forgerl"


def pinned_cli(name: str) -> Path:
    """The harness CLI from the project's pinned npm install."""
    path = REPO / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.fail(f"{path} missing: run `make test` (npm ci installs the pinned harness CLIs)")
    return path


def loop_script(shell: ToolCall, read: ToolCall) -> Script:
    """Run `shell` (which writes proof.txt), then `read` (which reads it back), then answer with its content."""
    def script(request: Request) -> Turn:
        step = tool_results(request)
        if step == 0:
            return Turn(text="Writing it.", tool_calls=[shell])
        if step == 1:
            return Turn(text="Reading it back.", tool_calls=[read])
        return Turn(text=ANSWER)
    return script


def run_policy_task(harness: str, folder: Path) -> tuple[dict, list[dict]]:
    """`forge-run --policy script:` of task_00043 (graded on the answer text, 3 of 8 checks): its outcome row
    and the calls recorded for it."""
    script = folder / "turns.json"
    script.write_text(json.dumps([NOVEL_ANSWER]))
    out = folder / "data"
    r = subprocess.run([str(Path(sys.executable).with_name("forge-run")), str(BENCH), "--task", NOVEL_TASK,
                        "--harness", harness, "--policy", f"script:{script}", "--tokenizer", str(TOKENIZER_DIR),
                        "--served-model", "qwen3-policy", "--out", str(out)],
                       capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = read_table(out, "outcomes").to_pylist()
    return row, [c for c in read_table(out, "calls").to_pylist() if c["session_id"] == row["session_id"]]
