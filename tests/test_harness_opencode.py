"""OpenCode 1.18 (npm opencode-ai, pinned) end to end: record, convert (tokens, verl-sft, ATIF), run a task, serve.

The real `opencode run` talks Chat Completions to the scripted upstream (or
the scripted policy) through the recorder, as its harness module (`harnesses/`) aims it:
a custom `@ai-sdk/openai-compatible` provider in `OPENCODE_CONFIG_CONTENT`,
every permission granted, its phone-home off. A `harness_checks.ProxyTrap` catches
any other host it tries. `--title` spares the title-writing model call. The
recording is made once per module and shared by the record and convert tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forgerl.analysis import connect
from forgerl.harnesses import RunContext, get_harness
from forgerl.schema.store import read_table

from conftest import session_parts
from harness_checks import (atif_calls, atif_doc, chat_calls, check_served_ids, files_holding, graded_sparql,
                            loop_script, needs, one_segment_sft, record_trapped, run_served, served_turns,
                            sparql_script)
from opencode_openclaw_fixtures import ANSWER, check_policy_task
from scripted_upstream import ToolCall

pytestmark = pytest.mark.slow
KEY = "sk-proj-opencodetestopencodetestopen"


def opencode() -> Path:
    return needs("opencode")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, object, Path, list[str]]:
    base = tmp_path_factory.mktemp("opencode")
    script = loop_script(ToolCall("bash", {"command": "echo forgerl > proof.txt"}),
                         ToolCall("read", {"filePath": str(base / "work" / "proof.txt")}), ANSWER)
    run = record_trapped(base, "oc", script,
                         [str(opencode()), "run", "--format", "json", "--title", "proof", "-m", "openai/gpt-5.4",
                          "Write proof.txt and read it back."], {"OPENAI_API_KEY": KEY})
    r = run["run"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return base, r, base / "data", run["hits"]


def test_records_a_tool_loop(recorded):
    base, r, data, phoned = recorded
    assert phoned == [], "OpenCode called something besides the recorder"
    assert (base / "work" / "proof.txt").read_text() == "forgerl\n"
    ctx = RunContext("", base / "work", base / "home", "", "oc")
    assert get_harness("opencode").final_answer(r.stdout, ctx) == ANSWER
    calls = chat_calls(data, "oc", 3, "gpt-5.4")
    # a gpt-* model gets apply_patch in place of edit and write
    assert sorted(t["name"] for t in json.loads(calls[0]["tools"])) == [
        "apply_patch", "bash", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch"]
    parts = [json.loads(p) for p in session_parts(data, "oc").values()]
    made = {p["call_id"]: p["tool_name"] for p in parts if p["type"] == "tool_call"}
    assert sorted(made.values()) == ["bash", "read"]
    read_back = [p for p in parts if p["type"] == "tool_result" and made.get(p["call_id"]) == "read"]
    assert read_back and "forgerl" in read_back[0]["text"]
    sessions = read_table(data, "sessions").to_pylist()
    assert [(s["harness"], s["harness_rank"], s["harness_evidence"]) for s in sessions] == [
        ("opencode", 3, "system-prompt:You are OpenCode, ")]  # its prompt for gpt-* models
    kinds = connect(data).sql("SELECT tool_name, kind FROM tool_calls WHERE session_id = 'oc' ORDER BY turn")
    assert kinds.fetchall() == [("bash", "shell"), ("read", "read")]
    assert "session oc (opencode)" in r.stderr and "bash x1" in r.stderr and "read x1" in r.stderr
    leaked = files_holding(KEY[8:], data, base / "home", base / "work")
    assert not leaked, leaked


def test_tokens_and_verl_sft(recorded, tmp_path):
    _, _, data, _ = recorded
    _, ds = one_segment_sft(data, tmp_path, "opencode", "oc", 3)  # veRL's ids are the `tokens` row's
    calls = [c for m in ds.messages[0] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == ["bash", "read"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "echo forgerl > proof.txt"}
    assert ds.messages[0][-1]["role"] == "assistant" and ANSWER in str(ds.messages[0][-1]["content"])
    assert "bash" in {t["function"]["name"] for t in ds.tools[0]}


def test_atif(recorded, tmp_path):
    _, _, data, _ = recorded
    doc = atif_doc(data, tmp_path / "a", "opencode")
    assert [c["function_name"] for c in atif_calls(doc, copied=False)] == ["bash", "read"]
    assert ANSWER in doc["steps"][-1]["message"]


def test_forge_run_grades_a_task(scripted, tmp_path):
    opencode()
    row, extra, calls = graded_sparql("opencode", scripted(sparql_script("bash")).url, tmp_path / "data")
    assert row["model"] == "gpt-5.4"
    transcript = [json.loads(line) for line in extra["harness_transcript"].splitlines()]
    tools = [p for m in transcript for p in m["parts"] if p["type"] == "tool"]
    assert [(t["tool"], t["state"]["status"]) for t in tools] == [("bash", "completed")]
    assert len(calls) == 2 and all(c["error"] is None and c["status"] == 200 for c in calls)


OPENCODE_TURNS = served_turns("bash")


def test_served_by_the_policy(tmp_path, monkeypatch):
    r, calls, phoned = run_served(tmp_path, monkeypatch, OPENCODE_TURNS,
                                  [str(opencode()), "run", "--format", "json", "--title", "proof", "-m",
                                   "qwen3-policy", "Write proof.txt"], "os", {"OPENAI_API_KEY": KEY})
    assert phoned == []
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    assert get_harness("opencode").final_answer(r.stdout, RunContext("", tmp_path, tmp_path, "", "os")) == "Done."
    check_served_ids(calls, OPENCODE_TURNS, "chat")  # and the second turn continues the first call's tokens
    assert not files_holding(KEY[8:], tmp_path)


def test_forge_run_served_by_the_policy(tmp_path):
    check_policy_task("opencode", tmp_path)
