"""What the Qwen Code and pi end-to-end tests share: the tool loop, the phone-home trap, the checks.

Both harnesses speak Chat Completions to the scripted upstream. The model
script writes a file with the harness's own write tool, reads it back with
its read tool, then answers. Node 24 honours `HTTP(S)_PROXY` when
`NODE_USE_ENV_PROXY=1`, so aiming the proxies at a trap (with the recorder
in `NO_PROXY`) catches any request a harness makes to anywhere but the
recorder: without `QWEN_USAGE_STATISTICS_ENABLED=false` the trap sees Qwen
Code's `CONNECT …rum.aliyuncs.com:443`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

from forgerl.runners.harnesses import RunContext, get_harness
from forgerl.runners.harnesses.base import node_path
from forgerl.schema.store import read_table

from conftest import RecorderProcess, session_calls
from convert_fixtures import TOKENIZER_DIR, convert, qwen_tokenizer, rows
from runner_fixtures import BENCH, SPARQL_QUERY, SPARQL_SCORE, SPARQL_TASK
from scripted_upstream import Request, Script, ScriptedUpstream, ToolCall, Turn
from test_harnesses import run_recorded, tool_exchange

PROOF = "forgerl proof\n"
ANSWER = "The file says: forgerl proof"
FORGE_RUN = str(Path(sys.executable).with_name("forge-run"))


class ProxyTrap:
    """A loopback listener posing as the HTTP(S) proxy: logs the first line of every connection, answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.hits: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.hits.append(conn.recv(512).decode(errors="replace").split("\r\n")[0])
                except OSError as e:
                    self.hits.append(repr(e))

    def env(self) -> dict[str, str]:
        """Node 24 on PATH, every proxy variable at the trap, the recorder (loopback) exempt."""
        return {"PATH": node_path(), "HTTP_PROXY": self.url, "HTTPS_PROXY": self.url, "http_proxy": self.url,
                "https_proxy": self.url, "NO_PROXY": "127.0.0.1,localhost", "NODE_USE_ENV_PROXY": "1"}

    def close(self) -> None:
        self.sock.close()


def tool_results(request: Request) -> int:
    return sum(m.get("role") == "tool" for m in request.body.get("messages") or [])


def loop_script(write: ToolCall, read: ToolCall) -> Script:
    """Write the proof file, read it back, answer with what it says."""
    def script(request: Request) -> Turn:
        step = tool_results(request)
        if step == 0:
            return Turn(text="Writing the file.", tool_calls=[write])
        if step == 1:
            return Turn(text="Reading it back.", tool_calls=[read])
        return Turn(text=ANSWER)
    return script


