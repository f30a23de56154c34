"""Opening a dataset root (creating it, upgrading an older one once) and reading its tables as readers see them.

The rest of the store, one job a module: `files.py` (layout, manifest, listing), `storage.py` (the filesystem
seam), `coordination.py` (leases and publishing), `conform.py` (old files as the current schema), `writer.py`
(the append-only writer), `recovery.py` (what dead writers left in flight), `maintenance.py` (compaction and
deletion), `migrations/` (upgrades).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from typing import Sequence

import duckdb
import pyarrow as pa

from .conform import read_files
from .files import FORMAT, MANIFEST, DatasetError, data_files, read_manifest
from .migrations import upgrade
from .storage import locate
from .tables import SCHEMA_VERSION, TABLES

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


def init_root(root: str | os.PathLike) -> dict:
    """Create the dataset root and its manifest if absent; return the manifest."""
    storage, where = locate(root)
    try:
        for sub in (*TABLES, "_inflight", "_writers", "_compaction"):
            storage.make_folder(f"{where}/{sub}")
    except (FileExistsError, NotADirectoryError, PermissionError, FileNotFoundError) as e:
        raise DatasetError(f"{root}: cannot hold a dataset: {e}") from None
    manifest = {"format": FORMAT, "schema_version": SCHEMA_VERSION,
                "created_at": datetime.now(timezone.utc).isoformat(), "tables": list(TABLES)}
    if not storage.exists(f"{where}/{MANIFEST}"):
        storage.coordinator(where).publish_new(f"{where}/{MANIFEST}", (json.dumps(manifest, indent=2) + "\n").encode())
    return open_dataset(root)


def open_dataset(root: str | os.PathLike) -> dict:
    """The manifest of a dataset at the current schema version: every reader and writer opens through
    here, so an older dataset is upgraded in place once (`migrations.upgrade`) before anything reads it."""
    manifest = read_manifest(root)
    if manifest["schema_version"] < SCHEMA_VERSION:
        manifest = upgrade(root)
    return manifest


def read_table(root: str | os.PathLike, table: str, columns: Sequence[str] | None = None) -> pa.Table:
    """One table at the current schema (the dataset upgraded first); `sessions` one row per session."""
    open_dataset(root)
    for _attempt in range(5):
        try:
            result = read_files(table, data_files(root, table))
            break
        except FileNotFoundError:
            time.sleep(0.05)  # a compaction removed a file between listing and reading
    else:
        raise DatasetError(f"{root}: files keep vanishing while reading {table}")
    if table == "sessions":
        result = one_row_per_session(result)
    return result.select(list(columns)) if columns else result
