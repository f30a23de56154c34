"""The one way to open a dataset in DuckDB: a view per table over its consistent file set.

Views read the files listed by `files.data_files` (never a compacted file and
its sources both), so a query sees whole files even mid-compaction. Tables
with no files yet are empty tables of the right schema, so queries over a
fresh dataset work rather than fail; they are real tables so every cursor of
the connection sees them. Data files are written once and never changed, so
Parquet footers are cached: views over views re-read no footer. The dataset
is opened through `store.open_dataset`, so an older one is upgraded first,
and `sessions` shows one row per session (`store.SESSION_ROW_SQL`).

DuckDB reads local files itself. It cannot read S3 here (its httpfs extension is downloaded on first use, and this
DuckDB's is not on PyPI), so a table on S3 is a pyarrow dataset over the same file list, read through the
store's filesystem seam: DuckDB scans it lazily, with projections and filters pushed down to pyarrow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from .files import data_files
from .storage import LocalStorage, Storage, locate
from .store import SESSION_ROW_SQL, open_dataset
from .tables import TABLES


def connect(root: str | os.PathLike, *, threads: int | None = None,
            config: dict[str, object] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per dataset table (`DatasetError` if not a dataset).

    `config` holds DuckDB settings (e.g. `memory_limit`, `preserve_insertion_order`) for callers
    that stream; `threads` caps the worker threads.
    """
    root = Path(root)
    open_dataset(root)
    con = duckdb.connect(config={**(config or {}), **({"threads": threads} if threads else {})})
    con.execute("SET parquet_metadata_cache = true")
    storage = locate(root)[0]
    for table, schema in TABLES.items():
        files = data_files(root, table)
        if files and table == "sessions":
            con.execute(f"CREATE VIEW session_rows AS SELECT * FROM {_scan(con, storage, table, files)}")
            con.execute(f"CREATE VIEW sessions AS {SESSION_ROW_SQL}")
        elif files:
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM {_scan(con, storage, table, files)}")
        else:
            create_table(con, table, schema)
    return con


def _scan(con: duckdb.DuckDBPyConnection, storage: Storage, table: str, files: list[str]) -> str:
    """What a view of `table` selects from: DuckDB's own Parquet reader on local disk, else a pyarrow dataset
    over the seam, registered on `con`."""
    if isinstance(storage, LocalStorage):
        return f"read_parquet({files!r}, union_by_name=true)"
    import pyarrow.dataset as pads  # here, not at the top: it imports pandas, a quarter second of every CLI start

    name = f"{table}_files"
    con.register(name, pads.dataset([storage.native(f) for f in files], schema=TABLES[table],
                                    filesystem=storage.fs, format="parquet"))
    return name


def create_table(con: duckdb.DuckDBPyConnection, name: str, schema: pa.Schema,
                 rows: Iterable[Sequence[object]] = ()) -> None:
    """A DuckDB table of `schema` holding `rows` (an empty dataset table, a small lookup table): DDL and one
    INSERT. Not an Arrow table registered (or even built: `pa.table` and `Schema.empty_table` import pandas),
    which would cost every CLI start a quarter second or more."""
    columns = ", ".join(f'"{f.name}" {_duck_type(f.type)}' for f in schema)
    con.execute(f"CREATE TABLE {name} ({columns})")
    rows = [tuple(r) for r in rows]
    if rows:
        row = "(" + ", ".join("?" * len(schema)) + ")"
        con.execute(f"INSERT INTO {name} VALUES {', '.join([row] * len(rows))}", [v for r in rows for v in r])


_DUCK_TYPES = {pa.string(): "VARCHAR", pa.binary(): "BLOB", pa.bool_(): "BOOLEAN", pa.int32(): "INTEGER",
               pa.int64(): "BIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE",
               pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ"}


def _duck_type(arrow: pa.DataType) -> str:
    """DuckDB's name for a table column's Arrow type (`create_table`'s DDL)."""
    if pa.types.is_list(arrow):
        return _duck_type(arrow.value_type) + "[]"
    return _DUCK_TYPES[arrow]
