"""forge-convert reads calls whole and in order however they are laid out: sessions interleaved call by
call across files of many row groups, read in many session ranges (so most row groups are taken in part).
DuckDB orders the narrow columns and pyarrow fills in each row's ids and tools (converters/source.py);
a row put in the wrong place would break a thread, change a segment's tools, or change the ids."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.parquet as pq

from forgerl.converters import source
from forgerl.schema import files as dataset_files
from forgerl.schema.messages import Exchange, Message, Part
from forgerl.schema.records import CallRecord
from forgerl.schema.writer import DatasetWriter

from convert_fixtures import TOKENIZER_DIR, convert

SESSIONS, CALLS = 24, 4


def _tools(s: int) -> list[dict]:
    return [{"name": f"tool_{s % 3}", "description": "x " * (50 * (s % 3 + 1)), "parameters": {"type": "object"}}]


def _write(root: Path) -> dict[str, list[int]]:
    """Calls interleaved across sessions in shuffled order, in two files; returns each session's ids."""
    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    prompts = {s: list(range(30_000 * s, 30_000 * s + 20_000)) for s in range(SESSIONS)}
    histories = {s: [Message("user", (Part("text", text=f"task {s}"),))] for s in range(SESSIONS)}
    expected = {}
    with DatasetWriter(root, flush_interval=3600) as writer:
        for s in range(SESSIONS):
            writer.add_session(f"s-{s:02d}", harness="test")
        for k in range(CALLS):
            for s in random.Random(k).sample(range(SESSIONS), SESSIONS):  # file order is not session order
                sid = f"s-{s:02d}"
                answer = Message("assistant", (Part("text", text=f"step {k} of {s}"),))
                completion = [50_000 + 10 * s + k] * 40
                ex = Exchange(input=list(histories[s]), output=[answer], tools=_tools(s), model_requested="m",
                              prompt_token_ids=list(prompts[s]), completion_token_ids=completion)
                writer.add_call(CallRecord(call_id=f"{sid}-{k}", session_id=sid, api="chat", method="POST",
                                           path="/v1/chat/completions", t_start=t0 + timedelta(seconds=k),
                                           status=200, complete=True, exchange=ex, seq=writer.next_seq()))
                expected[sid] = prompts[s] + completion
                histories[s] += [answer, Message("user", (Part("text", text=f"go on {k}"),))]
                prompts[s] = prompts[s] + completion + [60_000 + s] * 5
            if k == 1:
                writer.flush()
    return expected


def _tokens(out: Path) -> dict[str, list[int]]:
    table = pq.read_table(out / "train", columns=["session_id", "input_ids"])
    return dict(zip(table.column("session_id").to_pylist(), table.column("input_ids").to_pylist()))


def test_interleaved_calls_in_many_row_groups_and_ranges(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_files, "_ROW_GROUP_BYTES", 400_000)  # a few calls a row group
    root = tmp_path / "data"
    expected = _write(root)
    files = sorted((root / "calls").glob("*.parquet"))
    assert len(files) == 2 and all(pq.ParquetFile(f).metadata.num_row_groups > 3 for f in files)

    whole = convert(root, tmp_path / "one-range", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--drift", "off")
    monkeypatch.setenv("FORGE_CONVERT_MEMORY", "16MB")  # a few sessions a range
    assert len(source._session_ranges(root, source.connect(root))) >= 3
    ranged = convert(root, tmp_path / "ranges", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--drift", "off")
    for manifest in (whole, ranged):
        counts = manifest["counts"]
        assert counts["sessions"] == counts["segments"] == counts["engine_ids"] == SESSIONS, counts
    assert _tokens(tmp_path / "one-range") == _tokens(tmp_path / "ranges") == expected
