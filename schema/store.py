"""The dataset root: opening (and upgrading) it, the append-only writer, crash recovery, reading, compaction
and deletion, over the files layer (`files.py`: layout, atomic writes, manifest, locks, listing).

    ROOT/_inflight/<writer>.parquet   snapshot of a live writer's unfinished calls

Writers need no shared lock: file names carry the writer id. A writer
flushes at least every `flush_interval` seconds, and on start recovers the
in-flight snapshots of writers that died (their lock is free) as incomplete
calls, so `kill -9` loses at most the last interval.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .files import (FORMAT, MANIFEST, DatasetError, Flock, atomic_write_bytes, atomic_write_table, data_files,
                    file_version, fsync_dir, maintenance_lock, read_files, read_manifest)
from .migrations import upgrade
from .records import CallRecord, call_forms, call_rows
from .segments import NO_PLACE, SessionThreads, tools_absent
from .sessions import session_history
from .tables import SCHEMA_VERSION, TABLES

_SESSION_CACHE = 10_000


# One row per session out of the `sessions` rows (`session_rows`): the row whose evidence names the harness
# most specifically (the latest on ties), first seen when the session was first seen, with any labels.
SESSION_ROW_SQL = """
SELECT session_id, first AS first_seen, harness, user_agent, source, coalesce(labels, any_labels) AS labels,
       writer_id, harness_rank, harness_evidence
FROM (SELECT *, min(first_seen) OVER s AS first, max(labels) OVER s AS any_labels,
             row_number() OVER (s ORDER BY coalesce(harness_rank, 0) DESC, first_seen DESC, writer_id DESC) AS n
      FROM session_rows WINDOW s AS (PARTITION BY session_id))
