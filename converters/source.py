"""Reading a dataset session by session, in bounded memory.

Every file is checked up front (footer readable, schema version known), so
bad input fails before anything is written. DuckDB orders the calls by
session on their narrow columns, with each row's file and row number; the
heavy columns (every prompt's token ids, the tool schemas) are read with
pyarrow a row group at a time and put in that order. Message parts stream
out of DuckDB ordered by session and are merged with the calls, one session
at a time. Sessions are read in id ranges whose calls fit a share of
`FORGE_CONVERT_MEMORY` (estimated from the Parquet footers): one pass over
the files per range, one range for most datasets. Token ids and logprobs stay
numpy views of the Arrow buffers: a session's prompts resend the whole
history, so as Python ints they would be most of the run's work.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cached_property, lru_cache
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forgerl.schema import duck
from forgerl.schema.messages import Message
from forgerl.schema.records import MessageMemo, call_forms
from forgerl.schema.segments import engine_ids, succeeded
from forgerl.schema.conform import file_version
from forgerl.schema.files import DatasetError, SchemaVersionError, data_files
from forgerl.schema.store import open_dataset
from forgerl.schema.tables import SCHEMA_VERSION, TABLES

CALL_COLUMNS = ("call_id", "session_id", "seq", "api", "status", "error", "complete", "t_start",
                "model_requested", "model_returned", "stop_reason", "input_tokens", "output_tokens",
                "cache_read_tokens", "tools", "request_params", "input_refs", "input_msg", "input_roles",
                "input_extra", "output_refs", "output_msg", "output_roles", "output_extra", "prompt_token_ids",
                "completion_token_ids", "completion_logprobs", "policy_version", "segment_index", "segment_reason",
                "parent_segment", "parent_position", "continues_call", "tools_absent")
TOKEN_COLUMNS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")
# Every call resends the history's ids and the tool schemas (Claude Code: ~60 kB of JSON), so those columns
# are most of a calls file. DuckDB sorts the rest, with each row's file and row number; the heavy columns
# are then read with pyarrow a row group at a time and put in that order (sorting them in DuckDB cost more
# than the whole conversion of Claude Code-sized sessions).
HEAVY_COLUMNS = ("tools", *TOKEN_COLUMNS)
_CALLS_SQL = f"""
SELECT {', '.join(c for c in CALL_COLUMNS if c not in HEAVY_COLUMNS)}, filename AS _file, file_row_number AS _row
FROM read_parquet($files, union_by_name=true, filename=true, file_row_number=true)
WHERE $lo IS NULL OR session_id BETWEEN $lo AND $hi ORDER BY session_id, t_start, seq, call_id
"""
_PARTS_SQL = ("SELECT DISTINCT session_id, part_hash, part FROM messages WHERE $lo IS NULL OR session_id BETWEEN $lo "
              "AND $hi ORDER BY session_id")
_SORT_SHARE = 4  # a range's calls may fill 1/_SORT_SHARE of the memory limit (the rest: DuckDB, row groups)
_BATCH = 2048


@dataclass
class Call:
    """One recorded model call. Its messages are rebuilt on first use, from the session's parts and a
    memo shared by the session's calls: the thread rebuild needs only the messages it has not seen."""

    row: dict[str, Any]
    parts: Mapping[str, str]  # part hash -> part JSON, for the whole session
    memo: MessageMemo

    @cached_property
    def input_forms(self) -> list[tuple]:
        """The input messages' stored forms (`call_forms`): equal forms are equal messages."""
        return call_forms(self.row, "input")

    @cached_property
    def output_forms(self) -> list[tuple]:
        return call_forms(self.row, "output")

    @cached_property
    def input(self) -> list[Message]:
        return [self.message(form) for form in self.input_forms]

    @cached_property
    def output(self) -> list[Message]:
        return [self.message(form) for form in self.output_forms]

    def message(self, form: tuple) -> Message:
        """The message of a stored form of this session, built once for all its calls."""
        return self.memo.message(form, self.parts)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The offered tools (parsed once per distinct JSON text; treat as read-only)."""
        return _parse_tools(self.row["tools"]) if self.row.get("tools") else []

    @property
    def engine_ids(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The prompt and completion ids the engine reported (int32 arrays), if it reported both."""
        return engine_ids(self.row)

    @property
    def ok(self) -> bool:
        return succeeded(self.row)


