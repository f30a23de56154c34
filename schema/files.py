"""A dataset root's files: layout, the manifest, writing a table file, and listing a table's files.

The layer the rest of the store builds on (the writer, recovery, migrations, the session index, compaction and
deletion), so it imports none of them. Bytes go through the filesystem seam (`storage.py`), and a file appears
whole or not at all through coordination (`coordination.py`)::

    ROOT/forgerl.json                 manifest (format, schema version)
    ROOT/<table>/<writer>-<n>.parquet appended files, never rewritten by writers
    ROOT/<table>/compact-<id>.parquet files merged by `compact`
    ROOT/_writers/<writer>.lock       held (flock) for as long as the writer lives (on S3: <writer>.lease)
    ROOT/_compaction/<id>.json        which files a compacted file replaces
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from forgerl.errors import UserError

from .coordination import Coordinator
from .storage import Storage, locate
from .tables import SCHEMA_VERSION, TABLES

MANIFEST = "forgerl.json"
FORMAT = "forgerl-dataset"
VERSION_KEY = b"forgerl.schema_version"
TABLE_KEY = b"forgerl.table"


class DatasetError(UserError):
    """A path that is not a usable forgerl dataset; the message says why."""


class SchemaVersionError(DatasetError):
    """A file or dataset is newer than this forgerl understands, or cannot be upgraded."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    storage, where = locate(path)
    _publisher(storage, where).publish(where, lambda f: f.write(data))


def _publisher(storage: Storage, path: str) -> Coordinator:
    """The coordination that publishes `path` (publishing takes no lease, so any folder serves as its root)."""
    return storage.coordinator(os.path.dirname(path))


_ROW_GROUP_BYTES = 32 << 20


def _row_group_rows(table: pa.Table) -> int:
    """Rows per row group: at most 64k, and about 32 MB of Arrow data. Readers decode a row group's
    columns a vector (up to 2048 rows) at a time, so a group of calls whose prompts hold 100k token ids
    each would need gigabytes at once; groups bounded in bytes keep every reader's memory bounded."""
    per_row = table.nbytes / max(table.num_rows, 1)
    return max(1, min(64 * 1024, int(_ROW_GROUP_BYTES / max(per_row, 1.0))))


def atomic_write_table(path: str | os.PathLike, table: pa.Table, table_name: str,
                       version: int = SCHEMA_VERSION) -> None:
    """Write a Parquet file whole or not at all, stamped with its table and schema version."""
    meta = dict(table.schema.metadata or {})
    meta.update({VERSION_KEY: str(version).encode(), TABLE_KEY: table_name.encode()})
    table = table.replace_schema_metadata(meta)
    storage, where = locate(path)
    _publisher(storage, where).publish(
        where, lambda f: pq.write_table(table, f, compression="zstd", row_group_size=_row_group_rows(table)))


def write_manifest(root: str | os.PathLike, manifest: dict) -> None:
    atomic_write_bytes(Path(root) / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())


def read_manifest(root: str | os.PathLike) -> dict:
    storage, where = locate(root)
    path = f"{where}/{MANIFEST}"
    if not storage.is_folder(where):
        raise DatasetError(f"{root}: no such directory")
    if not storage.exists(path):
        raise DatasetError(f"{root}: not a forgerl dataset (no {MANIFEST})")
    try:
        manifest = json.loads(storage.read_bytes(path))
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: unreadable manifest: {e}") from None
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("schema_version"), int):
        raise DatasetError(f"{path}: not a forgerl manifest")
    if manifest["schema_version"] > SCHEMA_VERSION:
        raise SchemaVersionError(f"{root}: schema version {manifest['schema_version']} is newer than "
                                 f"this forgerl ({SCHEMA_VERSION}); upgrade forgerl")
    return manifest


def data_files(root: str | os.PathLike, table: str) -> list[str]:
    """The table's files as one consistent set: never a compacted file and its sources both.

    Use this list with any Parquet reader (datasets, duckdb, polars); a bare
    glob may see duplicates for the instant a compaction swaps files.
    """
    folder, names = data_file_names(root, table)
    return [f"{folder}{os.sep}{n}" for n in sorted(names)]  # not os.path.join: 4 times the time


def data_file_names(root: str | os.PathLike, table: str) -> tuple[str, set[str]]:
    """The table's folder and the names of the files `data_files` lists, unsorted (for an index that only
    needs to know what came and went). A runner lists a table a few times a rollout, and a dataset gains a
    file per table every flush: the storage lists names only (`storage.LocalStorage.names`)."""
    if table not in TABLES:
        raise DatasetError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    storage, where = locate(root)
    folder = os.path.join(where, table)
    names = set(storage.names(folder, ".parquet"))
    superseded: set[str] = set()
    journals = os.path.join(where, "_compaction")
    for journal in storage.names(journals, ".json"):
        try:
            entry = json.loads(storage.read_bytes(f"{journals}/{journal}"))
        except (OSError, json.JSONDecodeError):
            continue  # being written: its target is not in place yet
        if entry["table"] == table and entry["target"] in names:
            superseded.update(entry["sources"])
    return folder, names - superseded
