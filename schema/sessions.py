"""One session's rows, fast: which data files hold a session, learnt once per file.

Runners read a rollout's calls right after it ends, many times a minute, and
a recorder's writer reads a session it takes up again (`store.DatasetWriter`), from
a dataset that gains a file per table every flush. Reading every file (or
every footer) for each rollout makes grading slower as the dataset grows. A
data file never changes once written (new rows get new files; compaction
writes new names), so the runner reads each file's `session_id` column once,
keeps {session: rows} per file, and opens only the files that hold the
session it wants; in those, the session filter is pushed down to the Parquet
reader, which skips row groups whose `session_id` statistics rule it out. So
a read costs the session's own rows plus a listing of file names, however
large the dataset grows (`bench/session_read.py`). Files of an older schema
version go through the store's conforming reader.

Each file is read with `ParquetFile` on the calling thread: a runner reads a
few small files per rollout, and `pq.read_table` (a dataset, a scanner and
Arrow's thread pool per call) costs 2-4 times the CPU on those.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .records import MessageMemo
from .segments import SessionThreads
from .store import data_files, read_files, schema_version
from .tables import SCHEMA_VERSION, TABLES

_Info = tuple[int, Counter]  # (schema version, rows per session)
_INDEX: dict[str, _Info] = {}
_LOCK = threading.Lock()


def _info(path: str) -> _Info:
    info = _INDEX.get(path)
    if info is None:
        parquet = pq.ParquetFile(path)  # one footer read gives the version and the sessions
        sessions = parquet.read(["session_id"], use_threads=False).column("session_id").to_pylist()
        info = (schema_version(parquet.schema_arrow), Counter(sessions))
        with _LOCK:
            _INDEX[path] = info
    return info


def _forget_missing(files: list[str]) -> None:
    """Drop files a compaction replaced, so the index stays the size of the dataset."""
    current = set(files)
    with _LOCK:
        for path in [p for p in _INDEX if p not in current]:
            del _INDEX[path]


def session_files(root: str | Path, table: str, session: str) -> list[tuple[str, int]]:
    """(file, rows of the session in it) for every file of `table` holding `session`."""
    for _ in range(5):
        try:
            files = data_files(root, table)
            found = [(f, _info(f)[1][session]) for f in files]
            if len(_INDEX) > 2 * len(files):
                _forget_missing(files)
            return [(f, n) for f, n in found if n]
        except FileNotFoundError:  # a compaction swapped files between listing and reading
            time.sleep(0.05)
    raise FileNotFoundError(f"{root}/{table}: files keep vanishing while reading")


def session_count(root: str | Path, table: str, session: str) -> int:
    return sum(n for _, n in session_files(root, table, session))


def session_rows(root: str | Path, table: str, session: str, columns: list[str]) -> pa.Table:
    """The session's rows of `table`, only `columns`, from only the files (and row groups) that hold it."""
    files = [f for f, _ in session_files(root, table, session)]
    if not files:
        return TABLES[table].empty_table().select(columns)
    if any(_INDEX[f][0] != SCHEMA_VERSION for f in files if f in _INDEX):
        rows = read_files(table, map(Path, files))
        return rows.filter(pc.equal(rows.column("session_id"), session)).select(columns)
    return pa.concat_tables([_file_rows(f, session, columns) for f in files])


def _file_rows(path: str, session: str, columns: list[str]) -> pa.Table:
    """The session's rows of one file, `columns` only, from the row groups whose statistics may hold it."""
    parquet = pq.ParquetFile(path)
    meta = parquet.metadata
    column = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == "session_id")
    groups = [g for g in range(meta.num_row_groups)
              if not (stats := meta.row_group(g).column(column).statistics) or not stats.has_min_max
              or stats.min <= session <= stats.max]
    rows = parquet.read_row_groups(groups, list(dict.fromkeys([*columns, "session_id"])), use_threads=False)
    return rows.filter(pc.equal(rows.column("session_id"), session)).select(columns)


# What taking up a session's threads reads of its stored calls: everything but the raw bytes and bodies.
PLACE_COLUMNS = ["call_id", "session_id", "seq", "t_start", "status", "error", "complete", "tools", "response_headers",
                 "input_refs", "input_msg", "input_roles", "input_extra", "output_refs", "output_msg", "output_roles",
                 "output_extra", "prompt_token_ids", "completion_token_ids", "segment_index", "segment_reason",
                 "parent_segment", "parent_position"]


def session_history(root: str | Path, session_id: str) -> tuple[set[str], set[str], SessionThreads]:
    """What the dataset already holds of a session a writer has not seen (a harness's `--continue` run
    through a new recorder, a session evicted from the writer's cache): its written part and blob hashes,
    and its threads as stored, so new calls are placed where the session left off. A session is recorded
    by one writer at a time: two writers recording it at once would number their segments apart."""
    threads = SessionThreads()
    rows = session_rows(root, "calls", session_id, PLACE_COLUMNS).to_pylist()
    if not rows:
        return set(), set(), threads
    parts = session_rows(root, "messages", session_id, ["part_hash", "part"])
    by_hash = dict(zip(*(parts.column(c).to_pylist() for c in ("part_hash", "part"))))
    memo = MessageMemo()
    rows.sort(key=lambda r: (r["t_start"], r["seq"], r["call_id"]))
    threads.restore(rows, lambda form: memo.message(form, by_hash))
    blobs = set(session_rows(root, "blobs", session_id, ["blob_hash"]).column(0).to_pylist())
    return set(by_hash), blobs, threads
