"""A dataset root's files: layout, atomic writes, the manifest, locks, and listing and reading table files.

The layer every other part of the store builds on (the writer, recovery, migrations, the session index,
compaction and deletion), so it imports none of them::

    ROOT/forgerl.json                 manifest (format, schema version)
    ROOT/<table>/<writer>-<n>.parquet appended files, never rewritten by writers
    ROOT/<table>/compact-<id>.parquet files merged by `compact`
    ROOT/_writers/<writer>.lock       held (flock) for as long as the writer lives
    ROOT/_compaction/<id>.json        which files a compacted file replaces

Every file appears by rename after fsync, so a reader sees whole files or none.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from forgerl.errors import UserError

from .tables import SCHEMA_VERSION, TABLES

MANIFEST = "forgerl.json"
FORMAT = "forgerl-dataset"
VERSION_KEY = b"forgerl.schema_version"
TABLE_KEY = b"forgerl.table"


class DatasetError(UserError):
    """A path that is not a usable forgerl dataset; the message says why."""


class SchemaVersionError(DatasetError):
    """A file or dataset is newer than this forgerl understands, or cannot be upgraded."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


_ROW_GROUP_BYTES = 32 << 20


def _row_group_rows(table: pa.Table) -> int:
    """Rows per row group: at most 64k, and about 32 MB of Arrow data. Readers decode a row group's
    columns a vector (up to 2048 rows) at a time, so a group of calls whose prompts hold 100k token ids
    each would need gigabytes at once; groups bounded in bytes keep every reader's memory bounded."""
    per_row = table.nbytes / max(table.num_rows, 1)
    return max(1, min(64 * 1024, int(_ROW_GROUP_BYTES / max(per_row, 1.0))))


def atomic_write_table(path: Path, table: pa.Table, table_name: str, version: int = SCHEMA_VERSION) -> None:
    """Write a Parquet file under a temp name, fsync, rename into place."""
    meta = dict(table.schema.metadata or {})
    meta.update({VERSION_KEY: str(version).encode(), TABLE_KEY: table_name.encode()})
    table = table.replace_schema_metadata(meta)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        pq.write_table(table, f, compression="zstd", row_group_size=_row_group_rows(table))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def file_version(path: Path) -> int:
    return schema_version(pq.read_schema(path))


def schema_version(schema: pa.Schema) -> int:
    """The schema version a file's Arrow schema carries (1: written before versions were)."""
    return int((schema.metadata or {}).get(VERSION_KEY, b"1"))


def write_manifest(root: Path, manifest: dict) -> None:
    atomic_write_bytes(root / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())


def read_manifest(root: Path) -> dict:
    path = Path(root) / MANIFEST
    if not Path(root).is_dir():
        raise DatasetError(f"{root}: no such directory")
    if not path.is_file():
        raise DatasetError(f"{root}: not a forgerl dataset (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: unreadable manifest: {e}") from None
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("schema_version"), int):
        raise DatasetError(f"{path}: not a forgerl manifest")
    if manifest["schema_version"] > SCHEMA_VERSION:
        raise SchemaVersionError(f"{root}: schema version {manifest['schema_version']} is newer than "
                                 f"this forgerl ({SCHEMA_VERSION}); upgrade forgerl")
    return manifest


class Flock:
    """An exclusive flock on a file; held until released or the process dies."""

    def __init__(self, path: Path, blocking: bool = True):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(self.fd)
            raise

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def maintenance_lock(root: Path) -> Flock:
    (root / "_writers").mkdir(exist_ok=True)  # a copied dataset may lack empty folders
    return Flock(root / "_writers" / "maintenance.lock")


def live_writers(root: Path) -> list[str]:
    """Ids of writers whose lock is held: processes still writing into the dataset."""
    live = []
    for path in (root / "_writers").glob("*.lock"):
        if path.name == "maintenance.lock":
            continue
        try:
            Flock(path, blocking=False).release()
        except BlockingIOError:
            live.append(path.stem)
        except FileNotFoundError:
            pass
    return live


def data_files(root: str | os.PathLike, table: str) -> list[str]:
    """The table's files as one consistent set: never a compacted file and its sources both.

    Use this list with any Parquet reader (datasets, duckdb, polars); a bare
    glob may see duplicates for the instant a compaction swaps files.
    """
    folder, names = data_file_names(root, table)
    return [f"{folder}{os.sep}{n}" for n in sorted(names)]  # not os.path.join: 4 times the time


def data_file_names(root: str | os.PathLike, table: str) -> tuple[str, set[str]]:
    """The table's folder and the names of the files `data_files` lists, unsorted (for an index that only
    needs to know what came and went)."""
    if table not in TABLES:
        raise DatasetError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    folder = os.path.join(root, table)
    names = set(_names(folder, ".parquet"))
    superseded: set[str] = set()
    for journal in _names(os.path.join(root, "_compaction"), ".json"):
        try:
            entry = json.loads(Path(root, "_compaction", journal).read_text())
        except (OSError, json.JSONDecodeError):
            continue  # being written: its target is not in place yet
        if entry["table"] == table and entry["target"] in names:
            superseded.update(entry["sources"])
    return folder, names - superseded


def _names(folder: str, suffix: str) -> list[str]:
    """The names in `folder` ending in `suffix` (none if it is missing). A runner lists a table a few times a
    rollout, and a dataset gains a file per table every flush: `os.listdir`, not `Path.glob`, which costs
    7 times as much (25 against 3.4 ms on a folder of 3,000)."""
    try:
        return [n for n in os.listdir(folder) if n.endswith(suffix) and not n.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return []


def read_files(table: str, paths: Iterable[Path]) -> pa.Table:
    """These files of one table as the current schema (a column a file lacks reads as nulls)."""
    schema = TABLES[table]
    parts = []
    for path in paths:
        pf = pq.ParquetFile(path)
        version = schema_version(pf.schema_arrow)
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(f"{path}: schema version {version} is newer than this forgerl "
                                     f"({SCHEMA_VERSION}); upgrade forgerl")
        parts.append(conform(pf.read(), schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Columns in schema order, with nulls for missing ones and types cast."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)
