"""Reading table files of any schema version this forgerl knows as the current schema.

Files an older forgerl wrote stay as they are until a migration rewrites them, and a file written before a column
existed reads that column as nulls; a file newer than this forgerl is refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from .files import VERSION_KEY, SchemaVersionError
from .storage import locate
from .tables import SCHEMA_VERSION, TABLES


def schema_version(schema: pa.Schema) -> int:
    """The schema version a file's Arrow schema carries (1: written before versions were)."""
    return int((schema.metadata or {}).get(VERSION_KEY, b"1"))


def open_parquet(path: str | os.PathLike) -> pq.ParquetFile:
    """A table file, opened through the filesystem seam; FileNotFoundError if it is gone."""
    storage, where = locate(path)
    return pq.ParquetFile(storage.native(where), filesystem=storage.fs)


def file_version(path: str | os.PathLike) -> int:
    with open_parquet(path) as parquet:
        return schema_version(parquet.schema_arrow)


def read_files(table: str, paths: Iterable[str | os.PathLike]) -> pa.Table:
    """These files of one table as the current schema (a column a file lacks reads as nulls)."""
    schema = TABLES[table]
    parts = []
    for path in paths:
        with open_parquet(path) as pf:
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
