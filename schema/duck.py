"""The one way to open a dataset in DuckDB: a view per table over its consistent file set.

Views read the files listed by `store.data_files` (never a compacted file and
its sources both), so a query sees whole files even mid-compaction. Tables
with no files yet are empty views of the right Arrow schema, so queries over a
fresh dataset work rather than fail; they are real tables so every cursor of
the connection sees them. Data files are written once and never changed, so
Parquet footers are cached: views over views re-read no footer. Schema version 1 has no migrations; when
one is added, this is where files older than `SCHEMA_VERSION` get converted.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from .store import data_files, read_manifest
from .tables import TABLES


def connect(root: str | os.PathLike, *, threads: int | None = None,
            config: dict[str, object] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per dataset table (`DatasetError` if not a dataset).

    `config` holds DuckDB settings (e.g. `memory_limit`, `preserve_insertion_order`) for callers
    that stream; `threads` caps the worker threads.
    """
    root = Path(root)
    read_manifest(root)
    con = duckdb.connect(config={**(config or {}), **({"threads": threads} if threads else {})})
    con.execute("SET parquet_metadata_cache = true")
    for table, schema in TABLES.items():
        files = data_files(root, table)
        if files:
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({files!r}, union_by_name=true)")
        else:
            con.register(f"_empty_{table}", schema.empty_table())
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM _empty_{table}")
            con.unregister(f"_empty_{table}")
    return con
