"""m004_malformed_tool_calls (v3 -> v4): calls get `malformed_tool_calls`, which serve mode records from then on;
for calls recorded before it the count was never kept, so it is null (the files are rewritten at v4 as they are)."""

from __future__ import annotations

from ..conform import conform, open_parquet
from ..files import atomic_write_table, data_files
from ..tables import TABLES


def apply(root: str) -> None:
    for path in data_files(root, "calls"):
        with open_parquet(path) as parquet:
            table = conform(parquet.read(), TABLES["calls"])
        atomic_write_table(path, table, "calls", 4)