@dataclass
class Session:
    session_id: str
    harness: str | None
    calls: list[Call]
    outcome: dict[str, Any] | None = None
    blobs: SessionBlobs | None = None  # where this session's blobs lie, and the run's reader

    def blob_bytes(self, hashes: list[str]) -> dict[str, bytes]:
        """The bytes of some of the session's blobs (images for verl-sft rows), read by hash: only the row
        groups that hold them, never the other blob files. Hashes it has no blob for are left out."""
        return self.blobs.read(hashes) if self.blobs is not None and hashes else {}

    @property
    def reward(self) -> float | None:
        return self.outcome.get("reward") if self.outcome else None

    @cached_property
    def has_image_parts(self) -> bool:
        """Whether any of the session's parts may be an image (a cheap test of the stored JSON)."""
        return any('"image"' in text for text in self.calls[0].parts.values()) if self.calls else False

    @property
    def started(self) -> datetime | None:
        return self.calls[0].row["t_start"] if self.calls else None


def check_dataset(root: Path) -> dict:
    """The manifest (the dataset upgraded first), after checking every data file opens and has a known
    schema version."""
    manifest = open_dataset(root)
    for table in TABLES:
        for path in data_files(root, table):
            try:
                version = file_version(Path(path))
            except (OSError, pa.ArrowException) as e:
                raise DatasetError(f"{path}: unreadable parquet: {e}") from None
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(f"{path}: schema version {version} is newer than this forgerl "
                                         f"({SCHEMA_VERSION}); upgrade forgerl")
    if not data_files(root, "calls"):
        raise DatasetError(f"{root}: the dataset has no calls")
    return manifest


@contextmanager
def readable(root: Path) -> Iterator[None]:
    """DuckDB's errors reading the dataset as the one-line `DatasetError` the CLI reports."""
    try:
        yield
    except duckdb.Error as e:
        raise DatasetError(f"{root}: cannot read the dataset: {str(e).splitlines()[0]}") from None


def connect(root: Path) -> duckdb.DuckDBPyConnection:
    """The run's DuckDB connection to the dataset, set to stream under `FORGE_CONVERT_MEMORY`."""
    with readable(root):  # the views bind every file's schema here
        return duck.connect(root, config={"memory_limit": f"{_memory_bytes()}B",
                                          "preserve_insertion_order": False})


@lru_cache(maxsize=64)
def _parse_tools(text: str) -> list[dict[str, Any]]:
    return json.loads(text)


def _lists(column: pa.Array) -> list[np.ndarray | None]:
    """Each row of a list column as a numpy view of the Arrow buffer (null list: None; null item: NaN)."""
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return [values[offsets[i]: offsets[i + 1]] if valid[i] else None for i in range(len(column))]


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _times(column: pa.Array) -> list[datetime | None]:
    """A UTC timestamp column as datetimes, through int64 (pyarrow's own conversion is ~20x slower)."""
    return [None if v is None else _EPOCH + timedelta(microseconds=v) for v in column.cast(pa.int64()).to_pylist()]


