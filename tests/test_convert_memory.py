"""forge-convert stays inside FORGE_CONVERT_MEMORY on calls wider than it: tool schemas the size of
Claude Code's and long prompts of engine ids, 140 MB of them in all under a 128 MB limit. (Before the session ranges, the tools-by-md5 query and byte-bounded row
groups, DuckDB ran out of memory here.)"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from forgerl.schema.messages import Exchange, Message, Part
from forgerl.schema.records import CallRecord
from forgerl.schema.writer import DatasetWriter

from convert_fixtures import TOKENIZER_DIR, convert

SESSIONS, CALLS, BASE_IDS, TURN_IDS = 100, 10, 20_000, 100
TOOLS = [{"name": f"tool_{k}", "description": f"tool {k} " + "reads and writes files " * 160,
          "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}}} for k in range(16)]


def _write(root: Path) -> None:
    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    with DatasetWriter(root) as writer:
        for s in range(SESSIONS):
            sid = f"wide-{s:03d}"
            writer.add_session(sid, harness="bench")
            history = [Message("system", (Part("text", text="You are an agent."),)),
                       Message("user", (Part("text", text=f"task {s}"),))]
            prompt = list(range(s, s + BASE_IDS))  # distinct per session, or dedupe keeps one
            for k in range(CALLS):
                answer = Message("assistant", (Part("text", text=f"step {k} of {s}"),))
                completion = [k + 1] * (TURN_IDS // 2)
                ex = Exchange(input=list(history), output=[answer], tools=TOOLS, model_requested="m",
                              prompt_token_ids=list(prompt), completion_token_ids=completion)
                writer.add_call(CallRecord(call_id=f"{sid}-{k}", session_id=sid, api="chat", method="POST",
                                           path="/v1/chat/completions", t_start=t0 + timedelta(seconds=60 * s + k),
                                           status=200, complete=True, exchange=ex, seq=writer.next_seq()))
                history += [answer, Message("user", (Part("text", text=f"go on {k}"),))]
                prompt += completion + [7] * (TURN_IDS // 2)
            writer.flush()


def test_wide_calls_convert_under_a_small_memory_limit(tmp_path, monkeypatch):
    root = tmp_path / "data"
    _write(root)
    calls = pq.read_table(root / "calls", columns=["prompt_token_ids", "tools"])
    wide_bytes = (4 * pc.sum(pc.list_value_length(calls.column("prompt_token_ids"))).as_py()
                  + pc.sum(pc.binary_length(calls.column("tools"))).as_py())
    assert calls.num_rows == SESSIONS * CALLS and wide_bytes > 136 << 20  # more than the limit below
    del calls
    monkeypatch.setenv("FORGE_CONVERT_MEMORY", "128MB")
    manifest = convert(root, tmp_path / "out", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--drift", "off")
    assert manifest["counts"]["sessions"] == SESSIONS and manifest["counts"]["engine_ids"] == SESSIONS
    rows = pq.read_table(tmp_path / "out" / "train", columns=["input_ids", "loss_mask"]).to_pylist()
    last_prompt = BASE_IDS + (CALLS - 1) * TURN_IDS
    assert all(len(r["input_ids"]) == last_prompt + TURN_IDS // 2 for r in rows)
    assert all(sum(r["loss_mask"]) == CALLS * TURN_IDS // 2 for r in rows)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"]["rows_train"] == SESSIONS
