"""m003_tools_absent (v2 -> v3): every call says whether it holds tool calls or results while its request defined
no tools, from the stored tools and the part types its refs point at.

Frozen: `tools_absent` below is a copy of `schema/segments.py`'s as of v3 (the tool digest is m002's frozen one),
so a change to the live rule cannot change what upgrading an old dataset produces.
"""

from __future__ import annotations

from collections.abc import Iterable

import duckdb
import pyarrow as pa

from ..conform import conform, open_parquet, read_files
from ..files import atomic_write_table, data_files
from ..tables import TABLES
from .m002_segments_and_harness_rank import tools_key

TOOL_PARTS = frozenset({"tool_call", "tool_result"})


def tools_absent(tools_json: str | None, part_types: Iterable[str]) -> bool:
    """Tool calls or results among a call's parts while its request defined no tools."""
    return tools_key(tools_json) == tools_key(None) and any(t in TOOL_PARTS for t in part_types)


def _tool_parts(root: str) -> dict[tuple[str, str], str]:
    """(session id, part hash) -> part type of every stored tool call or tool result part."""
    parts = data_files(root, "messages")
    if not parts:
        return {}
    kinds = ", ".join(f"'{t}'" for t in sorted(TOOL_PARTS))
    con = duckdb.connect()
    con.register("parts", read_files("messages", parts).select(["session_id", "part_hash", "part_type"]))
    rows = con.sql(f"SELECT DISTINCT session_id, part_hash, part_type FROM parts WHERE part_type IN ({kinds})").fetchall()
    return {(sid, digest): kind for sid, digest, kind in rows}


def apply(root: str) -> None:
    tool_parts = _tool_parts(root)
    for path in data_files(root, "calls"):
        with open_parquet(path) as parquet:
            table = conform(parquet.read(), TABLES["calls"])
        columns = table.select(["session_id", "tools", "input_refs", "output_refs"]).to_pylist()
        flags = [None if row["input_refs"] is None else tools_absent(
            row["tools"], (tool_parts.get((row["session_id"], h), "") for h in
                           [*row["input_refs"], *(row["output_refs"] or [])])) for row in columns]
        table = table.set_column(table.schema.get_field_index("tools_absent"), "tools_absent",
                                 pa.array(flags, pa.bool_()))
        atomic_write_table(path, table, "calls", 3)