WHERE n = 1
"""


def one_row_per_session(rows: pa.Table) -> pa.Table:
    """`sessions` rows collapsed by `SESSION_ROW_SQL` (compaction and `read_table`)."""
    con = duckdb.connect()
    con.register("session_rows", rows)
    out = con.sql(SESSION_ROW_SQL + " ORDER BY first_seen, session_id").to_arrow_table()
    return out.cast(TABLES["sessions"])


def init_root(root: Path) -> dict:
    """Create the dataset root and its manifest if absent; return the manifest."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        for sub in (*TABLES, "_inflight", "_writers", "_compaction"):
            (root / sub).mkdir(exist_ok=True)
    except (FileExistsError, NotADirectoryError, PermissionError) as e:
        raise DatasetError(f"{root}: cannot hold a dataset: {e.strerror} ({e.filename})") from None
    path = root / MANIFEST
    if not path.exists():
        manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION,
                    "created_at": datetime.now(timezone.utc).isoformat(), "tables": list(TABLES)}
        tmp = path.with_name(f".{MANIFEST}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        try:
            os.link(tmp, path)  # create-if-absent, atomic against a concurrent writer
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return open_dataset(root)


def open_dataset(root: str | os.PathLike) -> dict:
    """The manifest of a dataset at the current schema version: every reader and writer opens through
    here, so an older dataset is upgraded in place once (`migrations.upgrade`) before anything reads it."""
    manifest = read_manifest(Path(root))
    if manifest["schema_version"] < SCHEMA_VERSION:
        manifest = upgrade(Path(root))
    return manifest


# ---------------------------------------------------------------- writer


def new_writer_id() -> str:
    host = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:24]
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class DatasetWriter:
    """Buffers rows and flushes them as new files at least every `flush_interval` s.

    Thread-safe: producers call `add_*` from any thread (mitmproxy's event
    loop); a daemon thread flushes, unless `flush_interval` is None: then the
    owner calls `flush` itself (and sees its failures). Unfinished calls registered with `track`
    are snapshotted to `_inflight/` on every flush that asks for it (every one
    by default) so a crash leaves them recoverable.
    """

    def __init__(self, root: str | os.PathLike, *, writer_id: str | None = None,
                 flush_interval: float | None = 0.5, source: str = "recorder"):
        self.root = Path(root)
        init_root(self.root)
        self.writer_id = writer_id or new_writer_id()
        self.source = source
        self._lock = Flock(self.root / "_writers" / f"{self.writer_id}.lock", blocking=False)
        self._mutex = threading.Lock()
        self._flush_mutex = threading.Lock()
        self._rows: dict[str, list[dict]] = {name: [] for name in TABLES}
        self._seen: OrderedDict[str, tuple[set[str], set[str], SessionThreads]] = OrderedDict()
        self._sessions: dict[str, int] = {}  # session -> rank of the evidence its last row was written with
        self._inflight: dict[str, Callable[[bool], CallRecord]] = {}
        self._inflight_written = False
        self._file_seq = 0
        self._call_seq = 0
        self._closed = threading.Event()
        self.recovered = recover(self.root)
        self._thread: threading.Thread | None = None
        if flush_interval is not None:
            self._thread = threading.Thread(target=self._run, args=(flush_interval,),
                                            name=f"forgerl-writer-{self.writer_id}", daemon=True)
            self._thread.start()

    # producers ---------------------------------------------------------

    def next_seq(self) -> int:
        with self._mutex:
            self._call_seq += 1
            return self._call_seq

    def add_session(self, session_id: str, *, harness: str | None = None, user_agent: str | None = None,
                    labels: dict | None = None, harness_rank: int | None = None,
                    harness_evidence: str | None = None) -> None:
        """A session row the first time it is seen, and again when more specific evidence names its harness
        (`harness_rank`, see `tables.COLUMN_DOCS`): a harness's first request may be a bare probe."""
        rank = harness_rank if harness_rank is not None else (0 if harness in (None, "unknown") else 2)
        with self._mutex:
            known = self._sessions.get(session_id)
            if known is not None and rank <= known:
                return  # already written, and this call tells us nothing new about the harness
            self._sessions[session_id] = rank
            self._rows["sessions"].append({
                "session_id": session_id, "first_seen": datetime.now(timezone.utc), "harness": harness,
                "user_agent": user_agent, "source": self.source,
                "labels": json.dumps(labels) if labels else None, "writer_id": self.writer_id,
                "harness_rank": rank, "harness_evidence": harness_evidence})

    def add_outcome(self, row: dict) -> None:
        """A graded rollout (see `tables.OUTCOMES`); columns left out are null."""
        unknown = set(row) - set(TABLES["outcomes"].names)
        if unknown:
            raise ValueError(f"unknown outcome columns: {sorted(unknown)}")
        with self._mutex:
            self._rows["outcomes"].append({**row, "writer_id": self.writer_id})

    def add_call(self, record: CallRecord) -> None:
        """A finished call: its rows, placed in its session's threads (`schema/segments.py`)."""
        record.writer_id = self.writer_id
        with self._mutex:
            parts, blobs_seen, threads = self._seen_for(record.session_id)
            call, messages, blobs = call_rows(record, parts, blobs_seen)
            call.update(place_call(threads, call, record))
            self._rows["calls"].append(call)
            self._rows["messages"].extend(messages)
            self._rows["blobs"].extend(blobs)
            self._inflight.pop(record.call_id, None)

    def track(self, call_id: str, snapshot: Callable[[bool], CallRecord]) -> None:
        """Register an unfinished call.

        `snapshot(False)` is taken on every flush that snapshots and must be cheap and
        thread-safe; `snapshot(True)`, taken once at close, may do full work.
        """
        with self._mutex:
            self._inflight[call_id] = snapshot

    def untrack(self, call_id: str) -> None:
        with self._mutex:
            self._inflight.pop(call_id, None)

    def _seen_for(self, session_id: str) -> tuple[set[str], set[str], SessionThreads]:
        seen = self._seen.get(session_id)
        if seen is None:
            seen = self._seen[session_id] = session_history(self.root, session_id)
            if len(self._seen) > _SESSION_CACHE:
                self._seen.popitem(last=False)  # read back from the dataset if the session resumes
        else:
            self._seen.move_to_end(session_id)
        return seen

    # flushing ----------------------------------------------------------

    def _run(self, interval: float) -> None:
        while not self._closed.wait(interval):
            try:
                self.flush()
            except Exception as e:  # keep flushing: a full disk may clear
                print(f"forgerl: flush failed: {e}", flush=True)

    def flush(self) -> None:
        """Write the rows held as new files, and rewrite the snapshot of unfinished calls."""
        with self._flush_mutex:
            with self._mutex:
                rows = {name: batch for name, batch in self._rows.items() if batch}
                self._rows = {name: [] for name in TABLES}
                snapshots = list(self._inflight.values())
            # Parts and blobs land before the calls that reference them.
            for name in ("sessions", "blobs", "messages", "calls", "outcomes"):
                if name in rows:
                    self._file_seq += 1
                    table = pa.Table.from_pylist(rows[name], schema=TABLES[name])
                    atomic_write_table(self.root / name / f"{self.writer_id}-{self._file_seq:08d}.parquet",
                                       table, name)
            self._write_inflight(snapshots)

    def _write_inflight(self, snapshots: list[Callable[[bool], CallRecord]]) -> None:
        path = self.root / "_inflight" / f"{self.writer_id}.parquet"
        if not snapshots:
            if self._inflight_written:
                path.unlink(missing_ok=True)
                self._inflight_written = False
            return
        rows = []
        for snapshot in snapshots:
            try:
                record = snapshot(False)
            except Exception:  # a call finishing concurrently; the next flush has it
                continue
            record.writer_id = self.writer_id
            rows.append(call_rows(record, set(), set())[0])
        atomic_write_table(path, pa.Table.from_pylist(rows, schema=TABLES["calls"]), "calls")
        self._inflight_written = True

    def close(self) -> None:
        """Flush everything; calls still in flight stay recoverable as incomplete."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
        with self._mutex:
            snapshots = list(self._inflight.values())
            self._inflight.clear()
        for snapshot in snapshots:
            record = snapshot(True)
            record.complete = False
            record.error = record.error or "recorder stopped before the call finished"
            self.add_call(record)
        self.flush()
        self._lock.release()
        (self.root / "_writers" / f"{self.writer_id}.lock").unlink(missing_ok=True)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def place_call(threads: SessionThreads, row: dict, record: CallRecord) -> dict:
    """The segment columns and `tools_absent` of a `calls` row, from the record's own messages."""
    ex = record.exchange
    if ex is None:
        return dict(NO_PLACE)
    by_form = dict(zip(call_forms(row, "input"), ex.input))
    by_form.update(zip(call_forms(row, "output"), ex.output))
    placement = threads.place(row, by_form.__getitem__)
    return {**(placement.columns() if placement else NO_PLACE),
            "tools_absent": tools_absent(row.get("tools"), (p.type for m in (*ex.input, *ex.output) for p in m.parts))}


