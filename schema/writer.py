"""The append-only writer: buffers a recorder's rows and flushes them as new files of the dataset.

    ROOT/<table>/<writer>-<n>.parquet  a flush's rows of one table
    ROOT/_inflight/<writer>.parquet    snapshot of the writer's unfinished calls

Writers need no shared lock: file names carry the writer id. A writer
flushes at least every `flush_interval` seconds, and on start recovers the
in-flight snapshots of writers that died (`recovery.py`), so `kill -9` loses
at most the last interval. It holds its writer lease (`coordination.py`) for
as long as it lives.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from collections import OrderedDict
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pyarrow as pa

from .files import atomic_write_table
from .recovery import recover
from .records import CallRecord, call_forms, call_rows
from .segments import NO_PLACE, SessionThreads, tools_absent
from .sessions import session_history
from .storage import locate
from .store import init_root
from .tables import TABLES

_SESSION_CACHE = 10_000


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
        init_root(root)
        self._storage, where = locate(root)
        self.root = Path(where)
        self.writer_id = writer_id or new_writer_id()
        self.source = source
        self._lease = self._storage.coordinator(where).hold_writer(self.writer_id)
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

    def add_call(self, record: CallRecord) -> dict:
        """A finished call: its rows, placed in its session's threads (`schema/segments.py`); returns its
        `calls` row (the live OTLP export builds its spans from it)."""
        record.writer_id = self.writer_id
        with self._mutex:
            parts, blobs_seen, threads = self._seen_for(record.session_id)
            call, messages, blobs = call_rows(record, parts, blobs_seen)
            call.update(place_call(threads, call, record))
            self._rows["calls"].append(call)
            self._rows["messages"].extend(messages)
            self._rows["blobs"].extend(blobs)
            self._inflight.pop(record.call_id, None)
        return call

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
                self._storage.delete(str(path))
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
        self._lease.release()

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
