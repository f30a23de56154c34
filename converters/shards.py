"""Writing shards: size-bounded Parquet files, an on-disk dedupe set, the train/val split.

Output goes to a hidden temp directory beside OUT and is renamed into place
only when the whole run succeeded, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def split_of(session_id: str, val_fraction: float) -> str:
    """Deterministic by session: every sample of a session lands on the same side."""
    bucket = int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:8], "big") / 2**64
    return "val" if bucket < val_fraction else "train"


class SeenSet:
    """Digests of written samples in SQLite: memory stays flat however many samples pass."""

    def __init__(self, path: Path):
        self.db = sqlite3.connect(path)
        self.db.execute("CREATE TABLE seen (digest BLOB PRIMARY KEY) WITHOUT ROWID")

    def add(self, key: bytes) -> bool:
        """True if the key is new."""
        digest = hashlib.blake2b(key, digest_size=16).digest()
        return self.db.execute("INSERT OR IGNORE INTO seen VALUES (?)", (digest,)).rowcount == 1

    def close(self) -> None:
        self.db.close()


def _size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, list):  # lists of numbers (ids, masks, logprobs) are sized without a walk
        if not value or value[0] is None or isinstance(value[0], (int, float)):
            return 4 * len(value)
        return sum(_size(v) for v in value)
    if isinstance(value, dict):
        return sum(_size(v) + len(k) for k, v in value.items())
    return 8


_NUMPY = {pa.int8(): np.int8, pa.int32(): np.int32, pa.int64(): np.int64, pa.float32(): np.float32,
          pa.float64(): np.float64}


def _column(values: list[Any], arrow: pa.DataType) -> pa.Array:
    """One column of a shard. Lists of numbers (ids, masks, logprobs: numpy arrays or Python lists) are
    concatenated into one buffer instead of being converted value by value; NaN in them is null."""
    if not (pa.types.is_list(arrow) and arrow.value_type in _NUMPY):
        return pa.array(values, type=arrow)
    dtype = _NUMPY[arrow.value_type]
    arrays = [None if v is None else np.asarray(v, dtype=dtype) for v in values]
    lengths = np.array([0 if a is None else len(a) for a in arrays], np.int64)
    offsets = np.zeros(len(arrays) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [a for a in arrays if a is not None]
    flat = np.concatenate(present) if present else np.zeros(0, dtype)
    child = pa.array(flat, type=arrow.value_type, mask=np.isnan(flat) if flat.dtype.kind == "f" else None)
    return pa.ListArray.from_arrays(pa.array(offsets), child, type=arrow,
                                    mask=pa.array([a is None for a in arrays], pa.bool_()))


def _table(rows: list[dict[str, Any]], schema: pa.Schema | None) -> pa.Table:
    if schema is None:
        return pa.Table.from_pylist(rows)
    return pa.Table.from_arrays([_column([r.get(f.name) for r in rows], f.type) for f in schema], schema=schema)


class ShardWriter:
    """Rows of one kind to `<dir>/<prefix>-NNNNN.parquet`, a new file every `shard_bytes` of data."""

    def __init__(self, directory: Path, prefix: str, schema: pa.Schema | None = None,
                 shard_bytes: int = 128 * 1024 * 1024):
        self.directory, self.prefix, self.schema, self.shard_bytes = directory, prefix, schema, shard_bytes
        self.rows: list[dict[str, Any]] = []
        self.bytes = 0
        self.files: list[Path] = []
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.bytes += _size(row)
        self.count += 1
        if self.bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.prefix}-{len(self.files):05d}.parquet"
        table = _table(self.rows, self.schema)
        strings = [f.name for f in table.schema if pa.types.is_string(f.type)
                   or (pa.types.is_list(f.type) and pa.types.is_string(f.type.value_type))]
        pq.write_table(table, path, compression="zstd", use_dictionary=strings)  # ids, masks: no dictionary
        self.files.append(path)
        self.rows, self.bytes = [], 0


class Output:
    """The run's output directory, built aside and swapped in at the end."""

    def __init__(self, out: Path):
        self.out = out
        self.tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
        self.tmp.mkdir(parents=True)

    def path(self, *parts: str) -> Path:
        return self.tmp.joinpath(*parts)

    def write_json(self, name: str, value: Any) -> None:
        self.path(name).write_text(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")

    def commit(self) -> None:
        for scratch in self.tmp.glob("*.sqlite*"):
            scratch.unlink()
        if self.out.exists():
            old = self.out.with_name(f".{self.out.name}.{uuid.uuid4().hex[:8]}.old")
            os.replace(self.out, old)
            os.replace(self.tmp, self.out)
            shutil.rmtree(old)
        else:
            os.replace(self.tmp, self.out)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