def recover(root: Path) -> int:
    """Turn dead writers' in-flight snapshots into incomplete call rows; return how many."""
    recovered = 0
    for snap in sorted((root / "_inflight").glob("*.parquet")):
        writer_id = snap.stem
        lock_path = root / "_writers" / f"{writer_id}.lock"
        try:
            lock = Flock(lock_path, blocking=False)
        except BlockingIOError:
            continue  # that writer is alive
        try:
            if not snap.exists():
                continue
            table = pq.read_table(snap)
            written = _call_ids(root, prefix=f"{writer_id}-")
            keep = [cid not in written for cid in table.column("call_id").to_pylist()]
            table = table.filter(pa.array(keep, pa.bool_()))
            if table.num_rows:
                n = table.num_rows
                errors = [e or "recorder stopped before the call finished"
                          for e in table.column("error").to_pylist()]
                table = table.set_column(table.schema.get_field_index("error"), "error", pa.array(errors, pa.string()))
                table = table.set_column(table.schema.get_field_index("complete"), "complete",
                                         pa.array([False] * n, pa.bool_()))
                atomic_write_table(root / "calls" / f"{writer_id}-recovered.parquet", table, "calls")
                recovered += n
            snap.unlink()
        finally:
            lock.release()
            lock_path.unlink(missing_ok=True)
    return recovered


def _call_ids(root: Path, prefix: str = "") -> set[str]:
    ids: set[str] = set()
    for path in data_files(root, "calls"):
        if Path(path).name.startswith(prefix):
            ids.update(pq.read_table(path, columns=["call_id"]).column("call_id").to_pylist())
    return ids


