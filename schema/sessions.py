"""One session's rows, fast: which data files hold a session, learnt once per file.

Runners read a rollout's calls right after it ends, many times a minute, and
a recorder's writer reads a session it takes up again (`writer.DatasetWriter`), from
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

import os
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from .records import MessageMemo
from .segments import SessionThreads
from .conform import open_parquet, read_files, schema_version
from .files import data_file_names
from .storage import exists
from .tables import SCHEMA_VERSION, TABLES

_Info = tuple[int, Counter]  # (schema version, rows per session)
_LOCK = threading.Lock()


class _Folder:
    """One table folder's files, each learnt once, and which of them hold each session.

    A listing's new names are learnt and its gone ones (a compaction's
    sources) forgotten, so finding a session's files costs two set
    operations on the listing and a sort of its own files: not a lookup per
    file, which with thousands of small files (a file per table every flush)
    cost milliseconds per read, and a runner reads three times a rollout.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.files: dict[str, _Info] = {}  # by name
        self.holders: dict[str, set[str]] = {}  # session -> the names of the files holding it

    def update(self, current: set[str]) -> None:
        """Learn the names listed that are new, forget the ones gone; FileNotFoundError: one vanished meanwhile.

        A name known but not listed is forgotten only once it is gone from
        disk (a compaction's source): another thread's listing may be newer
        than this one and have learnt it, and that thread is about to look.
        """
        with _LOCK:
            new, unlisted = current - self.files.keys(), self.files.keys() - current
        gone = [name for name in unlisted if not exists(f"{self.path}{os.sep}{name}")]
        with _LOCK:
            for name in gone:
                if name in self.files:
                    self._drop(name)
        for name in new:  # read outside the lock: other threads' sessions need not wait for these footers
            info = _learn(f"{self.path}{os.sep}{name}")
            with _LOCK:
                if name not in self.files:
                    self.files[name] = info
                    for session in info[1]:
                        self.holders.setdefault(session, set()).add(name)

    def _drop(self, name: str) -> None:
        for session in self.files.pop(name)[1]:
            holding = self.holders[session]
            holding.discard(name)
            if not holding:
                del self.holders[session]

    def holding(self, session: str, current: set[str]) -> list[tuple[str, int, int]]:
        """(file, rows of `session` in it, its schema version) for the listed files holding it, in name order (as
        `data_files`)."""
        with _LOCK:
            found = sorted((name, self.files[name][1][session], self.files[name][0])
                           for name in self.holders.get(session, ()) if name in current)
        return [(f"{self.path}{os.sep}{name}", rows, version) for name, rows, version in found]


_FOLDERS: dict[str, _Folder] = {}  # table folder -> what is known of it


def _learn(path: str) -> _Info:
    parquet = open_parquet(path)  # one footer read gives the version and the sessions
    sessions = parquet.read(["session_id"], use_threads=False).column("session_id").to_pylist()
    return schema_version(parquet.schema_arrow), Counter(sessions)


def _folder(path: str) -> _Folder:
    with _LOCK:
        folder = _FOLDERS.get(path)
        if folder is None:
            folder = _FOLDERS[path] = _Folder(path)
        return folder


def forget() -> None:
    """Learn every file again on the next read (what a fresh process would do)."""
    with _LOCK:
        _FOLDERS.clear()


def prefer_system_allocator() -> None:
    """Allocate this process's Arrow buffers with the C library's malloc from now on.

    A runner reads a few small files per rollout, on up to three threads per
    harness slot. Arrow's default allocator, mimalloc, keeps a heap per
    thread and hands freed memory back to the system, so each read touches
    fresh memory, which the kernel gives out as zeroed 2 MB huge pages: with
    16 harnesses at once that zeroing was a quarter of the runner's own CPU,
    10-15 ms a rollout (`bench/runner.py`).
    """
    pa.set_memory_pool(pa.system_memory_pool())


def session_files(root: str | Path, table: str, session: str) -> list[tuple[str, int]]:
    """(file, rows of the session in it) for every file of `table` holding `session`, in listing order."""
    return [(path, rows) for path, rows, _ in _held(root, table, session)]


def _held(root: str | Path, table: str, session: str) -> list[tuple[str, int, int]]:
    """(file, rows of the session in it, its schema version) for every file of `table` holding `session`."""
    for _ in range(5):
        try:
            path, names = data_file_names(root, table)
            folder = _folder(path)
            folder.update(names)
            return folder.holding(session, names)
        except FileNotFoundError:  # a compaction swapped files between listing and reading
            time.sleep(0.05)
    raise FileNotFoundError(f"{root}/{table}: files keep vanishing while reading")


def session_count(root: str | Path, table: str, session: str) -> int:
    return sum(n for _, n in session_files(root, table, session))


def session_rows(root: str | Path, table: str, session: str, columns: list[str]) -> pa.Table:
    """The session's rows of `table`, only `columns`, from only the files (and row groups) that hold it."""
    held = _held(root, table, session)
    files = [path for path, _, _ in held]
    if not files:
        return TABLES[table].empty_table().select(columns)
    if any(version != SCHEMA_VERSION for _, _, version in held):
        rows = read_files(table, map(Path, files))
        return rows.filter(pc.equal(rows.column("session_id"), session)).select(columns)
    return pa.concat_tables([_file_rows(f, session, columns) for f in files])


def _file_rows(path: str, session: str, columns: list[str]) -> pa.Table:
    """The session's rows of one file, `columns` only, from the row groups whose statistics may hold it."""
    parquet = open_parquet(path)
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
