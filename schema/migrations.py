"""Ordered, named migrations that bring a table read from an older file up to date.

Every Parquet file records the schema version it was written with. Readers
apply, in order, each migration whose `from_version` is at or above the
file's version and below the target, then conform the result to the current
Arrow schema (missing nullable columns become nulls, extra ones are dropped).
A new schema version adds an entry here; old files are never rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import pyarrow as pa


@dataclass(frozen=True)
class Migration:
    name: str
    table: str
    from_version: int
    apply: Callable[[pa.Table], pa.Table]


# Version 1 is the first released schema: nothing to migrate from yet.
MIGRATIONS: tuple[Migration, ...] = ()


class SchemaVersionError(ValueError):
    """A file or dataset is newer than this forgerl understands."""


def migrate(table_name: str, table: pa.Table, version: int, target: int, schema: pa.Schema,
            migrations: Sequence[Migration] = MIGRATIONS) -> pa.Table:
    if version > target:
        raise SchemaVersionError(
            f"{table_name}: file has schema version {version}, this forgerl reads up to {target}; upgrade forgerl")
    for migration in sorted(migrations, key=lambda m: m.from_version):
        if migration.table == table_name and version <= migration.from_version < target:
            table = migration.apply(table)
    return conform(table, schema)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Columns in schema order, with nulls for missing ones and types cast."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)
