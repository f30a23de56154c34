"""What the Qwen Code and pi (and Gemini CLI) end-to-end tests share beyond tests/harness_checks.py: the tool
loop's proof and answer, and the checks of its recording, conversions, graded run and served run.

Both harnesses speak Chat Completions to the scripted upstream. The model
script writes a file with the harness's own write tool, reads it back with
its read tool, then answers. Node 24 honours `HTTP(S)_PROXY` when
`NODE_USE_ENV_PROXY=1`, so aiming the proxies at a `harness_checks.ProxyTrap`
(with the recorder in `NO_PROXY`) catches any request a harness makes to
anywhere but the recorder: without `QWEN_USAGE_STATISTICS_ENABLED=false` the
trap sees Qwen Code's `CONNECT …rum.aliyuncs.com:443`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from forgerl.harnesses import RunContext, get_harness
from forgerl.harnesses import node_path

from conftest import session_calls
from convert_fixtures import qwen_tokenizer
from harness_checks import (ProxyTrap, atif_calls, atif_doc, check_served_ids, files_holding, loop_script,
                            one_segment_sft, record_trapped, serve_script, served_turns, tool_exchange)
from scripted_upstream import Script, ToolCall

PROOF = "forgerl proof\n"
ANSWER = "The file says: forgerl proof"


def proof_loop(write: ToolCall, read: ToolCall) -> Script:
    """Write the proof file, read it back, answer with what it says."""
    return loop_script(write, read, ANSWER)


def tool_names(calls: list[dict]) -> list[str]:
    """The tool calls the model made, in order, from the recorded responses."""
    return [c["function"]["name"] for call in calls for choice in json.loads(call["response"])["choices"]
            for c in choice["message"].get("tool_calls") or []]


def record_loop(cmd: list[str], base: Path, session: str, script: Script, key: str) -> dict:
    """`forge-record run -- CMD` in `base` (work/, home/, data/) against `script`, proxies at a trap, Node 24 on
    PATH."""
    return record_trapped(base, session, script, cmd, {"OPENAI_API_KEY": key, "PATH": node_path()})


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
    assert not files_holding(key[8:], base), "the API key reached the disk"
    return calls


def check_sft(data: Path, out: Path, harness: str, session: str, tools: tuple[str, str]) -> None:
    """`tokens` and `verl-sft` of the recorded loop: one segment; veRL loads the shard, same ids as `tokens`."""
    _, ds = one_segment_sft(data, out, harness, session, 3, max_length=131072)
    messages = ds.messages[0]
    made = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in made] == list(tools)
    results = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in made]
    assert "forgerl proof" in results[1]["content"]
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"] == ANSWER
    assert set(tools) <= {t["function"]["name"] for t in ds.tools[0]}
    assert ds[0]["loss_mask"].sum() > 0


def check_atif_and_analysis(data: Path, out: Path, harness: str, session: str, tools: tuple[str, str]) -> None:
    """ATIF validates with both tool calls; the analysis names the harness, kinds the tools write then read, and
    counts reading the written file back as the session's verification."""
    from forgerl.analysis import connect

    doc = atif_doc(data, out / "a", harness)
    assert [c["function_name"] for c in atif_calls(doc)] == list(tools)
    con = connect(data)
    assert con.sql(f"SELECT harness FROM session_info WHERE session_id = '{session}'").fetchall() == [(harness,)]
    kinds = con.sql(f"SELECT tool_name, kind FROM tool_calls WHERE session_id = '{session}' ORDER BY step").fetchall()
    assert kinds == [(tools[0], "write"), (tools[1], "read")]
    verified = con.sql(f"SELECT verified, check_kind FROM verification WHERE session_id = '{session}'").fetchall()
    assert verified == [(True, "reread")]


def serve_turns(tmp_path: Path, harness: str, turns: list[str], api: str = "chat",
                user_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, list[dict], list[str]]:
    """Run `harness` through its runner adapter against `forge-record serve --policy script:FILE`, its proxies at a
    `ProxyTrap`: the run, its `api` calls, what the trap was asked. `user_env` is what the user would export (an
    OpenAI key by default)."""
    served = serve_script(tmp_path, turns)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    adapter = get_harness(harness)
    ctx = RunContext("Write proof.txt", work, home, served.url, "sv", "qwen3-policy",
                     user_env or {"OPENAI_API_KEY": "sk-proj-servedservedservedserved"})
    try:
        with ProxyTrap() as trap:
            argv, env = adapter.command(adapter.find(), ctx)
            r = subprocess.run(argv, cwd=work, env={"LANG": "C.UTF-8", **env, **trap.env()}, capture_output=True,
                               text=True, timeout=240, stdin=subprocess.DEVNULL)
    finally:
        served.stop()
    calls = [c for c in session_calls(tmp_path / "data", "sv", len(turns)) if c["api"] == api]
    return r, calls, trap.hits


def check_served(calls: list[dict], turns: list[str]) -> None:
    """Each call's ids decode to its scripted turn, what the harness was sent is that turn's parse, and the second
    prompt continues the first call's tokens."""
    from forgerl.schema.toolcalls import parse_generation

    check_served_ids(calls, turns, "chat")
    for call, text in zip(calls, turns):
        parsed = parse_generation(text)
        message = json.loads(call["response"])["choices"][0]["message"]
        assert (message.get("content") or "") == parsed.text
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in message.get("tool_calls") or []] == [(c.name, c.arguments) for c in parsed.tool_calls]
    held = calls[0]["prompt_token_ids"] + calls[0]["completion_token_ids"]
    assert "<tool_response>" in qwen_tokenizer().decode(calls[1]["prompt_token_ids"][len(held):])


def check_served_loop(tmp_path: Path, harness: str, shell: str) -> None:
    """The policy's tokens drive the real CLI (its shell tool writes proof.txt) and nothing else is reached."""
    turns = served_turns(shell)
    r, calls, hits = serve_turns(tmp_path, harness, turns)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert hits == []
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    assert not files_holding("servedservedserved", tmp_path), "the API key reached the disk"
    ctx = RunContext("", tmp_path / "work", tmp_path / "home", "", "sv")
    assert get_harness(harness).final_answer(r.stdout, ctx) == "Done."
    check_served(calls, turns)