def files_holding(roots: list[Path], secret: str) -> list[Path]:
    """Every file under `roots` that holds `secret`'s bytes."""
    return [p for root in roots for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def tool_names(calls: list[dict]) -> list[str]:
    """The tool calls the model made, in order, from the recorded responses."""
    return [c["function"]["name"] for call in calls for choice in json.loads(call["response"])["choices"]
            for c in choice["message"].get("tool_calls") or []]


def record_loop(cmd: list[str], base: Path, session: str, script: Script, key: str) -> dict:
    """`forge-record run -- CMD` in `base` (work/, home/, data/) against `script`, proxies at a trap."""
    trap = ProxyTrap()
    try:
        with ScriptedUpstream(script) as up:
            r = run_recorded(base, session, up.url, cmd, {"OPENAI_API_KEY": key, **trap.env()})
    finally:
        trap.close()
    return {"run": r, "base": base, "data": base / "data", "hits": trap.hits, "session": session}


def check_recorded(recorded: dict, harness: str, tools: tuple[str, str], key: str) -> list[dict]:
    """The loop ran for real, reached nothing but the recorder, was recorded whole, and left no key on disk."""
    r, base, session = recorded["run"], recorded["base"], recorded["session"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert recorded["hits"] == [], f"{harness} reached past the recorder"
    assert get_harness(harness).final_answer(r.stdout, RunContext("", base, base / "home", "", session)) == ANSWER
    assert (base / "work" / "proof.txt").read_text() == PROOF
    calls = [c for c in session_calls(recorded["data"], session, 3) if c["api"] == "chat"]
    assert len(calls) == 3 and all(c["complete"] and c["error"] is None and c["streamed"] for c in calls)
    assert all(c["path"] == "/v1/chat/completions" for c in calls)
    assert tool_names(calls) == list(tools)
    _, result = tool_exchange(recorded["data"], session, calls[1:], tools[1])
    assert "forgerl proof" in json.dumps(result), result
    assert f"session {session} ({harness})" in r.stderr and f"{tools[0]} x1" in r.stderr
    assert not files_holding([base], key[8:]), "the API key reached the disk"
    return calls


def check_sft(data: Path, out: Path, harness: str, session: str, tools: tuple[str, str]) -> None:
    """`tokens` and `verl-sft` of the recorded loop: one segment; veRL loads the shard, same ids as `tokens`."""
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    convert(data, out / "s", "--to", "verl-sft", "--harness", harness)
    convert(data, out / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--harness", harness)
    (row,) = rows(out / "t")
    assert row["segment_id"] == f"{session}:0" and row["num_turns"] == 3 and row["segment_reason"] == "start"
    files = sorted(str(p) for p in (out / "s").glob("train/*.parquet"))
    ds = ForgeSFTDataset(files, qwen_tokenizer(), {"pad_mode": "no_padding", "max_length": 131072,
                                                   "ignore_input_ids_mismatch": True})
    assert len(ds) == 1
    messages = ds.messages[0]
    made = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in made] == list(tools)
    results = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in made]
    assert "forgerl proof" in results[1]["content"]
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"] == ANSWER
    assert set(tools) <= {t["function"]["name"] for t in ds.tools[0]}
    item = ds[0]
    assert item["input_ids"].tolist() == row["input_ids"] and item["loss_mask"].tolist() == row["loss_mask"]
    assert item["loss_mask"].sum() > 0


def check_atif_and_analysis(data: Path, out: Path, harness: str, session: str, tools: tuple[str, str]) -> None:
    """ATIF validates with both tool calls; the analysis names the harness, kinds the tools write then read, and
    counts reading the written file back as the session's verification."""
    import atif

    from forgerl.analysis import connect

    convert(data, out / "a", "--to", "atif", "--harness", harness)
    (doc_path,) = (out / "a").glob("train/*.json")
    doc = json.loads(doc_path.read_text())
    atif.Trajectory.model_validate(doc)
    assert [c["function_name"] for s in doc["steps"] for c in s.get("tool_calls") or []] == list(tools)
    con = connect(data)
    assert con.sql(f"SELECT harness FROM session_info WHERE session_id = '{session}'").fetchall() == [(harness,)]
    kinds = con.sql(f"SELECT tool_name, kind FROM tool_calls WHERE session_id = '{session}' ORDER BY step").fetchall()
    assert kinds == [(tools[0], "write"), (tools[1], "read")]
    verified = con.sql(f"SELECT verified, check_kind FROM verification WHERE session_id = '{session}'").fetchall()
    assert verified == [(True, "reread")]


def sparql_script(shell: str) -> Script:
    """task_00067 through the harness's shell tool: 14 of the 15 checks pass (see runner_fixtures)."""
    def script(request: Request) -> Turn:
        if tool_results(request):
            return Turn(text="Wrote query_output.sparql.")
        command = f"cat > query_output.sparql <<'EOF'\n{SPARQL_QUERY}EOF"
        return Turn(text="Writing the query.", tool_calls=[ToolCall(shell, {"command": command})])
    return script


def forge_run_sparql(upstream: str, out: Path, harness: str) -> dict:
    """One graded `forge-run` of task_00067; returns its outcome row."""
    r = subprocess.run([FORGE_RUN, str(BENCH), "--task", SPARQL_TASK, "--harness", harness, "--upstream", upstream,
                        "--model", "qwen3", "--out", str(out)], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    (outcome,) = read_table(out, "outcomes").to_pylist()
    return outcome


def check_graded_sparql(upstream: str, out: Path, harness: str) -> dict:
    """task_00067 graded at 14/15 with the harness's final answer; returns the outcome's `extra`."""
    outcome = forge_run_sparql(upstream, out, harness)
    extra = json.loads(outcome["extra"])
    assert outcome["harness"] == harness and outcome["status"] == "failed", (outcome["status"], extra)
    assert abs(outcome["reward"] - SPARQL_SCORE) < 1e-9
    assert extra["final_answer"] == "Wrote query_output.sparql."
    return extra


def serve_turns(tmp_path: Path, harness: str, turns: list[str], trap: ProxyTrap, api: str = "chat",
                user_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run `harness` through its runner adapter against `forge-record serve --policy script:FILE`; its `api` calls.
    `user_env` is what the user would export (an OpenAI key by default)."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(turns))
    served = RecorderProcess(tmp_path / "data", None, "--policy", f"script:{script}", "--tokenizer",
                             str(TOKENIZER_DIR), "--served-model", "qwen3-policy").start()
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    adapter = get_harness(harness)
    ctx = RunContext("Write proof.txt", work, home, served.url, "sv", "qwen3-policy",
                     user_env or {"OPENAI_API_KEY": "sk-proj-servedservedservedserved"})
    try:
        argv, env = adapter.command(adapter.find(), ctx)
        r = subprocess.run(argv, cwd=work, env={"LANG": "C.UTF-8", **env, **trap.env()}, capture_output=True,
                           text=True, timeout=240, stdin=subprocess.DEVNULL)
    finally:
        served.stop()
    calls = [c for c in session_calls(tmp_path / "data", "sv", len(turns)) if c["api"] == api]
    return r, calls


def check_served(calls: list[dict], turns: list[str], tok) -> None:
    """Each call's ids decode to its scripted turn, and the second prompt continues the first call's tokens."""
    from forgerl.schema.toolcalls import parse_generation

    assert len(calls) == len(turns)
    for call, text in zip(calls, turns):
        ids = call["completion_token_ids"]
        assert tok.decode(ids[:-1], skip_special_tokens=False) == text
        assert call["policy_version"] == "qwen3-policy" and call["error"] is None
        parsed = parse_generation(text)
        message = json.loads(call["response"])["choices"][0]["message"]
        assert (message.get("content") or "") == parsed.text
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in message.get("tool_calls") or []] == [(c.name, c.arguments) for c in parsed.tool_calls]
    held = calls[0]["prompt_token_ids"] + calls[0]["completion_token_ids"]
    assert calls[1]["prompt_token_ids"][:len(held)] == held, "the second turn re-tokenised the history"
    assert "<tool_response>" in tok.decode(calls[1]["prompt_token_ids"][len(held):])


def check_served_loop(tmp_path: Path, harness: str, turns: list[str]) -> None:
    """The policy's tokens drive the real CLI (its shell tool writes proof.txt) and nothing else is reached."""
    from transformers import AutoTokenizer

    trap = ProxyTrap()
    try:
        r, calls = serve_turns(tmp_path, harness, turns, trap)
    finally:
        trap.close()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert trap.hits == []
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    assert not files_holding([tmp_path], "servedservedserved"), "the API key reached the disk"
    ctx = RunContext("", tmp_path / "work", tmp_path / "home", "", "sv")
    assert get_harness(harness).final_answer(r.stdout, ctx) == "Done."
    check_served(calls, turns, AutoTokenizer.from_pretrained(TOKENIZER_DIR))
