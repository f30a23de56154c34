"""What the per-harness end-to-end tests share, kept once: the pinned-CLI finder, the proxy trap, the key grep,
tool-result counting, `forge-record run`, `forge-run`, `forge-record serve --policy script:`, and the
convert / veRL-load / ATIF checks.

`ProxyTrap` is an HTTP(S) proxy that refuses everything and remembers what was
asked of it. A harness run with it as `HTTP(S)_PROXY` (and the recorder, on
loopback, in `NO_PROXY`) reaches the recorder directly, and any other host it
tries (a model catalogue, a package registry, an update or telemetry endpoint)
lands in the trap, so a test can assert that nothing but the model was called.
Bun (OpenCode) honours the proxy variables; Node 24 (OpenClaw, Qwen Code, pi,
Gemini CLI) does with `NODE_USE_ENV_PROXY=1`; Python (mini-swe-agent's httpx) does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from forgerl.harnesses import launch
from forgerl.schema.store import read_table

from conftest import FORGE_RECORD, REPO, RecorderProcess, session_calls, session_parts
from convert_fixtures import TOKENIZER_DIR, convert, qwen_tokenizer, rows
from runner_fixtures import BENCH, SPARQL_QUERY, SPARQL_SCORE, SPARQL_TASK
from scripted_upstream import Request, Script, ScriptedUpstream, ToolCall, Turn

BIN = REPO / "node_modules" / ".bin"
FORGE_RUN = str(Path(sys.executable).with_name("forge-run"))


def needs(cli: str) -> Path:
    """The harness CLI from the project's pinned npm install."""
    path = BIN / cli
    if not path.exists():
        pytest.fail(f"{path} missing: run `make test` (npm ci installs the pinned harness CLIs)")
    return path


class ProxyTrap:
    """A loopback listener posing as the HTTP(S) proxy: logs the first line of every connection (or the error
    reading it) in `hits` ("CONNECT host:443 HTTP/1.1", "GET http://..."), answers 403."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def env(self) -> dict[str, str]:
        """Every proxy variable at the trap, the recorder (loopback) exempt."""
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
                    self.hits.append(conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace"))
                except OSError as e:
                    self.hits.append(repr(e))
                    continue
                try:
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    continue

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> ProxyTrap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def files_holding(secret: str, *paths: Path) -> list[str]:
    """Files (`paths` themselves, or any file under them) whose bytes contain `secret`."""
    found = [p for path in paths for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()]
    return [str(p) for p in found if secret.encode() in p.read_bytes()]


def tool_results(request: Request) -> int:
    """How many tool results the conversation holds (Chat Completions `tool` messages, Gemini `functionResponse`
    parts). OpenClaw appends a context note after each one, so the last message is not always the tool result."""
    body = request.body
    return (sum(m.get("role") == "tool" for m in body.get("messages") or [])
            + sum("functionResponse" in part for content in body.get("contents") or []
                  for part in content.get("parts") or []))


def loop_script(first: ToolCall, then: ToolCall, answer: str) -> Script:
    """Call `first` (which writes proof.txt), then `then` (which reads it back), then answer `answer`."""
    def script(request: Request) -> Turn:
        step = tool_results(request)
        if step == 0:
            return Turn(text="Writing the file.", tool_calls=[first])
        if step == 1:
            return Turn(text="Reading it back.", tool_calls=[then])
        return Turn(text=answer)
    return script


def tool_exchange(root: Path, session: str, calls: list[dict], tool: str) -> tuple[dict, dict]:
    """The tool call the model made (the only one in `calls`, to `tool`) and the tool result the harness sent
    back for it."""
    parts = {h: json.loads(p) for h, p in session_parts(root, session).items()}
    made = [parts[h] for c in calls for h in c["output_refs"] if parts[h]["type"] == "tool_call"]
    assert [m["tool_name"] for m in made] == [tool], made
    results = [parts[h] for c in calls for h in c["input_refs"]
               if parts[h]["type"] == "tool_result" and parts[h]["call_id"] == made[0]["call_id"]]
    assert results, "the tool result never reached the model"
    return made[0], results[0]


SPARQL_COMMAND = f"cat > query_output.sparql <<'EOF'\n{SPARQL_QUERY}EOF"


def sparql_script(shell: str) -> Script:
    """task_00067 through the harness's shell tool: write the query (14 of 15 checks pass, see runner_fixtures),
    then say so."""
    def script(request: Request) -> Turn:
        if tool_results(request):
            return Turn(text="Wrote query_output.sparql.")
        return Turn(text="Writing the query.", tool_calls=[ToolCall(shell, {"command": SPARQL_COMMAND})])
    return script


def served_turns(shell: str) -> list[str]:
    """What a scripted policy says in a served run: write proof.txt with the harness's shell tool, then "Done."."""
    call = json.dumps({"name": shell, "arguments": {"command": "echo forgerl > proof.txt"}})
    return [f"I'll write the file.\n<tool_call>\n{call}\n</tool_call>", "<think>\nIt worked.\n</think>\n\nDone."]


