"""Analysis: DuckDB views and behaviour metrics over a dataset root.

`connect(DATASET)` is the entry point: the dataset's tables (through
`forgerl.schema.duck`) plus every derived view of `views.VIEWS`.
May import `forgerl.schema`; the runners and trainer build on it, not the reverse.
"""

from __future__ import annotations

import os

import duckdb

from forgerl.schema import duck

from .views import SHARED, VIEWS, register

__all__ = ["VIEWS", "connect"]


def connect(root: str | os.PathLike, *, threads: int | None = None,
            materialize: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view per dataset table and every behaviour view (`DatasetError` if not a dataset).

    `materialize` computes the views most others read (`views.SHARED`) once, up front: what a
    report over every metric wants, and wasted work for a single ad-hoc query.
    """
    return register(duck.connect(root, threads=threads), SHARED if materialize else ())
