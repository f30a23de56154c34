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
from concurrent.futures import Future, ThreadPoolExecutor
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


GROUP_ROWS = 64  # a row group of a shard with a fixed schema: at most this many rows,
GROUP_BYTES = 8 << 20  # or this much data


class ShardWriter:
    """Rows of one kind to `<dir>/<prefix>-NNNNN.parquet`, a new file every `shard_bytes` of data.

    With a schema (`tokens`), a shard goes out a row group at a time (`GROUP_ROWS`, `GROUP_BYTES`) on a
    thread of its own: pyarrow encodes and compresses without the GIL, so the shard is written while the
    conversion goes on, and memory holds a row group or two rather than a shard. Without one (the verl
    targets, whose nested columns' types are inferred) a shard is one row group, written when it is full.
    """

    def __init__(self, directory: Path, prefix: str, schema: pa.Schema | None = None,
                 shard_bytes: int = 128 * 1024 * 1024):
        self.directory, self.prefix, self.schema, self.shard_bytes = directory, prefix, schema, shard_bytes
        self.rows: list[dict[str, Any]] = []  # the row group being gathered
        self.bytes = 0  # its size
        self.shard_size = 0  # the current shard's, so far
        self.files: list[Path] = []
        self.count = 0
        self._file: pq.ParquetWriter | None = None  # the shard being written (only the writing thread uses it)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="forgerl-shards")
        self._pending: Future | None = None

    def add(self, row: dict[str, Any]) -> None:
        size = _size(row)
        self.rows.append(row)
        self.bytes += size
        self.shard_size += size
        self.count += 1
        if self.shard_size >= self.shard_bytes:
            self.flush()
        elif self.schema is not None and (len(self.rows) >= GROUP_ROWS or self.bytes >= GROUP_BYTES):
            self._write_group(last=False)

    def flush(self) -> None:
        """End the current shard: its last rows written and the file closed."""
        if self.rows:
            self._write_group(last=True)
        self._wait()

    def close(self) -> None:
        """Flush, and stop the writing thread."""
        try:
            self.flush()
        finally:
            self._pool.shutdown()

    def discard(self) -> None:
        """Stop after a failed run: the pending write finished or failed, the file closed (the caller removes
        the output)."""
        try:
            self._wait()
        except Exception:  # noqa: BLE001 - the run has already failed; its own error is the one to report
            pass
        finally:
            self.rows = []
            if self._file is not None:
                self._file.close()
                self._file = None
            self._pool.shutdown()

    def _write_group(self, last: bool) -> None:
        rows, self.rows, self.bytes = self.rows, [], 0
        if last:
            self.shard_size = 0
        self._wait()  # one group in flight: memory holds it and the one being gathered
        self._pending = self._pool.submit(self._write, rows, last)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def _write(self, rows: list[dict[str, Any]], last: bool) -> None:
        """On the writing thread: a row group to the current shard (opened first if need be); `last` closes it."""
        table = _table(rows, self.schema)
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{self.prefix}-{len(self.files):05d}.parquet"
            strings = [f.name for f in table.schema if pa.types.is_string(f.type)
                       or (pa.types.is_list(f.type) and pa.types.is_string(f.type.value_type))]
            self._file = pq.ParquetWriter(path, table.schema, compression="zstd", use_dictionary=strings)  # ids: none
            self.files.append(path)
        self._file.write_table(table)
        if last:
            self._file.close()
            self._file = None


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