def forge_record_run(cmd: list[str], *, out: Path, session: str, upstream: str, work: Path, home: Path,
                     env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`forge-record run --upstream URL -- cmd` (one upstream for the Anthropic, OpenAI and Gemini APIs) in
    `work` with HOME `home`."""
    return subprocess.run([FORGE_RECORD, "run", "--out", str(out), "--session", session, "--upstream", upstream,
                           "--", *cmd], cwd=work, env={**os.environ, "HOME": str(home), "PWD": str(work), **env},
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def run_recorded(base: Path, session: str, upstream: str, cmd: list[str],
                 env: dict[str, str]) -> subprocess.CompletedProcess:
    """`forge_record_run` in `base/work` (HOME `base/home`, with a `.codex` folder), recording to `base/data`."""
    work, home = base / "work", base / "home"
    work.mkdir(parents=True, exist_ok=True)
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    return forge_record_run(cmd, out=base / "data", session=session, upstream=upstream, work=work, home=home,
                            env=env)


def record_trapped(base: Path, session: str, script: Script, cmd: list[str], env: dict[str, str]) -> dict:
    """`run_recorded` against `script` played by a scripted upstream, every proxy variable at a `ProxyTrap`:
    {"run", "base", "data", "session", "hits" (what the trap was asked), "paths" (what the upstream was asked)}."""
    with ProxyTrap() as trap, ScriptedUpstream(script) as up:
        r = run_recorded(base, session, up.url, cmd, {**trap.env(), **env})
        paths = [e.path for e in up.log]
    return {"run": r, "base": base, "data": base / "data", "session": session, "hits": trap.hits, "paths": paths}


@contextmanager
def recording(script: Script, data: Path) -> Iterator[RecorderProcess]:
    """A real `forge-record serve` writing to `data`, in front of `script` played by a scripted upstream."""
    with ScriptedUpstream(script) as up:
        rec = RecorderProcess(data, up.url).start()
        try:
            yield rec
        finally:
            rec.stop()


def serve_script(tmp_path: Path, turns: list[str]) -> RecorderProcess:
    """`forge-record serve --policy script:FILE` playing `turns`, recording to `tmp_path/data` (started)."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(turns))
    return RecorderProcess(tmp_path / "data", None, "--policy", f"script:{script}", "--tokenizer",
                           str(TOKENIZER_DIR), "--served-model", "qwen3-policy").start()


def run_served(tmp_path: Path, monkeypatch, turns: list[str], argv: list[str], session: str,
               env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[dict], list[str]]:
    """`argv` aimed by `launch()` (called in its working directory, as forge-record run calls it, with
    `tmp_path` as scratch) at `forge-record serve --policy script:` playing `turns`, behind a `ProxyTrap`:
    the run, the session's recorded calls, what the trap was asked."""
    served = serve_script(tmp_path, turns)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    trap = ProxyTrap()
    try:
        aimed = launch(argv, served.url, session, tmp_path)
        env = {**os.environ, **trap.env(), "HOME": str(tmp_path), "PWD": str(work), **env, **aimed.env}
        r = subprocess.run(aimed.argv, cwd=work, env=env, capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
    finally:
        served.stop()
        trap.close()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r, session_calls(tmp_path / "data", session, len(turns)), trap.hits


def chat_calls(data: Path, session: str, n: int, model: str) -> list[dict]:
    """The session's `n` recorded calls: all complete Chat Completions calls for `model`, none failed."""
    calls = session_calls(data, session, n)
    assert len(calls) == n and all(c["api"] == "chat" and c["complete"] and c["error"] is None for c in calls)
    assert all(c["path"] == "/v1/chat/completions" and c["model_requested"] == model for c in calls)
    return calls


def check_served_ids(calls: list[dict], turns: list[str], api: str, continues: bool = True) -> None:
    """Each served call's completion ids decode to exactly its scripted turn; with `continues`, the second
    prompt continues the first call's tokens."""
    tok = qwen_tokenizer()
    assert len(calls) == len(turns)
    for call, text in zip(calls, turns):
        assert call["api"] == api and call["policy_version"] == "qwen3-policy" and call["error"] is None
        assert tok.decode(call["completion_token_ids"][:-1], skip_special_tokens=False) == text
    if continues:
        held = calls[0]["prompt_token_ids"] + calls[0]["completion_token_ids"]
        assert calls[1]["prompt_token_ids"][:len(held)] == held, "the second turn re-tokenised the history"


def forge_run(task: str, harness: str, out: Path, *args: str) -> tuple[dict, dict, list[dict]]:
    """One graded `forge-run` of `task` (QwenClawBench): its outcome row, the row's `extra`, the recorded calls."""
    r = subprocess.run([FORGE_RUN, str(BENCH), "--task", task, "--harness", harness, *args, "--out", str(out)],
                       capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = read_table(out, "outcomes").to_pylist()
    return row, json.loads(row["extra"]), read_table(out, "calls").to_pylist()


def graded_sparql(harness: str, upstream: str, out: Path, *args: str,
                  answer: str = "Wrote query_output.sparql.") -> tuple[dict, dict, list[dict]]:
    """`forge_run` of task_00067 against `upstream`, graded at 14/15 with `answer` as the harness's final answer."""
    row, extra, calls = forge_run(SPARQL_TASK, harness, out, "--upstream", upstream, *args)
    assert row["harness"] == harness and row["status"] == "failed", (row["status"], extra)
    assert row["reward"] == pytest.approx(SPARQL_SCORE)
    assert extra["final_answer"] == answer
    return row, extra, calls


def load_sft(folder: Path, max_length: int = 65536):
    """veRL's view (ForgeSFTDataset) of a `verl-sft` conversion's training shards."""
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    files = sorted(str(p) for p in folder.glob("train/*.parquet"))
    return ForgeSFTDataset(files, qwen_tokenizer(), {"pad_mode": "no_padding", "max_length": max_length,
                                                     "ignore_input_ids_mismatch": True})


def convert_sft_and_tokens(data: Path, out: Path, harness: str, *args: str,
                           max_length: int = 65536) -> tuple[dict, list[dict], object]:
    """`verl-sft` (to out/s) and `tokens` (to out/t) of the recording: the verl-sft manifest, the token rows,
    veRL's dataset of the shards."""
    manifest = convert(data, out / "s", "--to", "verl-sft", "--harness", harness, *args)
    convert(data, out / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--harness", harness, *args)
    return manifest, rows(out / "t"), load_sft(out / "s", max_length)


def one_segment_sft(data: Path, out: Path, harness: str, session: str, num_turns: int,
                    max_length: int = 65536) -> tuple[dict, object]:
    """`convert_sft_and_tokens` of a recording that holds one session, one segment of `num_turns` turns, no
    tools-absent call; veRL's item has the `tokens` row's ids. The row and veRL's dataset."""
    manifest, token_rows, ds = convert_sft_and_tokens(data, out, harness, max_length=max_length)
    assert manifest["counts"]["sessions"] == 1 and not manifest["counts"].get("tools_absent_calls")
    (row,) = token_rows
    assert (row["segment_id"], row["num_turns"], row["segment_reason"], row["harness"]) == (
        f"{session}:0", num_turns, "start", harness)
    assert len(ds) == 1
    check_same_ids(ds[0], row)
    return row, ds


def check_same_ids(item: dict, row: dict, note: str = "") -> None:
    """veRL's item holds exactly the `tokens` row's ids and loss mask."""
    assert item["input_ids"].tolist() == row["input_ids"], note
    assert item["loss_mask"].tolist() == row["loss_mask"], note


def atif_doc(data: Path, out: Path, harness: str) -> dict:
    """The one ATIF trajectory of the recording, validated against the ATIF schema."""
    import atif

    convert(data, out, "--to", "atif", "--harness", harness)
    (doc_path,) = out.glob("train/*.json")
    doc = json.loads(doc_path.read_text())
    atif.Trajectory.model_validate(doc)
    return doc


def atif_calls(doc: dict, copied: bool = True) -> list[dict]:
    """The trajectory's tool calls in order (without those in steps marked copied context, unless `copied`)."""
    return [c for s in doc["steps"] if copied or not s.get("is_copied_context") for c in s.get("tool_calls") or []]
