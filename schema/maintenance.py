"""Maintenance of a dataset root: compaction (many small files into few, duplicates dropped) and deletion of a
session's rows. Both hold the maintenance lease (`coordination.py`), so they never run at once or during an
upgrade; writers and readers go on meanwhile.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from .conform import open_parquet, read_files, schema_version
from .files import atomic_write_bytes, atomic_write_table, data_files
from .storage import locate
from .store import one_row_per_session, open_dataset
from .tables import TABLES


def compact(root: str | os.PathLike, *, target_bytes: int = 256 * 1024 * 1024) -> dict[str, int]:
    """Merge each table's small files into large ones; return files replaced per table.

    Duplicate rows (a part or blob rewritten after a writer restart, a call
    recovered twice) are dropped on the way, and a session's rows become the
    one row readers see (`SESSION_ROW_SQL`). The swap is atomic for readers
    that use `data_files`: the journal that names the sources is in place
    before the merged file appears.
    """
    open_dataset(root)
    storage, where = locate(root)
    lease = storage.coordinator(where).maintenance()
    try:
        _collect_journals(where)
        replaced = {}
        for table in TABLES:
            small = [p for p in data_files(where, table) if storage.size(p) < target_bytes]
            if len(small) < 2:
                continue
            merged = _dedupe(table, read_files(table, small))
            compact_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
            target = f"compact-{compact_id}.parquet"
            atomic_write_bytes(f"{where}/_compaction/{compact_id}.json", json.dumps(
                {"table": table, "target": target, "sources": [os.path.basename(p) for p in small],
                 "created": time.time()}).encode())
            atomic_write_table(f"{where}/{table}/{target}", merged, table)
            for p in small:
                storage.delete(p)
            replaced[table] = len(small)
        return replaced
    finally:
        lease.release()


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


def _collect_journals(root: str, max_age_s: float = 3600) -> None:
    """Drop journals whose sources are long gone: no reader can still hold that listing."""
    storage = locate(root)[0]
    for name in storage.names(f"{root}/_compaction", ".json"):
        journal = f"{root}/_compaction/{name}"
        entry = json.loads(storage.read_bytes(journal))
        sources_left = any(storage.exists(f"{root}/{entry['table']}/{s}") for s in entry["sources"])
        if not sources_left and time.time() - entry["created"] > max_age_s:
            storage.delete(journal)


def delete_session(root: str | os.PathLike, session_id: str) -> dict[str, int]:
    """Remove every row of a session, rewriting only the files that hold it.

    Returns rows removed per table. Live writers' in-flight snapshots are left
    alone; run again after the recorder stops if the session was still open.
    """
    open_dataset(root)
    storage, where = locate(root)
    lease = storage.coordinator(where).maintenance()
    removed = {name: 0 for name in TABLES}
    try:
        for table in TABLES:
            for path in data_files(where, table):
                with open_parquet(path) as parquet:
                    version = schema_version(parquet.schema_arrow)
                    ids = parquet.read(["session_id"]).column("session_id")
                    hits = pc.equal(ids, session_id).fill_null(False)
                    n = pc.sum(hits).as_py() or 0
                    if not n:
                        continue
                    removed[table] += n
                    rest = parquet.read().filter(pc.invert(hits))
                if rest.num_rows:
                    atomic_write_table(path, rest, table, version)
                else:
                    storage.delete(path)
                    storage.sync_folder(os.path.dirname(path))
        return removed
    finally:
        lease.release()
