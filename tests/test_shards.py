"""ShardWriter: tokens shards written a row group at a time on their own thread, verl shards whole."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forgerl.converters.pipeline import TOKEN_SCHEMA
from forgerl.converters.shards import GROUP_ROWS, ShardWriter


def token_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        ids = np.arange(i, i + 50 + i % 7, dtype=np.int32)
        logprobs = np.full(len(ids), np.nan, np.float32)
        logprobs[-3:] = -0.5
        rows.append({"sample_id": f"s{i:04d}", "session_id": f"sess{i // 3}", "input_ids": ids,
                     "loss_mask": (ids % 2).astype(np.int8), "response_mask": (ids % 2).astype(np.int8),
                     "logprobs": logprobs, "call_ids": [f"c{i}"], "num_tokens": len(ids), "reward": None})
    return rows


def read_back(files) -> list[dict]:
    return pq.read_table([str(f) for f in files]).to_pylist()


def test_tokens_shard_is_written_a_row_group_at_a_time_in_order(tmp_path):
    rows = token_rows(2 * GROUP_ROWS + 22)
    writer = ShardWriter(tmp_path, "part", TOKEN_SCHEMA)
    for row in rows:
        writer.add(row)
    writer.close()
    [path] = writer.files
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [GROUP_ROWS, GROUP_ROWS, 22]
    back = read_back(writer.files)
    assert [r["sample_id"] for r in back] == [r["sample_id"] for r in rows]
    for ours, theirs in zip(back, rows):
        assert ours["input_ids"] == theirs["input_ids"].tolist()
        assert ours["loss_mask"] == theirs["loss_mask"].tolist()
        assert ours["logprobs"][:-3] == [None] * (len(theirs["logprobs"]) - 3)  # NaN: no logprob recorded
        assert ours["logprobs"][-3:] == [-0.5] * 3


def test_a_full_shard_starts_the_next_file(tmp_path):
    rows = token_rows(200)
    writer = ShardWriter(tmp_path, "part", TOKEN_SCHEMA, shard_bytes=20_000)
    for row in rows:
        writer.add(row)
    writer.close()
    assert len(writer.files) > 3 and [p.name for p in writer.files] == sorted(p.name for p in writer.files)
    assert [r["sample_id"] for r in read_back(writer.files)] == [r["sample_id"] for r in rows]


def test_rows_without_a_schema_make_one_row_group_a_shard(tmp_path):
    writer = ShardWriter(tmp_path, "part")
    for i in range(3 * GROUP_ROWS):
        writer.add({"messages": [{"role": "user", "content": f"m{i}"}], "tools": None if i % 2 else "[]"})
    writer.close()
    [path] = writer.files
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    assert read_back(writer.files)[5]["messages"] == [{"role": "user", "content": "m5"}]


def test_a_failed_write_is_raised_in_the_converting_thread_and_discard_closes_the_file(tmp_path):
    writer = ShardWriter(tmp_path, "part", TOKEN_SCHEMA)
    bad = token_rows(GROUP_ROWS)
    bad[7]["num_tokens"] = "many"  # not an int32: the writing thread fails on this group
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        for row in bad + token_rows(GROUP_ROWS + 1):
            writer.add(row)
        writer.flush()
    writer.discard()  # the run's own error is the one reported: this raises nothing
    assert writer._file is None and writer.rows == []