def read_table(root: str | os.PathLike, table: str, columns: Sequence[str] | None = None) -> pa.Table:
    """One table at the current schema (the dataset upgraded first); `sessions` one row per session."""
    root = Path(root)
    open_dataset(root)
    for _attempt in range(5):
        try:
            result = read_files(table, map(Path, data_files(root, table)))
            break
        except FileNotFoundError:
            time.sleep(0.05)  # a compaction removed a file between listing and reading
    else:
        raise DatasetError(f"{root}: files keep vanishing while reading {table}")
    if table == "sessions":
        result = one_row_per_session(result)
    return result.select(list(columns)) if columns else result


# ---------------------------------------------------------------- maintenance


def compact(root: str | os.PathLike, *, target_bytes: int = 256 * 1024 * 1024) -> dict[str, int]:
    """Merge each table's small files into large ones; return files replaced per table.

    Duplicate rows (a part or blob rewritten after a writer restart, a call
    recovered twice) are dropped on the way, and a session's rows become the
    one row readers see (`SESSION_ROW_SQL`). The swap is atomic for readers
    that use `data_files`: the journal that names the sources is in place
    before the merged file appears.
    """
    root = Path(root)
    open_dataset(root)
    lock = maintenance_lock(root)
    try:
        _collect_journals(root)
        replaced = {}
        for table in TABLES:
            small = [Path(p) for p in data_files(root, table) if os.path.getsize(p) < target_bytes]
            if len(small) < 2:
                continue
            merged = _dedupe(table, read_files(table, small))
            compact_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
            target = f"compact-{compact_id}.parquet"
            atomic_write_bytes(root / "_compaction" / f"{compact_id}.json", json.dumps(
                {"table": table, "target": target, "sources": [p.name for p in small],
                 "created": time.time()}).encode())
            atomic_write_table(root / table / target, merged, table)
            for p in small:
                p.unlink()
            replaced[table] = len(small)
        return replaced
    finally:
        lock.release()


_KEYS = {"calls": ("call_id",), "messages": ("session_id", "part_hash"),
         "blobs": ("session_id", "blob_hash"), "outcomes": ("session_id", "task_id", "attempt")}


def _dedupe(table: str, data: pa.Table) -> pa.Table:
    if table == "sessions":
        return one_row_per_session(data)
    keys = _KEYS[table]
    seen: set[tuple] = set()
    keep = []
    for key in zip(*(data.column(k).to_pylist() for k in keys)):
        keep.append(key not in seen)
        seen.add(key)
    return data.filter(pa.array(keep, pa.bool_())) if not all(keep) else data


def _collect_journals(root: Path, max_age_s: float = 3600) -> None:
    """Drop journals whose sources are long gone: no reader can still hold that listing."""
    for journal in (root / "_compaction").glob("*.json"):
        entry = json.loads(journal.read_text())
        sources_left = any((root / entry["table"] / s).exists() for s in entry["sources"])
        if not sources_left and time.time() - entry["created"] > max_age_s:
            journal.unlink()


def delete_session(root: str | os.PathLike, session_id: str) -> dict[str, int]:
    """Remove every row of a session, rewriting only the files that hold it.

    Returns rows removed per table. Live writers' in-flight snapshots are left
    alone; run again after the recorder stops if the session was still open.
    """
    root = Path(root)
    open_dataset(root)
    lock = maintenance_lock(root)
    removed = {name: 0 for name in TABLES}
    try:
        for table in TABLES:
            for path in map(Path, data_files(root, table)):
                ids = pq.read_table(path, columns=["session_id"]).column("session_id")
                hits = pc.equal(ids, session_id).fill_null(False)
                n = pc.sum(hits).as_py() or 0
                if not n:
                    continue
                removed[table] += n
                data = pq.read_table(path)
                rest = data.filter(pc.invert(hits))
                if rest.num_rows:
                    atomic_write_table(path, rest, table, file_version(path))
                else:
                    path.unlink()
                    fsync_dir(path.parent)
        return removed
    finally:
        lock.release()
