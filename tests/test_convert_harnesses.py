"""Thread reconstruction on real Claude Code (subagent, compaction) and Codex sessions.

Recorded once per module through `forge-record run` with the npm CLIs and a
scripted upstream (see convert_harness_fixtures).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import session_calls
from convert_fixtures import TOKENIZER_DIR, convert, qwen_tokenizer, rows
from convert_harness_fixtures import SUB_PROMPT, SUMMARY, claude_script, codex_script, record_claude, record_codex
from harness_checks import atif_doc, check_same_ids, convert_sft_and_tokens, load_sft, needs
from scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def harness_data(tmp_path_factory) -> Path:
    claude, codex = needs("claude"), needs("codex")
    base = tmp_path_factory.mktemp("harness")
    with ScriptedUpstream(claude_script) as up:
        runs = record_claude(claude, base, up.url)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-500:] for r in runs]
    with ScriptedUpstream(codex_script) as up:
        r = record_codex(codex, base, up.url)
    assert r.returncode == 0, r.stderr[-500:]
    session_calls(base / "data", "cx", 2)
    return base / "data"


def test_claude_code_subagent_and_compaction_segments(harness_data, tmp_path):
    manifest = convert(harness_data, tmp_path / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR,
                       "--harness", "claude-code")
    segs = {r["segment_id"]: r for r in rows(tmp_path / "t")}
    assert {k: (r["segment_reason"], r["parent_segment"], r["parent_position"], r["num_turns"])
            for k, r in segs.items()} == {
        "cc:0": ("start", None, None, 2),                  # main agent: delegate, then answer
        "cc:1": ("subagent", "cc:0", 1, 1),                # the Agent tool's conversation, interleaved
        "cc:2": ("edited_history", "cc:0", 2, 1),          # --continue rewrites reminders; asks for the summary
        "cc:3": ("compaction", "cc:2", 1, 1),              # restarts from the summary the model wrote
    }
    assert manifest["counts"]["segments_subagent"] == 1 and manifest["counts"]["segments_compaction"] == 1
    tok = qwen_tokenizer()
    # every model output is trained exactly once, inside its own segment
    trained = {k: tok.decode([i for i, m in zip(r["input_ids"], r["loss_mask"]) if m]) for k, r in segs.items()}
    assert "I will delegate." in trained["cc:0"] and "42 files" in trained["cc:0"]
    assert "The directory holds 42 files." in trained["cc:1"] and SUB_PROMPT not in trained["cc:1"]
    assert trained["cc:2"].count(SUMMARY) == 1 and "I will delegate." not in trained["cc:2"]
    assert "Done: there are 42 files." in trained["cc:3"] and SUMMARY not in trained["cc:3"]
    assert all(r["retokenized"] for r in segs.values())


def test_every_output_cuts_claude_code_where_the_dataset_stored_it(harness_data, tmp_path):
    """Segments are decided once, when the calls are written: tokens, verl-sft, ATIF and the turn views
    read the stored placement, so they all name the same segments with the same calls."""
    from forgerl.analysis import connect

    stored = {}
    for c in session_calls(harness_data, "cc", 1):
        if c["segment_index"] is not None:
            stored.setdefault(f"cc:{c['segment_index']}", []).append(c["call_id"])
    assert len(stored) == 4
    convert(harness_data, tmp_path / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--harness", "claude-code")
    assert {r["segment_id"]: r["call_ids"] for r in rows(tmp_path / "t")} == stored
    convert(harness_data, tmp_path / "s", "--to", "verl-sft", "--harness", "claude-code", "--no-dedupe")
    assert sorted(r["segment_id"] for r in rows(tmp_path / "s")) == sorted(stored)
    turns = connect(harness_data).sql("SELECT segment_id, call_id FROM turns WHERE session_id = 'cc' "
                                      "AND segment_id IS NOT NULL ORDER BY segment_id, segment_turn").fetchall()
    by_segment: dict[str, list[str]] = {}
    for segment_id, call_id in turns:
        by_segment.setdefault(segment_id, []).append(call_id)
    assert by_segment == stored


def test_claude_code_atif_has_the_subagent(harness_data, tmp_path):
    doc = atif_doc(harness_data, tmp_path / "a", "claude-code")
    (sub,) = doc["subagent_trajectories"]
    assert any(SUB_PROMPT in s["message"] for s in sub["steps"] if s["source"] == "user")
    calls = [c for s in doc["steps"] if not s.get("is_copied_context") for c in s.get("tool_calls") or []]
    assert [c["function_name"] for c in calls] == ["Agent"]  # the resumed history is marked copied context
    assert any(s.get("is_copied_context") for s in doc["steps"])
    assert [s["segment_reason"] for s in doc["extra"]["segments"]] == ["start", "subagent", "edited_history",
                                                                       "compaction"]


def test_codex_thread_in_verl_sft(harness_data, tmp_path):
    _, (row,), ds = convert_sft_and_tokens(harness_data, tmp_path, "codex")
    assert row["segment_id"] == "cx:0" and row["num_turns"] == 2 and row["segment_reason"] == "start"
    messages = ds.messages[0]
    calls = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == ["exec_command"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"cmd": "echo forgerl > proof.txt"}
    tool = next(m for m in messages if m["role"] == "tool")
    assert tool["tool_call_id"] == calls[0]["id"] and "exited with code 0" in tool["content"]
    # this Codex build sends its tools as namespaces in an `additional_tools` input item
    assert [(t["type"], t["namespace"]["name"]) for t in ds.tools[0]] == [
        ("namespace", "functions"), ("namespace", "clock"), ("namespace", "collaboration")]
    check_same_ids(ds[0], row)


def test_claude_code_in_verl_sft(harness_data, tmp_path):
    """Claude Code's tool schemas hold empty objects, which a Parquet struct cannot store: veRL gets them all."""
    convert(harness_data, tmp_path / "s", "--to", "verl-sft", "--harness", "claude-code")
    ds = load_sft(tmp_path / "s", max_length=131072)
    assert len(ds) == 4
    names = {t["function"]["name"] for t in ds.tools[0]}
    assert {"Bash", "Agent", "Read"} <= names
    assert "{}" in json.dumps(ds.tools[0])
    item = ds[0]
    assert item["loss_mask"].sum() > 0
