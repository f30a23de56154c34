"""OpenClaw 2026.9 (npm openclaw, pinned; on the pinned Node 24) end to end: record, convert, run a task, serve.

The real `openclaw agent --local` (its embedded agent) talks Chat Completions
to the scripted upstream (or the scripted policy) through the recorder, as
`recorder/launch.py` aims it: a provider in `openclaw.json` under its own state
folder, memory search, update checks and telemetry off, no workspace bootstrap
files. A `PhoneHomeTrap` proxy catches any other host it tries. After each tool
result OpenClaw appends a user note (its internal context), so the scripts
count tool results instead of looking at the last message. The recording is
made once per module and shared by the record and convert tests.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from forgerl.analysis import connect
from forgerl.runners.harnesses import RunContext, get_harness
from forgerl.runners.harnesses.base import node_path
from forgerl.schema.store import read_table

from conftest import session_calls, session_parts
from convert_fixtures import TOKENIZER_DIR, convert, qwen_tokenizer, rows
from opencode_openclaw_fixtures import (ANSWER, check_served, files_holding, loop_script, pinned_cli, run_recorded,
                                        run_policy_task, run_served, run_sparql_task, sparql_script)
from runner_fixtures import NOVEL_ANSWER, NOVEL_SCORE, SPARQL_SCORE
from scripted_upstream import ToolCall

pytestmark = pytest.mark.slow
KEY = "sk-proj-openclawtestopenclawtestopenc"
PROMPT = "Write proof.txt and read it back."


def openclaw() -> Path:
    return pinned_cli("openclaw")


def agent_argv(session: str, prompt: str) -> list[str]:
    return [str(openclaw()), "agent", "--local", "--session-id", session, "--message", prompt, "--json"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, Path, list[str]]:
    base = tmp_path_factory.mktemp("openclaw")
    script = loop_script(ToolCall("exec", {"command": "echo forgerl > proof.txt"}),
                         ToolCall("read", {"path": str(base / "work" / "proof.txt")}))
    r, phoned = run_recorded(base, "ocl", script,
                             [*agent_argv("ocl", PROMPT), "--model", "gpt-5.4"],
                             {"PATH": node_path(), "OPENAI_API_KEY": KEY})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return base, r, base / "data", phoned


def test_records_a_tool_loop(recorded):
    base, r, data, phoned = recorded
    assert phoned == [], "OpenClaw called something besides the recorder"
    assert (base / "work" / "proof.txt").read_text() == "forgerl\n"
    assert sorted(p.name for p in (base / "work").iterdir()) == ["proof.txt"], "bootstrap files were written"
    ctx = RunContext("", base / "work", base / "home", "", "ocl")
    assert get_harness("openclaw").final_answer(r.stdout, ctx) == ANSWER
    calls = session_calls(data, "ocl", 3)
    assert len(calls) == 3 and all(c["api"] == "chat" and c["complete"] and c["error"] is None for c in calls)
    assert all(c["path"] == "/v1/chat/completions" and c["model_requested"] == "gpt-5.4" for c in calls)
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
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    _, _, data, _ = recorded
    manifest = convert(data, tmp_path / "s", "--to", "verl-sft", "--harness", "openclaw")
    assert manifest["counts"]["sessions"] == 1 and not manifest["counts"].get("tools_absent_calls")
    convert(data, tmp_path / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--harness", "openclaw")
    segs = {r["segment_id"]: r for r in rows(tmp_path / "t")}
    assert {k: (r["segment_reason"], r["parent_segment"], r["parent_position"], r["num_turns"], r["harness"])
            for k, r in segs.items()} == {"ocl:0": ("start", None, None, 1, "openclaw"),
                                          "ocl:1": ("edited_history", "ocl:0", 1, 1, "openclaw"),
                                          "ocl:2": ("edited_history", "ocl:1", 1, 1, "openclaw")}
    files = sorted(str(p) for p in (tmp_path / "s").glob("train/*.parquet"))
    ds = ForgeSFTDataset(files, qwen_tokenizer(), {"pad_mode": "no_padding", "max_length": 65536,
                                                   "ignore_input_ids_mismatch": True})
    order = [r["segment_id"] for r in rows(tmp_path / "s")]
    assert sorted(order) == sorted(segs)
    last = ds.messages[order.index("ocl:2")]
    calls = [c for m in last if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == ["exec", "read"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "echo forgerl > proof.txt"}
    assert last[-1]["role"] == "assistant" and ANSWER in str(last[-1]["content"])
    assert {"exec", "read"} <= {t["function"]["name"] for t in ds.tools[0]}
    for i, segment_id in enumerate(order):
        item = ds[i]
        assert item["input_ids"].tolist() == segs[segment_id]["input_ids"]
        assert item["loss_mask"].tolist() == segs[segment_id]["loss_mask"]


def test_atif(recorded, tmp_path):
    import atif

    _, _, data, _ = recorded
    convert(data, tmp_path / "a", "--to", "atif", "--harness", "openclaw")
    (doc_path,) = (tmp_path / "a").glob("train/*.json")
    doc = json.loads(doc_path.read_text())
    atif.Trajectory.model_validate(doc)
    calls = [c for s in doc["steps"] if not s.get("is_copied_context") for c in s.get("tool_calls") or []]
    assert [c["function_name"] for c in calls] == ["exec", "read"]
    assert ANSWER in doc["steps"][-1]["message"]


def test_forge_run_grades_a_task(scripted, tmp_path):
    openclaw()
    row, extra, calls = run_sparql_task("openclaw", scripted(sparql_script("exec")).url, tmp_path / "data")
    assert row["harness"] == "openclaw" and row["model"] == "gpt-5.4"
    assert row["reward"] == pytest.approx(SPARQL_SCORE) and row["status"] == "failed"
    assert extra["final_answer"] == "Wrote query_output.sparql."
    events = [json.loads(line) for line in extra["harness_transcript"].splitlines()]
    results = [e["message"] for e in events if e["type"] == "message" and e["message"]["role"] == "toolResult"]
    assert [m["toolName"] for m in results] == ["exec"]
    assert len(calls) == 2 and all(c["error"] is None and c["status"] == 200 for c in calls)


OPENCLAW_TURNS = ['I\'ll write it.\n<tool_call>\n{"name": "exec", "arguments": {"command": "echo forgerl > proof.txt"}}'
                  '\n</tool_call>', "<think>\nIt worked.\n</think>\n\nDone."]


def test_served_by_the_policy(tmp_path, monkeypatch):
    r, calls, phoned = run_served(tmp_path, monkeypatch, OPENCLAW_TURNS,
                                  [*agent_argv("os", "Write proof.txt"), "--model", "qwen3-policy"], "os",
                                  {"PATH": node_path(), "OPENAI_API_KEY": KEY})
    assert phoned == []
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    assert get_harness("openclaw").final_answer(r.stdout, RunContext("", tmp_path, tmp_path, "", "os")) == "Done."
    check_served(calls, OPENCLAW_TURNS)
    # no continuation check: OpenClaw's second prompt drops the runtime-context note that ended the first
    assert "<tool_response>" in qwen_tokenizer().decode(calls[1]["prompt_token_ids"])
    assert list((tmp_path / "openclaw").glob("agents/*/agent/openclaw-agent.sqlite"))  # its state, in the scratch
    assert not files_holding(KEY[8:], tmp_path)


def test_forge_run_served_by_the_policy(tmp_path):
    row, calls = run_policy_task("openclaw", tmp_path)
    assert row["reward"] == pytest.approx(NOVEL_SCORE) and row["model"] == "gpt-5.4"
    assert json.loads(row["extra"])["final_answer"] == NOVEL_ANSWER
    assert len(calls) == 1 and calls[0]["completion_token_ids"] and calls[0]["policy_version"] == "qwen3-policy"
