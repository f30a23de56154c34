"""Thread reconstruction on real Claude Code (subagent, compaction) and Codex sessions.

Recorded once per module through `forge-record run` with the npm CLIs and a
scripted upstream (see convert_harness_fixtures).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FORGE_RECORD, REPO, session_calls
from convert_fixtures import TOKENIZER_DIR, convert, qwen_tokenizer, rows
from convert_harness_fixtures import SUB_PROMPT, SUMMARY, claude_script, codex_script, record_claude, record_codex
from scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.slow
BIN = REPO / "node_modules" / ".bin"


@pytest.fixture(scope="module")
def harness_data(tmp_path_factory) -> Path:
    for cli in ("claude", "codex"):
        if not (BIN / cli).exists():
            pytest.fail(f"{BIN / cli} missing: run `make test` (npm ci installs the pinned harness CLIs)")
    base = tmp_path_factory.mktemp("harness")
    with ScriptedUpstream(claude_script) as up:
        runs = record_claude(FORGE_RECORD, BIN / "claude", base, up.url)
    assert all(r.returncode == 0 for r in runs), [r.stderr[-500:] for r in runs]
    with ScriptedUpstream(codex_script) as up:
        r = record_codex(FORGE_RECORD, BIN / "codex", base, up.url)
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
    import atif

    convert(harness_data, tmp_path / "a", "--to", "atif", "--harness", "claude-code")
    (doc_path,) = (tmp_path / "a").glob("train/*.json")
    doc = json.loads(doc_path.read_text())
    atif.Trajectory.model_validate(doc)
    (sub,) = doc["subagent_trajectories"]
    assert any(SUB_PROMPT in s["message"] for s in sub["steps"] if s["source"] == "user")
    calls = [c for s in doc["steps"] if not s.get("is_copied_context") for c in s.get("tool_calls") or []]
    assert [c["function_name"] for c in calls] == ["Agent"]  # the resumed history is marked copied context
    assert any(s.get("is_copied_context") for s in doc["steps"])
    assert [s["segment_reason"] for s in doc["extra"]["segments"]] == ["start", "subagent", "edited_history",
                                                                       "compaction"]


def test_codex_thread_in_verl_sft(harness_data, tmp_path):
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    convert(harness_data, tmp_path / "s", "--to", "verl-sft", "--harness", "codex")
    convert(harness_data, tmp_path / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--harness", "codex")
    (row,) = rows(tmp_path / "t")
    assert row["segment_id"] == "cx:0" and row["num_turns"] == 2 and row["segment_reason"] == "start"
    files = sorted(str(p) for p in (tmp_path / "s").glob("train/*.parquet"))
    ds = ForgeSFTDataset(files, qwen_tokenizer(), {"pad_mode": "no_padding", "max_length": 65536,
                                                   "ignore_input_ids_mismatch": True})
    messages = ds.messages[0]
    calls = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in calls] == ["exec_command"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"cmd": "echo forgerl > proof.txt"}
    tool = next(m for m in messages if m["role"] == "tool")
    assert tool["tool_call_id"] == calls[0]["id"] and "exited with code 0" in tool["content"]
    # this Codex build sends its tools as namespaces in an `additional_tools` input item
    assert [(t["type"], t["namespace"]["name"]) for t in ds.tools[0]] == [
        ("namespace", "functions"), ("namespace", "clock"), ("namespace", "collaboration")]
    item = ds[0]
    assert item["input_ids"].tolist() == row["input_ids"]
    assert item["loss_mask"].tolist() == row["loss_mask"]


def test_claude_code_in_verl_sft(harness_data, tmp_path):
    """Claude Code's tool schemas hold empty objects, which a Parquet struct cannot store: veRL gets them all."""
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    convert(harness_data, tmp_path / "s", "--to", "verl-sft", "--harness", "claude-code")
    files = sorted(str(p) for p in (tmp_path / "s").glob("train/*.parquet"))
    ds = ForgeSFTDataset(files, qwen_tokenizer(), {"pad_mode": "no_padding", "max_length": 131072,
                                                   "ignore_input_ids_mismatch": True})
    assert len(ds) == 4
    names = {t["function"]["name"] for t in ds.tools[0]}
    assert {"Bash", "Agent", "Read"} <= names
    assert "{}" in json.dumps(ds.tools[0])
    item = ds[0]
    assert item["loss_mask"].sum() > 0
