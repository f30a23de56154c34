"""OpenCode 1.18 (npm opencode-ai, pinned) end to end: record, convert (tokens, verl-sft, ATIF), run a task, serve.

The real `opencode run` talks Chat Completions to the scripted upstream (or
the scripted policy) through the recorder, as `recorder/launch.py` aims it:
a custom `@ai-sdk/openai-compatible` provider in `OPENCODE_CONFIG_CONTENT`,
every permission granted, its phone-home off. A `PhoneHomeTrap` proxy catches
any other host it tries. `--title` spares the title-writing model call. The
recording is made once per module and shared by the record and convert tests.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from forgerl.analysis import connect
from forgerl.runners.harnesses import RunContext, get_harness
from forgerl.schema.store import read_table

from conftest import session_calls, session_parts
from convert_fixtures import TOKENIZER_DIR, convert, qwen_tokenizer, rows
from opencode_openclaw_fixtures import (ANSWER, check_served, files_holding, loop_script, pinned_cli, run_recorded,
                                        run_policy_task, run_served, run_sparql_task, sparql_script)
from runner_fixtures import NOVEL_ANSWER, NOVEL_SCORE, SPARQL_SCORE
from scripted_upstream import ToolCall

pytestmark = pytest.mark.slow
KEY = "sk-proj-opencodetestopencodetestopen"


def opencode() -> Path:
    return pinned_cli("opencode")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, Path, list[str]]:
    base = tmp_path_factory.mktemp("opencode")
    script = loop_script(ToolCall("bash", {"command": "echo forgerl > proof.txt"}),
                         ToolCall("read", {"filePath": str(base / "work" / "proof.txt")}))
    r, phoned = run_recorded(base, "oc", script,
                             [str(opencode()), "run", "--format", "json", "--title", "proof", "-m", "openai/gpt-5.4",
                              "Write proof.txt and read it back."], {"OPENAI_API_KEY": KEY})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return base, r, base / "data", phoned


def test_records_a_tool_loop(recorded):
    base, r, data, phoned = recorded
    assert phoned == [], "OpenCode called something besides the recorder"
    assert (base / "work" / "proof.txt").read_text() == "forgerl\n"
    ctx = RunContext("", base / "work", base / "home", "", "oc")
    assert get_harness("opencode").final_answer(r.stdout, ctx) == ANSWER
    calls = session_calls(data, "oc", 3)
    assert len(calls) == 3 and all(c["api"] == "chat" and c["complete"] and c["error"] is None for c in calls)
    assert all(c["path"] == "/v1/chat/completions" and c["model_requested"] == "gpt-5.4" for c in calls)
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
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    _, _, data, _ = recorded
    manifest = convert(data, tmp_path / "s", "--to", "verl-sft", "--harness", "opencode")
    assert manifest["counts"]["sessions"] == 1 and not manifest["counts"].get("tools_absent_calls")
    convert(data, tmp_path / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--harness", "opencode")
    (row,) = rows(tmp_path / "t")
    assert row["segment_id"] == "oc:0" and row["num_turns"] == 3 and row["harness"] == "opencode"
    files = sorted(str(p) for p in (tmp_path / "s").glob("train/*.parquet"))
    ds = ForgeSFTDataset(files, qwen_tokenizer(), {"pad_mode": "no_padding", "max_length": 65536,
                                                   "ignore_input_ids_mismatch": True})
    calls = [c for m in ds.messages[0] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == ["bash", "read"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "echo forgerl > proof.txt"}
    assert ds.messages[0][-1]["role"] == "assistant" and ANSWER in str(ds.messages[0][-1]["content"])
    assert "bash" in {t["function"]["name"] for t in ds.tools[0]}
    item = ds[0]
    assert item["input_ids"].tolist() == row["input_ids"]
    assert item["loss_mask"].tolist() == row["loss_mask"]


def test_atif(recorded, tmp_path):
    import atif

    _, _, data, _ = recorded
    convert(data, tmp_path / "a", "--to", "atif", "--harness", "opencode")
    (doc_path,) = (tmp_path / "a").glob("train/*.json")
    doc = json.loads(doc_path.read_text())
    atif.Trajectory.model_validate(doc)
    calls = [c for s in doc["steps"] if not s.get("is_copied_context") for c in s.get("tool_calls") or []]
    assert [c["function_name"] for c in calls] == ["bash", "read"]
    assert ANSWER in doc["steps"][-1]["message"]


def test_forge_run_grades_a_task(scripted, tmp_path):
    opencode()
    row, extra, calls = run_sparql_task("opencode", scripted(sparql_script("bash")).url, tmp_path / "data")
    assert row["harness"] == "opencode" and row["model"] == "gpt-5.4"
    assert row["reward"] == pytest.approx(SPARQL_SCORE) and row["status"] == "failed"
    assert extra["final_answer"] == "Wrote query_output.sparql."
    transcript = [json.loads(line) for line in extra["harness_transcript"].splitlines()]
    tools = [p for m in transcript for p in m["parts"] if p["type"] == "tool"]
    assert [(t["tool"], t["state"]["status"]) for t in tools] == [("bash", "completed")]
    assert len(calls) == 2 and all(c["error"] is None and c["status"] == 200 for c in calls)


OPENCODE_TURNS = ['I\'ll write it.\n<tool_call>\n{"name": "bash", "arguments": {"command": "echo forgerl > proof.txt"}}'
                  '\n</tool_call>', "<think>\nIt worked.\n</think>\n\nDone."]


def test_served_by_the_policy(tmp_path, monkeypatch):
    r, calls, phoned = run_served(tmp_path, monkeypatch, OPENCODE_TURNS,
                                  [str(opencode()), "run", "--format", "json", "--title", "proof", "-m",
                                   "qwen3-policy", "Write proof.txt"], "os", {"OPENAI_API_KEY": KEY})
    assert phoned == []
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    assert get_harness("opencode").final_answer(r.stdout, RunContext("", tmp_path, tmp_path, "", "os")) == "Done."
    check_served(calls, OPENCODE_TURNS)
    held = calls[0]["prompt_token_ids"] + calls[0]["completion_token_ids"]
    assert calls[1]["prompt_token_ids"][:len(held)] == held, "the second turn re-tokenised the history"
    assert not files_holding(KEY[8:], tmp_path)


def test_forge_run_served_by_the_policy(tmp_path):
    row, calls = run_policy_task("opencode", tmp_path)
    assert row["reward"] == pytest.approx(NOVEL_SCORE) and row["model"] == "gpt-5.4"
    assert json.loads(row["extra"])["final_answer"] == NOVEL_ANSWER
    assert len(calls) == 1 and calls[0]["completion_token_ids"] and calls[0]["policy_version"] == "qwen3-policy"
