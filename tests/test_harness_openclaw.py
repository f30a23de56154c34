"""OpenClaw 2026.9 (npm openclaw, pinned; on the pinned Node 24) end to end: record, convert, run a task, serve.

The real `openclaw agent --local` (its embedded agent) talks Chat Completions
to the scripted upstream (or the scripted policy) through the recorder, as
its harness module (`harnesses/`) aims it: a provider in `openclaw.json` under its own state
folder, memory search, update checks and telemetry off, no workspace bootstrap
files. A `harness_checks.ProxyTrap` catches any other host it tries. After each tool
result OpenClaw appends a user note (its internal context), so the scripts
count tool results instead of looking at the last message. The recording is
made once per module and shared by the record and convert tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forgerl.analysis import connect
from forgerl.harnesses import RunContext, get_harness
from forgerl.harnesses import node_path
from forgerl.schema.store import read_table

from conftest import session_parts
from convert_fixtures import qwen_tokenizer, rows
from harness_checks import (atif_calls, atif_doc, chat_calls, check_same_ids, check_served_ids, convert_sft_and_tokens,
                            files_holding, graded_sparql, loop_script, needs, record_trapped, run_served, served_turns,
                            sparql_script)
from opencode_openclaw_fixtures import ANSWER, check_policy_task
from scripted_upstream import ToolCall

pytestmark = pytest.mark.slow
KEY = "sk-proj-openclawtestopenclawtestopenc"
PROMPT = "Write proof.txt and read it back."


def openclaw() -> Path:
    return needs("openclaw")


def agent_argv(session: str, prompt: str) -> list[str]:
    return [str(openclaw()), "agent", "--local", "--session-id", session, "--message", prompt, "--json"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, object, Path, list[str]]:
    base = tmp_path_factory.mktemp("openclaw")
    script = loop_script(ToolCall("exec", {"command": "echo forgerl > proof.txt"}),
                         ToolCall("read", {"path": str(base / "work" / "proof.txt")}), ANSWER)
    run = record_trapped(base, "ocl", script, [*agent_argv("ocl", PROMPT), "--model", "gpt-5.4"],
                         {"PATH": node_path(), "OPENAI_API_KEY": KEY})
    r = run["run"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return base, r, base / "data", run["hits"]


def test_records_a_tool_loop(recorded):
    base, r, data, phoned = recorded
    assert phoned == [], "OpenClaw called something besides the recorder"
    assert (base / "work" / "proof.txt").read_text() == "forgerl\n"
    assert sorted(p.name for p in (base / "work").iterdir()) == ["proof.txt"], "bootstrap files were written"
    ctx = RunContext("", base / "work", base / "home", "", "ocl")
    assert get_harness("openclaw").final_answer(r.stdout, ctx) == ANSWER
    calls = chat_calls(data, "ocl", 3, "gpt-5.4")
    assert {"exec", "process", "read", "write", "edit", "apply_patch", "ls", "tool_search", "tool_call"} <= {
        t["name"] for t in json.loads(calls[0]["tools"])}
    parts = {h: json.loads(p) for h, p in session_parts(data, "ocl").items()}
    made = [parts[h]["tool_name"] for c in calls for h in c["output_refs"] if parts[h]["type"] == "tool_call"]
    assert made == ["exec", "read"]
    # the history carries the calls under ids OpenClaw rewrote (`call_x` -> `callx`): the results answer those
    named = {p["call_id"]: p["tool_name"] for p in parts.values() if p["type"] == "tool_call"}
    read_back = [p for p in parts.values() if p["type"] == "tool_result" and named.get(p["call_id"]) == "read"]
    assert read_back and "forgerl" in read_back[0]["text"]
    sessions = read_table(data, "sessions").to_pylist()
    assert [(s["harness"], s["harness_rank"], s["harness_evidence"]) for s in sessions] == [
        ("openclaw", 3, "system-prompt:running inside OpenClaw")]
    kinds = connect(data).sql("SELECT tool_name, kind FROM tool_calls WHERE session_id = 'ocl' ORDER BY turn")
    assert kinds.fetchall() == [("exec", "shell"), ("read", "read")]
    assert "session ocl (openclaw)" in r.stderr and "exec x1" in r.stderr and "read x1" in r.stderr
    leaked = files_holding(KEY[8:], data, base / "home", base / "work")
    assert not leaked, leaked


def test_tokens_and_verl_sft(recorded, tmp_path):
    """OpenClaw's requests are not append-only: each ends with a transient user note (its runtime context:
    active exec sessions, subagents, media tasks) that the next request drops, and the history carries the
    tool call ids rewritten. So every call starts its own segment, chained to the one before."""
    _, _, data, _ = recorded
    manifest, token_rows, ds = convert_sft_and_tokens(data, tmp_path, "openclaw")
    assert manifest["counts"]["sessions"] == 1 and not manifest["counts"].get("tools_absent_calls")
    segs = {r["segment_id"]: r for r in token_rows}
    assert {k: (r["segment_reason"], r["parent_segment"], r["parent_position"], r["num_turns"], r["harness"])
            for k, r in segs.items()} == {"ocl:0": ("start", None, None, 1, "openclaw"),
                                          "ocl:1": ("edited_history", "ocl:0", 1, 1, "openclaw"),
                                          "ocl:2": ("edited_history", "ocl:1", 1, 1, "openclaw")}
    order = [r["segment_id"] for r in rows(tmp_path / "s")]
    assert sorted(order) == sorted(segs)
    last = ds.messages[order.index("ocl:2")]
    calls = [c for m in last if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == ["exec", "read"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "echo forgerl > proof.txt"}
    assert last[-1]["role"] == "assistant" and ANSWER in str(last[-1]["content"])
    assert {"exec", "read"} <= {t["function"]["name"] for t in ds.tools[0]}
    for i, segment_id in enumerate(order):
        check_same_ids(ds[i], segs[segment_id], segment_id)


def test_atif(recorded, tmp_path):
    _, _, data, _ = recorded
    doc = atif_doc(data, tmp_path / "a", "openclaw")
    assert [c["function_name"] for c in atif_calls(doc, copied=False)] == ["exec", "read"]
    assert ANSWER in doc["steps"][-1]["message"]


def test_forge_run_grades_a_task(scripted, tmp_path):
    openclaw()
    row, extra, calls = graded_sparql("openclaw", scripted(sparql_script("exec")).url, tmp_path / "data")
    assert row["model"] == "gpt-5.4"
    events = [json.loads(line) for line in extra["harness_transcript"].splitlines()]
    results = [e["message"] for e in events if e["type"] == "message" and e["message"]["role"] == "toolResult"]
    assert [m["toolName"] for m in results] == ["exec"]
    assert len(calls) == 2 and all(c["error"] is None and c["status"] == 200 for c in calls)


OPENCLAW_TURNS = served_turns("exec")


def test_served_by_the_policy(tmp_path, monkeypatch):
    r, calls, phoned = run_served(tmp_path, monkeypatch, OPENCLAW_TURNS,
                                  [*agent_argv("os", "Write proof.txt"), "--model", "qwen3-policy"], "os",
                                  {"PATH": node_path(), "OPENAI_API_KEY": KEY})
    assert phoned == []
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    assert get_harness("openclaw").final_answer(r.stdout, RunContext("", tmp_path, tmp_path, "", "os")) == "Done."
    # no continuation check: OpenClaw's second prompt drops the runtime-context note that ended the first
    check_served_ids(calls, OPENCLAW_TURNS, "chat", continues=False)
    assert "<tool_response>" in qwen_tokenizer().decode(calls[1]["prompt_token_ids"])
    assert list((tmp_path / "openclaw").glob("agents/*/agent/openclaw-agent.sqlite"))  # its state, in the scratch
    assert not files_holding(KEY[8:], tmp_path)


def test_forge_run_served_by_the_policy(tmp_path):
    check_policy_task("openclaw", tmp_path)