def _part_rows(con: duckdb.DuckDBPyConnection, params: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(session id, part hash, part JSON) of sessions lo..hi, in session order."""
    for batch in con.sql(_PARTS_SQL, params=params).to_arrow_reader(_BATCH):
        yield from zip(*(column.to_pylist() for column in batch.columns))


def _call_rows(con: duckdb.DuckDBPyConnection, files: list[str], lo: str | None,
               hi: str | None) -> Iterator[dict[str, Any]]:
    """The calls of sessions lo..hi (all: None) in `files`, ordered by session and recording order, whole: the
    heavy columns from `_heavy_columns`, UTC timestamps through int64. Converted a column at a time (a row at
    a time, pyarrow costs ~4x more)."""
    order = con.sql(_CALLS_SQL, params={"files": files, "lo": lo, "hi": hi}).to_arrow_table()
    heavy = _heavy_columns(order)
    order = order.drop_columns(["_file", "_row"])
    names = [*order.column_names, *heavy]
    for start in range(0, order.num_rows, _BATCH):
        batch = order.slice(start, _BATCH)
        columns = [_times(column) if _is_utc(column.type) else column.to_pylist() for column in batch.columns]
        columns += [values[start: start + _BATCH] for values in heavy.values()]
        for values in zip(*columns):
            yield dict(zip(names, values))


_UTC_NAMES = ("UTC", "+00:00", "Etc/UTC")  # DuckDB names its TIMESTAMPTZ results' zone Etc/UTC


def _is_utc(arrow: pa.DataType) -> bool:
    return pa.types.is_timestamp(arrow) and arrow.tz in _UTC_NAMES and arrow.unit == "us"


def _heavy_columns(order: pa.Table) -> dict[str, list[Any]]:
    """The heavy columns of `order`'s rows, in its order: token lists as int32/float32 arrays, tools as one
    str per distinct text. Read a row group at a time; rows taken from part of a row group are copied
    out, so memory holds one row group beyond the rows asked for."""
    files = order.column("_file").combine_chunks().dictionary_encode()
    file_of = files.indices.to_numpy()
    rows = order.column("_row").to_numpy()
    out: dict[str, list[Any]] = {name: [None] * order.num_rows for name in HEAVY_COLUMNS}
    shared: dict[str, str] = {}
    for f, path in enumerate(files.dictionary.to_pylist()):
        in_file = np.flatnonzero(file_of == f)
        parquet = pq.ParquetFile(path, read_dictionary=["tools"])
        meta = parquet.metadata
        starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        groups = np.searchsorted(starts, rows[in_file], side="right") - 1
        present = [c for c in HEAVY_COLUMNS if c in parquet.schema_arrow.names]
        for group in np.unique(groups):
            chosen = in_file[groups == group].tolist()
            local = (rows[chosen] - starts[group]).tolist()
            table = parquet.read_row_group(int(group), columns=present, use_threads=False)  # (pool start > gain)
            for name in present:
                column = table.column(name).combine_chunks()
                target = out[name]
                if name == "tools":
                    texts = [shared.setdefault(t, t) for t in column.dictionary.to_pylist()]
                    indices = column.indices.to_pylist()
                    for position, r in zip(chosen, local):
                        target[position] = None if indices[r] is None else texts[indices[r]]
                    continue
                lists = _lists(column)
                whole = len(chosen) == len(table)  # views would keep the whole row group alive: copy a part
                for position, r in zip(chosen, local):
                    target[position] = lists[r] if whole or lists[r] is None else lists[r].copy()
    return out


def _grouped(items: Iterator[Any], session_of: Callable[[Any], str]) -> Iterator[tuple[str, list[Any]]]:
    """Runs of items of one session, from a stream ordered by session."""
    current, group = None, []
    for item in items:
        session_id = session_of(item)
        if session_id != current and group:
            yield current, group
            group = []
        current = session_id
        group.append(item)
    if group:
        yield current, group


def iter_sessions(root: Path, con: duckdb.DuckDBPyConnection, outcomes: Mapping[str, dict[str, Any]], *,
                  harnesses: set[str] | None = None) -> Iterator[Session]:
    """Sessions in session-id order, each with its calls in recording order and its outcome (`outcomes`: each
    session's one outcome row, as `joins.join_outcomes` joined them); `con` is the run's connection (`connect`)."""
    with readable(root):
        yield from _iter_sessions(root, con, outcomes, harnesses)


def _iter_sessions(root: Path, con: duckdb.DuckDBPyConnection, outcomes: Mapping[str, dict[str, Any]],
                   harnesses: set[str] | None) -> Iterator[Session]:
    harness_of = dict(con.execute("SELECT session_id, harness FROM sessions").fetchall())
    blobs = _blob_places(con, root)
    call_files = data_files(root, "calls")  # the files the views read: one snapshot for the whole run
    for lo, hi in _session_ranges(root, con):
        # Two cursors, both ordered by session: merge them one session at a time.
        params = {"lo": lo, "hi": hi}
        calls = _grouped(_call_rows(con.cursor(), call_files, lo, hi), itemgetter("session_id"))
        parts = _grouped(_part_rows(con.cursor(), params), itemgetter(0))
        pending_parts: tuple[str, list[tuple[str, str, str]]] | None = next(parts, None)
        for session_id, rows in calls:
            while pending_parts is not None and pending_parts[0] < session_id:
                pending_parts = next(parts, None)
            by_hash: dict[str, str] = {}
            if pending_parts is not None and pending_parts[0] == session_id:
                by_hash = {digest: part for _, digest, part in pending_parts[1]}
            harness = harness_of.get(session_id)
            if harnesses and (harness or "unknown") not in harnesses:
                continue
            refs = {h for row in rows for h in (*row["input_refs"], *row["output_refs"])}
            missing = refs - by_hash.keys()
            if missing:
                call = next(r["call_id"] for r in rows if missing & {*r["input_refs"], *r["output_refs"]})
                raise DatasetError(f"{root}: call {call} references a missing part {sorted(missing)[0]!r}")
            memo = MessageMemo()
            built = [Call(row, by_hash, memo) for row in rows]
            yield Session(session_id, harness, built, outcomes.get(session_id), blobs.get(session_id))


def _memory_bytes() -> int:
    """FORGE_CONVERT_MEMORY in bytes (KB/MB/GB, or KiB/MiB/GiB: both powers of 1024); a unit is required."""
    text = os.environ.get("FORGE_CONVERT_MEMORY", "512MB").strip().upper().replace("IB", "B")
    units = {"GB": 1 << 30, "MB": 1 << 20, "KB": 1 << 10}
    unit = next((u for u in units if text.endswith(u)), None)
    try:
        if unit is None:
            raise ValueError(text)
        return int(float(text[: -len(unit)]) * units[unit])
    except ValueError:
        raise DatasetError(f"FORGE_CONVERT_MEMORY={text!r}: expected a size such as 512MB or 2GB") from None


def _call_sizes(root: Path) -> tuple[int, float]:
    """How many calls the dataset holds, and the bytes a call holds while its range is read, from the files'
    footers (tools excluded): token lists at 8 bytes a value (the int32 buffers of its row group, and a copy
    when only part of it is taken; Parquet encodes them far smaller), the rest as stored."""
    columns = set(CALL_COLUMNS) - {"tools"}
    total = rows = 0
    for path in data_files(root, "calls"):
        meta = pq.ParquetFile(path).metadata
        rows += meta.num_rows
        for g in range(meta.num_row_groups):
            for column in (meta.row_group(g).column(c) for c in range(meta.row_group(g).num_columns)):
                name = column.path_in_schema.split(".")[0]
                if name in TOKEN_COLUMNS:
                    total += 8 * column.num_values
                elif name in columns:
                    total += column.total_uncompressed_size
    return rows, total / max(rows, 1)


def _session_ranges(root: Path, con: duckdb.DuckDBPyConnection) -> list[tuple[str | None, str | None]]:
    """Consecutive session-id ranges whose calls fit the sort budget (a session is never split); one open
    range, (None, None), when all of them fit."""
    total, per_call = _call_sizes(root)
    per_range = max(1, int(_memory_bytes() / _SORT_SHARE / max(per_call, 1.0)))
    if total < per_range:
        return [(None, None)]
    ranges: list[tuple[str | None, str | None]] = []
    first, count = None, 0
    for session_id, calls in con.execute("SELECT session_id, count(*) FROM calls GROUP BY 1 ORDER BY 1").fetchall():
        first = session_id if first is None else first
        count += calls
        if count >= per_range:
            ranges.append((first, session_id))
            first, count = None, 0
    if first is not None:
        ranges.append((first, session_id))
    return ranges


_BLOB_PLACES_SQL = """
SELECT session_id, blob_hash, min(filename) AS file, arg_min(file_row_number, filename) AS row
FROM read_parquet($files, union_by_name=true, filename=true, file_row_number=true) GROUP BY 1, 2
"""


def _blob_places(con: duckdb.DuckDBPyConnection, root: Path) -> dict[str, SessionBlobs]:
    """Each session's blobs: hash -> (file, row number), from the narrow columns only (no bytes read)."""
    files = data_files(root, "blobs")
    if not files:
        return {}
    reader = BlobReader()
    out: dict[str, SessionBlobs] = {}
    for session_id, digest, path, row in con.execute(_BLOB_PLACES_SQL, {"files": files}).fetchall():
        out.setdefault(session_id, SessionBlobs({}, reader)).places[digest] = (path, row)
    return out


@dataclass
class SessionBlobs:
    """Where one session's blobs lie (blob hash -> file and row number), read through the run's reader."""

    places: dict[str, tuple[str, int]]
    reader: BlobReader

    def read(self, hashes: list[str]) -> dict[str, bytes]:
        return self.reader.read({h: self.places[h] for h in set(hashes) if h in self.places})


class BlobReader:
    """Blob bytes by place: the `data` of the row group holding each, the last one decoded kept for the next
    read (a session's blobs are written together, so its images mostly share one row group). Reading a
    sample's images thus costs the row groups they lie in, not a pass over every blob file."""

    def __init__(self) -> None:
        self._starts: dict[str, list[int]] = {}  # file -> first row number of each row group, and the total
        self._group: tuple[tuple[str, int], pa.Array] | None = None

    def read(self, places: Mapping[str, tuple[str, int]]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for digest, (path, row) in sorted(places.items(), key=itemgetter(1)):
            group, offset = self._locate(path, row)
            data = self._data(path, group)[offset].as_py()
            if data is not None:
                out[digest] = data
        return out

    def _locate(self, path: str, row: int) -> tuple[int, int]:
        """(row group, row within it) of a file's row number, from the file's footer (read once)."""
        starts = self._starts.get(path)
        if starts is None:
            meta = pq.ParquetFile(path).metadata
            starts = [0]
            for g in range(meta.num_row_groups):
                starts.append(starts[-1] + meta.row_group(g).num_rows)
            self._starts[path] = starts
        group = bisect_right(starts, row) - 1
        return group, row - starts[group]

    def _data(self, path: str, group: int) -> pa.Array:
        if self._group is None or self._group[0] != (path, group):
            column = pq.ParquetFile(path).read_row_group(group, columns=["data"]).column("data")
            self._group = ((path, group), column.combine_chunks())
        return self._group[1]
